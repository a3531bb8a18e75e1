"""The pin directory's layout version: which ebpflb can read the maps pinned there.

An agent that meets pins of an older layout migrates them (pins.drop_incompatible: shape by
shape, every entry carried over where the kernel allows it). One that meets pins of a newer
layout cannot know what changed, so it reads them only if their writer says it may: each
writer records its layout and the oldest layout that can still read what it wrote
(`oldest_reader`, raised only when a change would be misread by older agents). Otherwise
the agent refuses, naming both versions, and leaves the pins and the attached programs as
they are: the datapath keeps serving with the newer agent's programs. An agent that reads
the pins (migrating what it must) records its own layout once its programs are loaded.

The record is a one-element array pinned as `ebpflb_layout` next to the maps; the programs
never read it. Pins from before it existed are layout 1.
"""

from __future__ import annotations

import ctypes as ct
import enum
import errno
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from ebpflb import __version__
from ebpflb.datapath import contract
from ebpflb.datapath.contract import MapName
from ebpflb.datapath.contract.consts import FAMILIES, Counter
from ebpflb.datapath.syscall import bpfsys
from ebpflb.datapath.syscall.uapi import MapType
from ebpflb.errors import KernelSetupError

PIN = "ebpflb_layout"
# This ebpflb's layout, and the oldest layout whose agents read its pins correctly. Bump
# LAYOUT whenever a pinned map's shape or an entry's meaning changes: describe() changes,
# and tests/unit/datapath/test_pinlayout.py fails until FINGERPRINT is updated with LAYOUT.
# Raise OLDEST_READER only when older agents would misread the new pins.
# 3: conntrack entries' FIN_CLIENT and FIN_BACKEND flags (half-closed TCP); layout 2
# agents ignore them (a half-closed flow lives as an established one), so they still read.
LAYOUT = 3
OLDEST_READER = 2
# sha256 of `describe()` for the layout above, its first 16 hex digits.
FINGERPRINT = "1cdb7214856d7499"
UNVERSIONED = 1  # maps pinned by an ebpflb from before this record


class _Record(ct.Structure):
    _fields_ = (
        ("layout", ct.c_uint32),  # the writer's LAYOUT
        ("oldest_reader", ct.c_uint32),  # the oldest LAYOUT that reads these pins correctly
        ("written_by", ct.c_char * 32),  # the writer's ebpflb version, for messages
    )


@dataclass(frozen=True, slots=True)
class Record:
    layout: int
    oldest_reader: int
    written_by: str


class Verdict(enum.Enum):
    FRESH = "fresh"  # no ebpflb maps pinned: this agent creates them
    SAME = "same"
    OLDER = "older"  # migrated by drop_incompatible, then recorded as LAYOUT
    NEWER_READABLE = "newer-readable"  # their writer says this layout reads them
    NEWER_REFUSED = "newer-refused"


def judge(found: Record | None, has_maps: bool, layout: int = LAYOUT) -> Verdict:
    """What an agent of `layout` does with a pin directory holding `found` (None: no
    record) and, per `has_maps`, ebpflb's maps."""
    if not has_maps:
        return Verdict.FRESH
    found_layout = found.layout if found else UNVERSIONED
    if found_layout == layout:
        return Verdict.SAME
    if found_layout < layout:
        return Verdict.OLDER
    assert found is not None
    return Verdict.NEWER_READABLE if found.oldest_reader <= layout else Verdict.NEWER_REFUSED


def refusal(pin_dir: Path, found: Record) -> str:
    return (
        f"the maps pinned under {pin_dir} have layout {found.layout} (written by ebpflb"
        f" {found.written_by}), readable by layout {found.oldest_reader} and newer; this"
        f" ebpflb {__version__} has layout {LAYOUT}. Run ebpflb {found.written_by} or newer,"
        " or `ebpflb cleanup` to start over from empty maps"
    )


def read(pin_dir: Path) -> Record | None:
    """The record pinned under `pin_dir`; None when there is none."""
    try:
        fd = bpfsys.obj_get(str(pin_dir / PIN))
    except bpfsys.BpfError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise KernelSetupError(f"cannot open {pin_dir / PIN}: {exc}") from exc
    try:
        info = bpfsys.map_info(fd, PIN)
        if (info.type, info.key_size, info.value_size) != (
            MapType.ARRAY,
            ct.sizeof(ct.c_uint32),
            ct.sizeof(_Record),
        ):
            raise KernelSetupError(f"{pin_dir / PIN} is not ebpflb's layout record: remove it")
        key, value = ct.c_uint32(0), _Record()
        err = bpfsys.lookup_elem(fd, ct.addressof(key), ct.addressof(value))
        if err:
            raise KernelSetupError(f"cannot read {pin_dir / PIN}: {os.strerror(err)}")
    finally:
        os.close(fd)
    return Record(value.layout, value.oldest_reader, value.written_by.decode(errors="replace"))


def has_maps(pin_dir: Path) -> bool:
    """Whether any of ebpflb's maps is pinned under `pin_dir`."""
    return any((pin_dir / name.value).exists() for name in MapName)


def check(pin_dir: Path) -> tuple[Verdict, Record | None]:
    """The verdict on `pin_dir` and the record found there (refusal(...) says why a
    NEWER_REFUSED one is refused)."""
    found = read(pin_dir)
    return judge(found, has_maps(pin_dir)), found


def write(
    pin_dir: Path,
    layout: int = LAYOUT,
    oldest_reader: int = OLDEST_READER,
    written_by: str = __version__,
) -> None:
    """Record this ebpflb's layout (after the maps were migrated or created); tests pass
    another writer's."""
    path = pin_dir / PIN
    try:
        fd = bpfsys.obj_get(str(path))
    except bpfsys.BpfError:
        fd = bpfsys.map_create(
            MapType.ARRAY, ct.sizeof(ct.c_uint32), ct.sizeof(_Record), 1, path.name, name=PIN
        )
        try:
            bpfsys.obj_pin(fd, str(path))
        except BaseException:
            os.close(fd)
            raise
    try:
        key = ct.c_uint32(0)
        value = _Record(layout, oldest_reader, written_by.encode()[:31])
        err = bpfsys.update_elem(fd, ct.addressof(key), ct.addressof(value))
        if err:
            raise KernelSetupError(f"cannot write {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def describe() -> str:
    """The pinned maps as a later ebpflb would have to read them: each map's kind, flags,
    its key and value structs field by field (name, offset, size), and the flag and enum
    values stored in entries (not the counters' indexes: a counter is only ever added)."""

    def fields(ctype: type) -> str:
        if not hasattr(ctype, "_fields_"):
            return f"{ctype.__name__}:{ct.sizeof(ctype)}"
        parts = []
        for field in ctype._fields_:
            name, kind = field[0], field[1]
            offset = getattr(ctype, name).offset
            parts.append(f"{name}@{offset}={fields(kind)}")
        return f"{ctype.__name__}{{{','.join(parts)}}}"

    maps = [
        f"{name.value} {spec.type.name} flags={spec.flags} key={fields(spec.key)}"
        f" value={fields(spec.value)}"
        for name, spec in sorted(contract.MAPS.items(), key=lambda item: item[0].value)
    ]
    values = [
        f"{prefix}{name}={int(member)}"
        for prefix, family in FAMILIES
        if family is not Counter
        for name, member in family.__members__.items()
    ]
    return "\n".join(maps + values)


def fingerprint() -> str:
    return hashlib.sha256(describe().encode()).hexdigest()[:16]
