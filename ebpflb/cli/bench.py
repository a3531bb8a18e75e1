"""`ebpflb bench`: the benchmarks live in the lab (lab/bench), a distribution of its own
that the agent's wheel and image do not carry. This verb hands its arguments to
lab.bench.command, imported only when the verb runs (no other command imports the lab),
and where the lab is not installed says how to install it."""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from ebpflb.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`ebpflb bench ...`: its arguments go to the lab's parser as they are (no option of
    ebpflb's own may take them: prefix_chars NUL)."""
    bench = sub.add_parser(
        "bench",
        help="ebpflb vs kube-proxy's modes (compare, the default), Maglev tables (maglev),"
        " the agent's control plane (sync), bulk TCP through a NodePort (bulk), packets/s"
        " through a NodePort (pps); needs the lab (lab/, installed by make setup)",
        add_help=False,
        prefix_chars="\0",
    )
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)


LAB_MISSING = (
    "`ebpflb bench` is in the lab distribution, which is not installed here (the agent's"
    " wheel and image do not carry it): from a checkout of the repository, "
    "`pip install -e lab/` (make setup installs it)"
)


def lab_command() -> ModuleType:
    """The lab's `ebpflb bench` (lab/bench/command.py), imported only when the verb runs."""
    try:
        return importlib.import_module("lab.bench.command")
    except ModuleNotFoundError as exc:
        if exc.name is not None and (exc.name == "lab" or exc.name.startswith("lab.")):
            raise ConfigError(LAB_MISSING) from None
        raise


def run(args: argparse.Namespace) -> int:
    return int(lab_command().run(args))


def parse(args: argparse.Namespace) -> argparse.Namespace:
    """The lab's reading of `ebpflb [--debug] bench ARGS...`."""
    bench: argparse.Namespace = lab_command().parse_args(args.bench_args)
    bench.command, bench.debug = args.command, args.debug
    return bench
