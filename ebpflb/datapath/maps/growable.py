"""Maps that start small and grow (the Maglev slot pool, NodePort conntrack): the programs
reach them through a one-slot BPF_MAP_TYPE_ARRAY_OF_MAPS (the "ref" map), so a larger map
can be swapped in without reloading a program.

Each growable map is pinned twice: its ref map (the one the programs declare, fixed
layout) and the current map itself under its own name, so every reader of the pins
(`maps dump`, `status`, a restarted agent) opens it as before; a reader that keeps a map
open across a grow keeps reading the old one (open it again). A grow creates a larger map,
fills it, points the ref map's slot at it (one atomic update: a program sees the old map or
the new one) and re-pins it under the name (a rename over the old pin). The slot pool's
only writer is the agent, so its copy is exact (slotpool.py); conntrack is written by the
programs too, so what they added meanwhile is copied after the swap (grow_table). The old
map goes when its last fd closes. An agent killed between swap and re-pin leaves the pin
naming the old map: `ensure` re-pins whatever the ref map holds.

An array inner map carries BPF_F_INNER_MAP (Linux 5.10), which lets the ref map hold arrays
of any size; the programs then look its elements up through the helper, not inlined code.
Upgrades from pins made before: `migrate` (the slot pool) and `copy_into_new_layout` (hash
maps whose flags changed) copy the old contents into the new layout.
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import errno
import logging
import mmap
import os
from pathlib import Path

from ebpflb.config import Config
from ebpflb.datapath import contract
from ebpflb.datapath.contract import MapName, MapSpec
from ebpflb.datapath.maps.elementio import ElementIO
from ebpflb.datapath.syscall import bpfsys, uapi
from ebpflb.errors import KernelSetupError

log = logging.getLogger(__name__)

_REF_SLOT = 0


class _ElemAttr(ct.Structure):
    _fields_ = [
        ("map_fd", ct.c_uint32),
        ("pad", ct.c_uint32),
        ("key", ct.c_uint64),
        ("value", ct.c_uint64),
        ("flags", ct.c_uint64),
    ]


class _MapIdAttr(ct.Structure):
    _fields_ = [("map_id", ct.c_uint32), ("next_id", ct.c_uint32), ("open_flags", ct.c_uint32)]


def _ref_get(ref_fd: int, what: str) -> int | None:
    """The id of the map the ref map's slot holds; None when empty."""
    key, value = ct.c_uint32(_REF_SLOT), ct.c_uint32(0)
    attr = _ElemAttr(map_fd=ref_fd, key=ct.addressof(key), value=ct.addressof(value))
    try:
        bpfsys._bpf(uapi.BPF_MAP_LOOKUP_ELEM, attr, f"reading {what}")
    except bpfsys.BpfError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    return int(value.value)


def _ref_set(ref_fd: int, map_fd: int, what: str) -> None:
    key, value = ct.c_uint32(_REF_SLOT), ct.c_uint32(map_fd)
    attr = _ElemAttr(map_fd=ref_fd, key=ct.addressof(key), value=ct.addressof(value))
    bpfsys._bpf(uapi.BPF_MAP_UPDATE_ELEM, attr, f"pointing {what} at a new map")


def _map_fd_by_id(map_id: int, what: str) -> int:
    return bpfsys._bpf(uapi.BPF_MAP_GET_FD_BY_ID, _MapIdAttr(map_id=map_id), f"opening {what}")


def initial_entries(spec: MapSpec, config: Config) -> int:
    """max_entries a growable map starts with: its initial size, at most its limit."""
    limit = spec.max_entries(config)
    initial = contract.INITIAL_ENTRIES.get(spec.name)
    return limit if initial is None else max(1, min(limit, initial(config)))


def create(spec: MapSpec, max_entries: int) -> int:
    """A new, empty map of `spec`'s layout with `max_entries`; the caller owns the fd."""
    return bpfsys.map_create(
        int(spec.type),
        ct.sizeof(spec.key),
        ct.sizeof(spec.value),
        max_entries,
        f"{spec.name.value} ({max_entries} entries)",
        flags=spec.flags,
        name=spec.name.value,
    )


def _pin_over(fd: int, path: Path) -> None:
    """Pin `fd` at `path`, replacing what is there in one rename (bpffs refuses names with
    a dot)."""
    temporary = path.with_name(path.name + "_next")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    bpfsys.obj_pin(fd, str(temporary))
    os.rename(temporary, path)


