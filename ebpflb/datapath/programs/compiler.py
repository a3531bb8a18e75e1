"""The BCC compile, run in a short-lived child process:
`python -m ebpflb.datapath.programs.compiler`.

Importing bcc maps libbcc and LLVM (~100 MiB of shared libraries, which stay resident once
touched) into a process, and clang changes the process's working directory while it runs.
The agent therefore never imports bcc: on a cold start it runs this module as a child,
which compiles one program source (BCC creates and pins the maps it declares, as always)
and hands back each function's bytecode with the maps it uses (progcache.Entry, JSON on
stdout). The agent loads that bytecode with BPF_PROG_LOAD on the pinned maps; the child's
LLVM goes when it exits.

Request (JSON on stdin): {"source": PATH, "cflags": [...], "functions": [...],
"pin_dir": PATH}. Exit status 0 with the entry on stdout, else 1 with the reason on stderr.
This is the only module that imports bcc (tests/unit/repo/test_layering.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bcc import BPF

from ebpflb.datapath import contract
from ebpflb.datapath.programs import progcache
from ebpflb.datapath.programs.programset import assemble_source
from ebpflb.errors import BpfLoadError


def compile_program(source: Path, cflags: list[str]) -> BPF:
    """BCC's BPF object for one program source (maps created or opened and pinned)."""
    try:
        return BPF(text=assemble_source(source).encode(), cflags=cflags)
    except Exception as exc:  # BCC raises bare Exception; its message names the file
        raise BpfLoadError(f"compiling {source.name} failed: {exc}") from exc


def compile_entry(
    source: Path, cflags: list[str], functions: list[str], pin_dir: Path
) -> progcache.Entry:
    """Compile `source` and record the bytecode of `functions` with the pinned maps they
    use (and every other map of the contract pinned there: a load on new pins creates
    them all, as BCC does)."""
    bpf = compile_program(source, cflags)
    try:
        codes = {f: bpf.dump_func(f.encode()) for f in functions}
    except Exception as exc:
        raise BpfLoadError(f"{source.name}: {exc}") from exc
    entry = progcache.record(codes, pin_dir, also=[name.value for name in contract.MAPS])
    if entry is None:
        raise BpfLoadError(
            f"{source.name}: the compiled programs reference an object other than a map"
            f" pinned under {pin_dir}, which the loader cannot relocate"
        )
    return entry


def main() -> int:
    request = json.load(sys.stdin)
    try:
        entry = compile_entry(
            Path(request["source"]),
            list(request["cflags"]),
            list(request["functions"]),
            Path(request["pin_dir"]),
        )
    except BpfLoadError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    sys.stdout.write(entry.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
