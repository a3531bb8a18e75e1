"""Command line: argument parsing and dispatch only, one module per verb (run, cleanup,
maps, status, explain, bench; configfile.py reads --config); the work happens in the
modules each names."""

from __future__ import annotations

import argparse
import logging
import sys

from ebpflb import __version__
from ebpflb.cli import bench, cleanup, configfile, explain, maps, run, status
from ebpflb.cli.common import DEFAULTS, interfaces
from ebpflb.cli.run import node_name
from ebpflb.errors import ConfigError, EbpflbError
from ebpflb.host import privileges

__all__ = ["DEFAULTS", "build_parser", "main", "node_name", "parse_args"]

log = logging.getLogger("ebpflb")

VERBS = {
    "run": run,
    "cleanup": cleanup,
    "maps": maps,
    "status": status,
    "explain": explain,
    "bench": bench,
}

EXAMPLES = """\
examples:
  ebpflb run                                       # in a pod: the cluster's Services
  ebpflb run --kubeconfig ~/.kube/config           # ... from outside the cluster
  ebpflb run --manifests examples/                 # program the Services in examples/
  ebpflb status                                    # the agent's state (or the pins')
  ebpflb maps dump                                 # what the pinned maps hold
  ebpflb maps dump --json --tables                 # ... with every Maglev slot
  ebpflb maps dump --service default/web           # ... of one service only
  ebpflb explain 10.244.1.5 10.96.0.10:80/TCP      # what socket-LB does with that connect()
  ebpflb explain 203.0.113.7:41000 192.168.1.1:30080/TCP --ingress eth0   # ... a NodePort packet
  ebpflb explain [2001:db8::7]:41000 [2001:db8::1]:30080 --ingress eth0   # ... over IPv6
  ebpflb bench --quick --plot bench.png             # ebpflb vs kube-proxy, ~2 minutes
  ebpflb bench                                     # the full run (under 15 minutes)
  ebpflb bench compare --from-report report.json   # ... its tables again, from a saved run
  ebpflb bench maglev                              # balance, disruption, memory, speed
  ebpflb bench sync                                # the agent's start-up and updates in detail
  ebpflb run --config /etc/ebpflb/config.yaml      # options from a file (flags override it)
  ebpflb cleanup                                   # detach programs, remove pins
  ebpflb cleanup --kube-proxy                      # remove what kube-proxy left on this node
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ebpflb",
        description="eBPF Kubernetes service load balancer (kube-proxy replacement).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ebpflb {__version__}")
    parser.add_argument("--debug", action="store_true", help="debug logging and tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for verb in VERBS.values():
        verb.add_parser(sub)
    return parser


def _setup_logging(debug: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with a --config file's values as defaults flags override."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.command == "bench":
        return bench.parse(args)
    if getattr(args, "config", None) is not None:
        commands = _commands(parser)
        target = commands[args.command]
        target.set_defaults(
            **configfile.defaults(
                args.config,
                configfile.options(commands["run"]),
                configfile.options(target),
                list_types={interfaces},
            )
        )
        args = parser.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ConfigError as exc:
        print(f"ebpflb: {exc}", file=sys.stderr)
        return 2
    _setup_logging(args.debug)
    try:
        return int(VERBS[args.command].run(args))
    except EbpflbError as exc:
        if args.debug:
            log.exception("failed")
        print(f"ebpflb: {exc}", file=sys.stderr)
        hint = privileges.permission_hint(exc)
        if hint:
            print(f"ebpflb: {hint}", file=sys.stderr)
        return 1
    except PermissionError as exc:  # a syscall no ebpflb layer wrapped: still no traceback
        if args.debug:
            log.exception("failed")
        print(f"ebpflb: {exc}", file=sys.stderr)
        print(f"ebpflb: {privileges.permission_hint(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
