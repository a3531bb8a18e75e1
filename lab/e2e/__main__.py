"""python -m lab.e2e table: docs/e2e.md's table from the runs' JUnit files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.e2e import table
from lab.kernels.matrix import DEFAULT_OUT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.e2e")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("table", help="the upstream e2e table from JUnit reports")
    cmd.add_argument("--doc", type=Path, help="rewrite the table between its markers here")
    cmd.add_argument(
        "--host-junit", type=Path, help="this machine's `make test` JUnit (.ci/out/junit.xml)"
    )
    cmd.add_argument(
        "--kernels-out",
        type=Path,
        default=DEFAULT_OUT,
        help="the kernel matrix's results, <line>/junit.xml (default %(default)s)",
    )
    args = parser.parse_args(argv)
    return table.main(args.doc, args.host_junit, args.kernels_out)


if __name__ == "__main__":
    sys.exit(main())
