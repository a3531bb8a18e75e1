"""`ebpflb status`: what the agent says it is doing, or the pins when it does not answer
(ebpflb.observe.statusview)."""

from __future__ import annotations

import argparse
import json

from ebpflb.cli.common import DEFAULTS, add_config_arg, add_datapath_args


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = sub.add_parser(
        "status",
        help="what the agent is doing (its /status and /metrics); from the pins when it does"
        " not answer",
    )
    add_config_arg(status)
    add_datapath_args(status, cgroup=False)
    status.add_argument(
        "--metrics-bind-address",
        default=DEFAULTS.metrics_bind_address,
        metavar="HOST:PORT",
        help="where the agent serves /status and /metrics (default %(default)s)",
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument(
        "--timeout", type=float, default=2.0, metavar="S", help="seconds to wait for the agent"
    )


def run(args: argparse.Namespace) -> int:
    """Exit status 0 when the agent answers, 1 when it does not (the pins are shown)."""
    from ebpflb.observe import statusview

    document = statusview.gather(args.metrics_bind_address, args.bpffs, timeout=args.timeout)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(statusview.render_text(document))
    return 0 if document["agent"]["answering"] else 1
