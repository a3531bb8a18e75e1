"""python -m lab.kernels {run,table}: the kernel matrix's command line."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from lab.kernels import ci, debian, matrix

EXAMPLES = """\
examples:
  python -m lab.kernels run                          # 5.10 and 6.1, all kernel tests
  python -m lab.kernels run --kernels 6.1 tests/kernel/socketlb/test_socket_lb.py
  python -m lab.kernels run --ci                     # CI's selection of the files
  python -m lab.kernels table --readme README.md     # the README's kernel table
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.kernels",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXAMPLES,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="boot each kernel under qemu and run the kernel tests")
    run.add_argument(
        "--kernels",
        default=os.environ.get("KERNELS", "5.10 6.1"),
        help=f"kernel lines, space- or comma-separated (known: {', '.join(debian.LINES)})",
    )
    run.add_argument("tests", nargs="*", help="pytest selection (default: tests/kernel)")
    run.add_argument(
        "--ci",
        action="store_true",
        help="CI's selection: the files testing what differs between kernels, on every line "
        "(lab/kernels/ci.py)",
    )
    run.add_argument("--out", type=Path, default=matrix.DEFAULT_OUT)
    run.add_argument("--cache", type=Path, default=debian.DEFAULT_CACHE)
    run.add_argument("--jobs", type=int, default=2, help="kernels booted at once (default 2)")
    run.add_argument(
        "--vm-timeout",
        type=float,
        default=matrix.DEFAULT_VM_TIMEOUT / 60,
        help="minutes before a VM is killed (default %(default).0f)",
    )
    run.add_argument(
        "--refresh", action="store_true", help="look for a newer kernel than the cached one"
    )
    run.add_argument(
        "--probe",
        default=" ".join(matrix.FEATURE_PROBE),
        help="module and arguments run with `python -m` in the guest before the tests; its "
        "stdout is the kernel's feature report (JSON); empty: none (default: %(default)s)",
    )
    table = sub.add_parser("table", help="the README's kernel table from the matrix results")
    table.add_argument("--out", type=Path, default=matrix.DEFAULT_OUT)
    table.add_argument(
        "--readme", type=Path, help="rewrite the table between its markers in this file"
    )
    table.add_argument(
        "--host-junit",
        type=Path,
        help="also a column for this machine's own kernel, from its `make test` JUnit file",
    )
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.ci and args.tests:
            parser.error("--ci chooses the tests itself: give either --ci or tests")
        kernels = matrix.parse_kernels(args.kernels)
        per_line = {line: ci.selection_on(line) for line in kernels} if args.ci else {}
        return matrix.run(
            matrix.Options(
                kernels=kernels,
                selection=matrix.selection_or_default(args.tests),
                out=args.out,
                cache=args.cache,
                jobs=args.jobs,
                vm_timeout=args.vm_timeout * 60,
                refresh=args.refresh,
                probe=tuple(args.probe.split()),
                per_line=per_line,
            )
        )
    from lab.kernels import features

    return features.main(args.out, args.readme, args.host_junit)


if __name__ == "__main__":
    sys.exit(main())