def ensure(config: Config) -> None:
    """Before the programs are compiled: every growable map and its ref map pinned, the
    pin naming the map the ref map holds (BCC opens the ref map's pin; it cannot create a
    map-in-map itself without a template)."""
    for name, ref in contract.GROWABLE.items():
        spec = contract.MAPS[name]
        path, ref_path = config.bpffs_dir / name.value, config.bpffs_dir / ref.value
        try:
            _ensure_one(spec, config, path, ref_path)
        except (bpfsys.BpfError, OSError) as exc:
            raise KernelSetupError(f"cannot set up the growable map {path}: {exc}") from exc


def _ensure_one(spec: MapSpec, config: Config, path: Path, ref_path: Path) -> None:
    if ref_path.exists():
        ref_fd = bpfsys.obj_get(str(ref_path))
        try:
            held = _ref_get(ref_fd, ref_path.name)
            if held is not None:
                inner = _map_fd_by_id(held, f"the map {ref_path.name} holds")
                try:
                    if bpfsys.map_info(inner, path.name).id != _pinned_id(path):
                        _pin_over(inner, path)  # an agent died between swap and re-pin
                finally:
                    os.close(inner)
                return
            inner = _adopt_or_create(spec, config, path)
            try:
                _ref_set(ref_fd, inner, ref_path.name)
            finally:
                os.close(inner)
        finally:
            os.close(ref_fd)
        return
    inner = _adopt_or_create(spec, config, path)
    try:
        ref_spec = contract.MAPS[contract.GROWABLE[spec.name]]
        ref_fd = bpfsys.map_create(
            int(ref_spec.type),
            ct.sizeof(ref_spec.key),
            ct.sizeof(ref_spec.value),
            ref_spec.max_entries(config),
            ref_path.name,
            name=ref_path.name,
            inner_map_fd=inner,
        )
        try:
            _ref_set(ref_fd, inner, ref_path.name)
            bpfsys.obj_pin(ref_fd, str(ref_path))
        finally:
            os.close(ref_fd)
    finally:
        os.close(inner)


def _pinned_id(path: Path) -> int | None:
    try:
        fd = bpfsys.obj_get(str(path))
    except bpfsys.BpfError:
        return None
    try:
        return bpfsys.map_info(fd, path.name).id
    finally:
        os.close(fd)


def _adopt_or_create(spec: MapSpec, config: Config, path: Path) -> int:
    """The map pinned at `path` (pins.drop_incompatible left only a compatible one), or a
    new one of the initial size, pinned there."""
    with contextlib.suppress(bpfsys.BpfError):
        return bpfsys.obj_get(str(path))
    fd = create(spec, initial_entries(spec, config))
    _pin_over(fd, path)
    log.info(
        "created %s with %d entries (grows up to %d)",
        path.name,
        initial_entries(spec, config),
        spec.max_entries(config),
    )
    return fd


def swap(bpffs_dir: Path, name: MapName, new_fd: int) -> None:
    """Point the programs at `new_fd` (filled by the caller) and pin it as `name`."""
    ref = contract.GROWABLE[name]
    ref_fd = bpfsys.obj_get(str(bpffs_dir / ref.value))
    try:
        _ref_set(ref_fd, new_fd, ref.value)
    finally:
        os.close(ref_fd)
    _pin_over(new_fd, bpffs_dir / name.value)


def migrate(spec: MapSpec, config: Config, path: Path) -> bool:
    """A map pinned at `path` by an ebpflb from before it was growable (no BPF_F_INNER_MAP,
    the same key and value): copied into a growable one of its size (at most the limit)
    pinned in its place, so the tables its service entries point at stay readable while
    the new programs take over; the old ref-less map goes with its last user. False when
    it is not such a map (the caller drops it)."""
    try:
        fd = bpfsys.obj_get(str(path))
    except bpfsys.BpfError:
        return False
    try:
        info = bpfsys.map_info(fd, path.name)
        if (
            spec.type is not contract.MapType.ARRAY
            or (info.type, info.key_size, info.value_size)
            != (int(spec.type), ct.sizeof(spec.key), ct.sizeof(spec.value))
            or not info.flags & contract.BPF_F_MMAPABLE
            or info.flags & contract.BPF_F_INNER_MAP
        ):
            return False
        entries = min(
            spec.max_entries(config), max(info.max_entries, initial_entries(spec, config))
        )
        new = create(spec, entries)
        try:
            size = min(info.max_entries, entries) * info.value_size
            pages = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
            with (
                mmap.mmap(fd, pages, prot=mmap.PROT_READ) as old_memory,
                mmap.mmap(new, pages) as new_memory,
            ):
                new_memory[:size] = old_memory[:size]
            _pin_over(new, path)
        finally:
            os.close(new)
    finally:
        os.close(fd)
    log.info(
        "%s: copied into a growable map of %d entries (was %d)", path, entries, info.max_entries
    )
    return True


