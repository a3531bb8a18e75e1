"""The bytecode store: BCC's compiled programs, loaded again without clang.

The bytecode BCC produces depends only on the source, the cflags, the kernel (headers) and
BCC itself; what ties it to one process are the map fds in its ld_imm64 instructions. So an
entry keeps each program's instructions and, for every map they reference, the map's pin
name and shape. Loading one opens the pinned maps (or creates and pins them, as BCC would,
when the pin directory is new), writes their fds into the instructions and loads them with
BPF_PROG_LOAD: the kernel gets the same program. The compile itself runs in a child
process (compiler.py) that hands over such an entry; the agent only loads.

Entries live in /var/lib/ebpflb/programs, or where EBPFLB_PROGRAM_CACHE says (the kernel
matrix's guests point it at a per-boot directory; set empty, nothing is stored). Not on
bpffs: it holds only maps, programs and links, no files. The key covers the assembled
source, the cflags, the kernel's release and build, and BCC's version; anything unexpected
in the bytecode (a pseudo instruction other than a map fd, a map that is not pinned where
the source says) is refused, never loaded as a wrong program.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import platform
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ebpflb.datapath.syscall import bpfsys
from ebpflb.datapath.syscall.uapi import BPF_LD_IMM64, BPF_PSEUDO_MAP_FD, MapType

log = logging.getLogger(__name__)

CACHE_ENV = "EBPFLB_PROGRAM_CACHE"
DEFAULT_DIR = Path("/var/lib/ebpflb/programs")
_FORMAT = 1  # bump when the entry layout changes


def cache_dir() -> Path | None:
    """Where entries are kept: EBPFLB_PROGRAM_CACHE if set (empty: nowhere), else
    DEFAULT_DIR."""
    value = os.environ.get(CACHE_ENV)
    if value is None:
        return DEFAULT_DIR
    return Path(value) if value else None


def bcc_version() -> str:
    """The installed BCC's version, read from its package without importing it (importing
    bcc maps libbcc and LLVM into the process: the agent never does)."""
    spec = importlib.util.find_spec("bcc")
    if spec is None or not spec.submodule_search_locations:
        return "none"
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", version_file.read_text())
    except OSError:
        return "unknown"
    return match.group(1) if match else "unknown"


def cache_key(source: str, cflags: Sequence[str], functions: Iterable[str], bcc: str) -> str:
    digest = hashlib.sha256()
    for part in (
        str(_FORMAT),
        source,
        "\0".join(cflags),
        "\0".join(functions),
        platform.release(),
        Path("/proc/version").read_text(),
        bcc,
    ):
        digest.update(part.encode())
        digest.update(b"\0\1")
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class MapRecord:
    name: str  # the pin's file name under the pin directory
    type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int


def map_fds(code: bytes) -> list[int] | None:
    """The map fds the instructions reference, in order of first use; None when they hold
    a pseudo instruction this cache does not understand."""
    fds: list[int] = []
    for offset in range(0, len(code) - 7, 8):
        opcode, regs, _off, imm = struct.unpack_from("<BBhi", code, offset)
        if opcode != BPF_LD_IMM64:
            continue
        src = regs >> 4
        if src == BPF_PSEUDO_MAP_FD:
            if imm not in fds:
                fds.append(imm)
        elif src != 0:
            return None
    return fds


def patch_map_fds(code: bytes, new_fd: dict[int, int]) -> bytes:
    """`code` with every ld_imm64 map fd replaced through `new_fd`. The second slot of an
    ld_imm64 has opcode 0, so it is never taken for one."""
    out = bytearray(code)
    for offset in range(0, len(code) - 7, 8):
        opcode, regs, off, imm = struct.unpack_from("<BBhi", code, offset)
        if opcode == BPF_LD_IMM64 and regs >> 4 == BPF_PSEUDO_MAP_FD:
            struct.pack_into("<BBhi", out, offset, opcode, regs, off, new_fd[imm])
    return bytes(out)


@dataclass(frozen=True, slots=True)
class Entry:
    maps: tuple[MapRecord, ...]
    functions: dict[str, tuple[bytes, tuple[int, ...]]]  # name -> (code, fds in code order)
    headers: str = ""  # the kernel header tree it was compiled with (headers.KernelHeaders)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": _FORMAT,
                "maps": [asdict(m) for m in self.maps],
                "functions": {
                    name: {"code": code.hex(), "fds": list(fds)}
                    for name, (code, fds) in self.functions.items()
                },
                "headers": self.headers,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Entry:
        doc: dict[str, Any] = json.loads(text)
        if doc.get("format") != _FORMAT:
            raise ValueError(f"cache entry format {doc.get('format')}")
        return cls(
            tuple(MapRecord(**m) for m in doc["maps"]),
            {
                name: (bytes.fromhex(f["code"]), tuple(f["fds"]))
                for name, f in doc["functions"].items()
            },
            str(doc.get("headers", "")),  # absent in entries stored before it was recorded
        )


def record(codes: dict[str, bytes], pin_dir: Path, also: Iterable[str] = ()) -> Entry | None:
    """What to store for freshly compiled functions ({name: bytecode}), whose map fds are
    open in this process, plus the maps pinned under the names `also` (declared by the
    source but used by no program here: BCC pins them all, and so must a hit). None when
    a referenced map is not the one pinned under its name in `pin_dir`."""
    maps: dict[int, MapRecord] = {}
    functions: dict[str, tuple[bytes, tuple[int, ...]]] = {}
    for name, code in codes.items():
        fds = map_fds(code)
        if fds is None:
            return None
        for fd in fds:
            if fd in maps:
                continue
            info = bpfsys.map_info(fd, f"map fd {fd}")
            try:
                pinned = bpfsys.obj_get(str(pin_dir / info.name))
            except bpfsys.BpfError:
                return None
            try:
                if bpfsys.map_info(pinned, info.name).id != info.id:
                    return None
            finally:
                os.close(pinned)
            maps[fd] = _record_of(info)
        functions[name] = (code, tuple(fds))
    order = list(maps)
    records = [maps[fd] for fd in order]
    for name in also:
        if any(r.name == name for r in records):
            continue
        try:
            fd = bpfsys.obj_get(str(pin_dir / name))
        except bpfsys.BpfError:
            continue  # not declared by this source
        try:
            records.append(_record_of(bpfsys.map_info(fd, name)))
        finally:
            os.close(fd)
    # Store fds as indices into `records`: the numbers of the compiling process mean nothing.
    return Entry(
        tuple(records),
        {
            name: (
                patch_map_fds(code, {fd: order.index(fd) for fd in fds}),
                tuple(order.index(fd) for fd in fds),
            )
            for name, (code, fds) in functions.items()
        },
    )


def _record_of(info: bpfsys.MapInfo) -> MapRecord:
    return MapRecord(
        info.name, info.type, info.key_size, info.value_size, info.max_entries, info.flags
    )


def load(path: Path) -> Entry | None:
    try:
        return Entry.from_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the unreadable program cache entry %s: %s", path, exc)
        return None


def store(path: Path, entry: Entry) -> None:
    """Write atomically; a cache that cannot be written costs only the next compile."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(entry.to_json())
        tmp.replace(path)
    except OSError as exc:
        log.warning("cannot write the program cache entry %s: %s", path, exc.strerror)


