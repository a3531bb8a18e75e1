"""What several verbs' parsers share: --config, the pin directory and cgroup, and the
values of list and range options."""

from __future__ import annotations

import argparse
from pathlib import Path

from ebpflb.config import DEFAULT_BPFFS_DIR, Config

DEFAULTS = Config()


def add_config_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="YAML file mapping `ebpflb run` option names to values (e.g. `ct-max: 262144`);"
        " options given as flags override it",
    )


def add_datapath_args(parser: argparse.ArgumentParser, *, cgroup: bool = True) -> None:
    parser.add_argument(
        "--bpffs",
        type=Path,
        default=DEFAULT_BPFFS_DIR,
        metavar="DIR",
        help=f"bpffs directory holding the pinned maps (default {DEFAULT_BPFFS_DIR})",
    )
    if cgroup:
        parser.add_argument(
            "--cgroup",
            type=Path,
            metavar="DIR",
            help="cgroup v2 directory the socket programs attach to "
            "(default: the cgroup2 mount root, from /proc/mounts)",
        )


def interfaces(text: str) -> tuple[str, ...]:
    return tuple(name for name in text.split(",") if name)


def port_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    if not sep or not low.isdigit() or not high.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN-MAX")
    return int(low), int(high)
