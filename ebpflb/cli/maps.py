"""`ebpflb maps dump`: what the pinned maps hold (ebpflb.datapath.maps.dump)."""

from __future__ import annotations

import argparse
import json
import sys

from ebpflb.cli.common import add_datapath_args


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    maps = sub.add_parser("maps", help="inspect the pinned maps")
    maps_sub = maps.add_subparsers(dest="maps_command", required=True)
    dump = maps_sub.add_parser("dump", help="print frontends, backends and slot counts")
    add_datapath_args(dump, cgroup=False)
    dump.add_argument("--json", action="store_true", help="machine-readable output")
    dump.add_argument(
        "--flows",
        type=int,
        default=100,
        metavar="N",
        help="conntrack and NAT entries to show at most (0: none)",
    )
    dump.add_argument(
        "--tables",
        action="store_true",
        help="with --json: every Maglev slot's backend, in slot order",
    )
    dump.add_argument(
        "--service",
        metavar="NS/NAME",
        help="only this service's frontends (every port and address), and their backends,"
        " conntrack and NAT entries",
    )
    dump.add_argument(
        "--frontend",
        metavar="VIP:PORT/PROTO",
        help="only this frontend (e.g. 10.96.0.10:80/TCP) and its backends and flows",
    )


def run(args: argparse.Namespace) -> int:
    from ebpflb.datapath.maps import dump, pinlayout
    from ebpflb.datapath.maps.kernel import KernelMapSet

    select = dump.Selection.parse(args.service, args.frontend)
    verdict, found = pinlayout.check(args.bpffs)
    if verdict is pinlayout.Verdict.NEWER_REFUSED and found is not None:  # would misread them
        print(f"ebpflb maps dump: {pinlayout.refusal(args.bpffs, found)}", file=sys.stderr)
        return 1
    with KernelMapSet(args.bpffs) as maps:
        report = dump.collect(maps, tables=args.tables, flows=args.flows, select=select)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(dump.render_text(report))
    return 0