def open_maps(entry: Entry, pin_dir: Path) -> list[int]:
    """An fd per recorded map: the pin if there is one of the recorded shape, else a new
    map pinned there. BpfError if a pin of another shape is in the way."""
    fds: list[int] = []
    try:
        for m in entry.maps:
            path = pin_dir / m.name
            try:
                fd = bpfsys.obj_get(str(path))
            except bpfsys.BpfError:
                fd = _create_map(m)
                fds.append(fd)
                bpfsys.obj_pin(fd, str(path))
                continue
            fds.append(fd)
            info = bpfsys.map_info(fd, m.name)
            shape = (info.type, info.key_size, info.value_size, info.max_entries, info.flags)
            if shape != (m.type, m.key_size, m.value_size, m.max_entries, m.flags):
                raise bpfsys.BpfError(f"pinned map {path} has another shape", 22)
    except BaseException:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    return fds


def close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _create_map(m: MapRecord) -> int:
    """A new map of the recorded shape. Socket storage must be described by BTF (an int key,
    a value of its size), which BCC derives from the source: here, a value of bytes."""
    if m.type != MapType.SK_STORAGE:
        return bpfsys.map_create(
            m.type, m.key_size, m.value_size, m.max_entries, f"map {m.name}", m.flags, name=m.name
        )
    btf = bpfsys.btf_load(_storage_btf(m.value_size), f"BTF of map {m.name}")
    try:
        return bpfsys.map_create(
            m.type,
            m.key_size,
            m.value_size,
            m.max_entries,
            f"map {m.name}",
            m.flags,
            btf,
            1,
            3,
            name=m.name,
        )
    finally:
        os.close(btf)


def _storage_btf(value_size: int) -> bytes:
    """BTF with [1] int (signed, 32 bits), [2] u8, [3] u8[value_size] (uapi/linux/btf.h)."""
    strings = b"\0int\0u8\0"
    types = (
        struct.pack("<IIII", 1, 1 << 24, 4, (1 << 24) | 32)  # INT "int", BTF_INT_SIGNED
        + struct.pack("<IIII", 5, 1 << 24, 1, 8)  # INT "u8"
        + struct.pack("<IIIIII", 0, 3 << 24, 0, 2, 1, value_size)  # ARRAY of [2] by [1]
    )
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return header + types + strings


def load_function(
    entry: Entry, fds: Sequence[int], name: str, prog_type: int, attach_type: int
) -> int:
    code, _ = entry.functions[name]
    patched = patch_map_fds(code, dict(enumerate(fds)))
    return bpfsys.prog_load(
        prog_type, patched, f"cached program {name}", max(attach_type, 0), name=name
    )
