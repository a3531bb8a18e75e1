"""The programs of one source file into the kernel, the cheapest way there is.

Programs are pinned next to the maps under prog-<hash>-<function>, the hash covering what
they were built from (the assembled source, the cflags but the pin directory, the kernel,
BCC's version: progcache.cache_key). A ProgramSet is, in order of preference:

1. adopted: the pinned programs of the wanted hash, if all are there and use the maps
   pinned now: nothing compiled, nothing loaded (they are attached already);
2. loaded: BCC's bytecode for that hash from the store (progcache.py), loaded with
   BPF_PROG_LOAD on the pinned maps;
3. compiled: BCC compiles in a short-lived child process (compiler.py) that hands the
   bytecode over, then as 2. This process never imports bcc: no LLVM in its memory.

The loader (loader.py) attaches the programs, detaches the ones they replace and only then
calls commit_pins(): the new programs pinned, other builds' pins removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib.resources
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ebpflb.datapath import contract
from ebpflb.datapath.maps import pins
from ebpflb.datapath.programs import headers, progcache
from ebpflb.datapath.syscall import bpfsys
from ebpflb.errors import BpfLoadError

log = logging.getLogger(__name__)

# The C sources are package data (ebpflb/bpf, see pyproject.toml): an installed agent compiles
# the sources it was installed with, wherever it runs from.
BPF_DIR = Path(str(importlib.resources.files("ebpflb") / "bpf")).resolve()
_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def assemble_source(main: Path) -> str:
    """Inline the local (quoted) includes of a program, with #line markers.

    BCC rewrites map accesses (map.lookup(...)) only in the main file, so the helpers in
    bpf/lib/*.h must become part of it; #line keeps compiler messages pointing at the real
    file and line.
    """
    seen: set[Path] = set()

    def expand(path: Path) -> Iterator[str]:
        yield f'#line 1 "{path.relative_to(BPF_DIR.parent)}"\n'
        for lineno, line in enumerate(path.read_text().splitlines(keepends=True), start=1):
            match = _LOCAL_INCLUDE.match(line)
            if not match:
                yield line
                continue
            header = (path.parent / match.group(1)).resolve()
            if header not in seen:
                seen.add(header)
                yield from expand(header)
            yield f'#line {lineno + 1} "{path.relative_to(BPF_DIR.parent)}"\n'

    return "".join(expand(main.resolve()))


def compile_in_child(
    source: Path, cflags: list[str], functions: Sequence[str], pin_dir: Path
) -> progcache.Entry:
    """BCC's bytecode for `functions` of `source`, compiled by a child process
    (compiler.py) so that LLVM never enters this one; the child creates and pins the maps
    the source declares, as BCC does."""
    request = {
        "source": str(source),
        "cflags": cflags,
        "functions": list(functions),
        "pin_dir": str(pin_dir),
    }
    tree = headers.HEADERS.get()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ebpflb.datapath.programs.compiler"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, **tree.compiler_env()},
        )
    except OSError as exc:
        raise BpfLoadError(f"cannot start the compiler for {source.name}: {exc}") from exc
    if done.returncode != 0:
        detail = "\n".join(done.stderr.strip().splitlines()[-40:])
        raise BpfLoadError(
            f"compiling {source.name} failed (kernel headers: {tree.describe()}): {detail}"
        )
    try:
        entry = progcache.Entry.from_json(done.stdout)
    except (ValueError, KeyError, TypeError) as exc:
        raise BpfLoadError(f"the compiler's answer for {source.name} is unreadable: {exc}") from exc
    return dataclasses.replace(entry, headers=tree.describe())


class Origin(enum.StrEnum):
    """Where a start got a program file's programs from (cheapest first)."""

    ADOPTED = "adopted"  # pinned by a previous agent with the same build hash
    LOADED = "loaded"  # bytecode from the store, loaded with BPF_PROG_LOAD
    COMPILED = "compiled"  # compiled in a child process, then loaded


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    prog_type: int
    attach_type: int = 0  # expected_attach_type (cgroup sock_addr programs)
    needs: str = ""  # what the kernel must have, for error messages


def program_pin(pin_dir: Path, key: str, function: str) -> Path:
    return pin_dir / f"prog-{key[:16]}-{function}"


def pinned_map_ids(pin_dir: Path) -> set[int]:
    """Kernel ids of the contract's maps pinned under `pin_dir` now."""
    ids = set()
    for name in contract.MAPS:
        try:
            fd = bpfsys.obj_get(str(pin_dir / name.value))
        except bpfsys.BpfError:
            continue
        try:
            ids.add(bpfsys.map_info(fd, name.value).id)
        finally:
            os.close(fd)
    return ids


class ProgramSet:
    """The programs of one source file, open in this process (fds), however they came:
    adopted from their pins, loaded from stored bytecode, or compiled in a child first."""

    def __init__(
        self, source: Path, cflags: list[str], functions: Sequence[Function], pin_dir: Path
    ) -> None:
        self.source = source
        self.pin_dir = pin_dir
        self.functions = tuple(functions)
        # The pin directory only tells BCC where the maps are: programs built for another
        # directory are the same programs.
        pin_flag = f"-D{contract.PIN_DIR.macro}="
        shape = [flag for flag in cflags if not flag.startswith(pin_flag)]
        names = [f.name for f in functions]
        self.key = progcache.cache_key(
            assemble_source(source), shape, names, progcache.bcc_version()
        )
        self.fds: dict[str, int] = {}
        # The header tree the programs were compiled with, as their stored entry recorded
        # it ("" when nothing stored says: adopted pins whose entry was never stored).
        self.headers = ""
        adopted = self._adopt()
        if adopted is not None:
            self.fds, self.origin = adopted, Origin.ADOPTED
            stored = self._stored_path()
            entry = progcache.load(stored) if stored is not None else None
            self.headers = entry.headers if entry is not None else ""
            return
        entry, self.origin = self._entry(cflags)
        self.headers = entry.headers
        self._load(entry)

    def _stored_path(self) -> Path | None:
        directory = progcache.cache_dir()
        return directory / f"{self.key}.json" if directory is not None else None

    def _adopt(self) -> dict[str, int] | None:
        """The pinned programs of this build hash, if all are there and use the maps pinned
        now (a map recreated since, e.g. for a new size, needs programs loaded again)."""
        fds: dict[str, int] = {}
        maps: set[int] | None = None
        try:
            for function in self.functions:
                try:
                    fd = bpfsys.obj_get(str(program_pin(self.pin_dir, self.key, function.name)))
                except bpfsys.BpfError:
                    return None
                fds[function.name] = fd
                if maps is None:
                    maps = pinned_map_ids(self.pin_dir)
                if not set(bpfsys.prog_info(fd, function.name).map_ids) <= maps:
                    log.info(
                        "pinned %s uses maps no longer pinned: loading it again", function.name
                    )
                    return None
            result, fds = fds, {}
            return result
        finally:
            for fd in fds.values():
                os.close(fd)

    def _entry(self, cflags: list[str]) -> tuple[progcache.Entry, Origin]:
        names = [f.name for f in self.functions]
        path = self._stored_path()
        if path is not None:
            entry = progcache.load(path)
            if entry is not None and set(names) <= set(entry.functions):
                try:
                    progcache.close_fds(progcache.open_maps(entry, self.pin_dir))
                    return entry, Origin.LOADED
                except bpfsys.BpfError as exc:
                    log.warning("stored bytecode %s unusable, compiling: %s", path.name, exc)
        entry = compile_in_child(self.source, cflags, names, self.pin_dir)
        if path is not None:
            progcache.store(path, entry)
        return entry, Origin.COMPILED

    def _load(self, entry: progcache.Entry) -> None:
        map_fds = progcache.open_maps(entry, self.pin_dir)
        try:
            for function in self.functions:
                try:
                    self.fds[function.name] = progcache.load_function(
                        entry, map_fds, function.name, function.prog_type, function.attach_type
                    )
                except bpfsys.BpfError as exc:
                    self.close()
                    needs = f" (needs {function.needs})" if function.needs else ""
                    raise BpfLoadError(f"loading {function.name} failed{needs}: {exc}") from exc
        finally:
            progcache.close_fds(map_fds)  # the loaded programs hold their maps

    def ids(self) -> dict[str, int]:
        return {name: bpfsys.prog_info(fd, name).id for name, fd in self.fds.items()}

    def commit_pins(self) -> None:
        """Pin these programs (unless adopted: they are) and unpin other builds of the same
        functions, once these are attached and the old ones detached."""
        names = {f.name for f in self.functions}
        for name, fd in self.fds.items():
            path = program_pin(self.pin_dir, self.key, name)
            if self.origin is not Origin.ADOPTED:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # this hash's programs on maps since replaced
                bpfsys.obj_pin(fd, str(path))
        for pin in self.pin_dir.iterdir():
            match = pins.PROGRAM_PIN.match(pin.name)
            if match and match.group(2) in names and match.group(1) != self.key[:16]:
                with contextlib.suppress(FileNotFoundError):
                    pin.unlink()

    def close(self) -> None:
        """Drop this process's handles; attachments and pins keep the programs."""
        progcache.close_fds(list(self.fds.values()))
        self.fds = {}