def grow_table(bpffs_dir: Path, name: MapName, max_entries: int) -> int:
    """Swap a hash table the datapath writes (conntrack) for one of `max_entries`, every
    entry kept: copied, the ref map pointed at the copy, then the entries the programs
    added to the old table meanwhile copied too, unless the new one has them already (a
    packet after the swap made its own). Changes the programs made meanwhile to entries
    copied first (a deadline pushed on, a flag) are lost: the next packet makes them
    again. Returns how many entries were copied."""
    spec = contract.MAPS[name]
    path = bpffs_dir / name.value
    old = bpfsys.obj_get(str(path))
    try:
        new = create(spec, max_entries)
        try:
            io = ElementIO(old, name.value, ct.sizeof(spec.key), ct.sizeof(spec.value))
            keys, values, count = io.read_all(spec.key, spec.value)
            key_buf, value_buf = ct.create_string_buffer(keys), ct.create_string_buffer(values)
            errors = ElementIO(new, name.value, io.key_size, io.value_size).update(
                ct.addressof(key_buf), ct.addressof(value_buf), count
            )
            if errors:
                raise bpfsys.BpfError(f"copying {name.value}", next(iter(errors.values())))
            swap(bpffs_dir, name, new)
            copied = count + _copy_new_keys(io, new, keys, count)
        finally:
            os.close(new)
    finally:
        os.close(old)
    return copied


def _copy_new_keys(io: ElementIO, new_fd: int, first: bytes, first_count: int) -> int:
    """Entries of the old table not in the first copy, into the new one where absent."""
    spec_key, spec_value = io.key_size, io.value_size
    keys, values, count = io.read_all(ct.c_char * spec_key, ct.c_char * spec_value)
    seen = {first[i * spec_key : (i + 1) * spec_key] for i in range(first_count)}
    added = 0
    for i in range(count):
        key = keys[i * spec_key : (i + 1) * spec_key]
        if key in seen:
            continue
        value = values[i * spec_value : (i + 1) * spec_value]
        key_buf, value_buf = ct.create_string_buffer(key), ct.create_string_buffer(value)
        attr = _ElemAttr(
            map_fd=new_fd,
            key=ct.addressof(key_buf),
            value=ct.addressof(value_buf),
            flags=uapi.BPF_NOEXIST,
        )
        try:
            bpfsys._bpf(uapi.BPF_MAP_UPDATE_ELEM, attr, "copying a new flow")
            added += 1
        except bpfsys.BpfError as exc:
            if exc.errno != errno.EEXIST:
                raise
    return added


def copy_into_new_layout(spec: MapSpec, config: Config, path: Path) -> bool:
    """A hash map pinned with other flags or another size than this configuration wants
    (an upgrade: the control plane's hash maps lost their preallocation): copied into one
    of the new layout pinned in its place, so the new programs start with every entry (a
    service, a reply translation) rather than an empty map until the first sync. False
    when it cannot be (another type or entry layout, or more entries than fit)."""
    if spec.type not in (contract.MapType.HASH, contract.MapType.LRU_HASH):
        return False
    try:
        old = bpfsys.obj_get(str(path))
    except bpfsys.BpfError:
        return False
    try:
        info = bpfsys.map_info(old, path.name)
        if (info.type, info.key_size, info.value_size) != (
            int(spec.type),
            ct.sizeof(spec.key),
            ct.sizeof(spec.value),
        ):
            return False
        io = ElementIO(old, path.name, info.key_size, info.value_size)
        keys, values, count = io.read_all(spec.key, spec.value)
        if count > spec.max_entries(config):
            return False
        new = create(spec, spec.max_entries(config))
        try:
            key_buf, value_buf = ct.create_string_buffer(keys), ct.create_string_buffer(values)
            errors = ElementIO(new, path.name, info.key_size, info.value_size).update(
                ct.addressof(key_buf), ct.addressof(value_buf), count
            )
            if errors:
                return False
            _pin_over(new, path)
        finally:
            os.close(new)
    finally:
        os.close(old)
    log.info("%s: %d entries copied into the new layout", path, count)
    return True
