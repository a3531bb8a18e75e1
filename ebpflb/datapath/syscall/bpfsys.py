"""The bpf(2) commands the agent uses, called through ctypes: no libbcc, no LLVM.

BCC only compiles (programs/compiler.py, in a short-lived child process); everything
the long-running agent does with the kernel goes through here: opening pins, creating maps,
loading bytecode (BPF_PROG_LOAD), attaching to cgroups, reading objects' info, listing and
detaching what a cgroup has attached, map elements one by one or in batches, and running a
program on a packet (BPF_PROG_TEST_RUN; typed in programs/testrun.py). The kernel feature probe
(probes/) loads hand-assembled programs, maps and BTF with the same commands.

Element commands return the errno (0 on success) instead of raising: callers on hot paths
(batched writes falling back element by element) decide per errno.

A failed command raises BpfError (a DatapathError, so the CLI prints it in one line)
naming what it was done to and keeping the errno for callers that expect some.

Over 400 lines on purpose: one thin wrapper per bpf(2) command, a few lines each, sharing
the attribute layouts and error mapping; split, they would import those from each other.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
import resource
from dataclasses import dataclass

from ebpflb.datapath.syscall.uapi import (
    BPF_BTF_LOAD,
    BPF_LINK_CREATE,
    BPF_MAP_CREATE,
    BPF_MAP_DELETE_ELEM,
    BPF_MAP_GET_NEXT_KEY,
    BPF_MAP_LOOKUP_BATCH,
    BPF_MAP_LOOKUP_ELEM,
    BPF_MAP_UPDATE_BATCH,
    BPF_MAP_UPDATE_ELEM,
    BPF_OBJ_GET,
    BPF_OBJ_GET_INFO_BY_FD,
    BPF_OBJ_PIN,
    BPF_PROG_ATTACH,
    BPF_PROG_DETACH,
    BPF_PROG_GET_FD_BY_ID,
    BPF_PROG_LOAD,
    BPF_PROG_QUERY,
    BPF_PROG_TEST_RUN,
)
from ebpflb.errors import DatapathError

_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long

_NR_BPF = {"x86_64": 321, "aarch64": 280}[os.uname().machine]


class BpfError(DatapathError):
    """A bpf(2) command failed: what it was for, and why (errno kept)."""

    def __init__(self, what: str, err: int) -> None:
        super().__init__(f"{what}: {os.strerror(err)}")
        self.errno = err


class _ObjGetAttr(ct.Structure):
    _fields_ = [("pathname", ct.c_uint64), ("bpf_fd", ct.c_uint32), ("file_flags", ct.c_uint32)]


class _InfoAttr(ct.Structure):
    _fields_ = [("bpf_fd", ct.c_uint32), ("info_len", ct.c_uint32), ("info", ct.c_uint64)]


class _GetFdByIdAttr(ct.Structure):
    _fields_ = [("id", ct.c_uint32), ("next_id", ct.c_uint32), ("open_flags", ct.c_uint32)]


class _QueryAttr(ct.Structure):
    _fields_ = [
        ("target_fd", ct.c_uint32),
        ("attach_type", ct.c_uint32),
        ("query_flags", ct.c_uint32),
        ("attach_flags", ct.c_uint32),
        ("prog_ids", ct.c_uint64),
        ("prog_cnt", ct.c_uint32),
    ]


class _ElemAttr(ct.Structure):
    """The element member of union bpf_attr (value and next_key share a slot)."""

    _fields_ = [
        ("map_fd", ct.c_uint32),
        ("key", ct.c_uint64),
        ("value", ct.c_uint64),
        ("flags", ct.c_uint64),
    ]


class _DetachAttr(ct.Structure):
    _fields_ = [
        ("target_fd", ct.c_uint32),
        ("attach_bpf_fd", ct.c_uint32),
        ("attach_type", ct.c_uint32),
        ("attach_flags", ct.c_uint32),
        ("replace_bpf_fd", ct.c_uint32),
    ]


class _TestRunAttr(ct.Structure):
    """The `test` member of union bpf_attr (uapi/linux/bpf.h)."""

    _fields_ = [
        ("prog_fd", ct.c_uint32),
        ("retval", ct.c_uint32),
        ("data_size_in", ct.c_uint32),
        ("data_size_out", ct.c_uint32),
        ("data_in", ct.c_uint64),
        ("data_out", ct.c_uint64),
        ("repeat", ct.c_uint32),
        ("duration", ct.c_uint32),
        ("ctx_size_in", ct.c_uint32),
        ("ctx_size_out", ct.c_uint32),
        ("ctx_in", ct.c_uint64),
        ("ctx_out", ct.c_uint64),
        ("flags", ct.c_uint32),
        ("cpu", ct.c_uint32),
        ("batch_size", ct.c_uint32),
    ]


class _MapInfo(ct.Structure):
    """Leading fields of struct bpf_map_info (uapi/linux/bpf.h)."""

    _fields_ = [
        ("type", ct.c_uint32),
        ("id", ct.c_uint32),
        ("key_size", ct.c_uint32),
        ("value_size", ct.c_uint32),
        ("max_entries", ct.c_uint32),
        ("map_flags", ct.c_uint32),
        ("name", ct.c_char * 16),
    ]


class _ProgInfo(ct.Structure):
    """Leading fields of struct bpf_prog_info (uapi/linux/bpf.h)."""

    _fields_ = [
        ("type", ct.c_uint32),
        ("id", ct.c_uint32),
        ("tag", ct.c_uint8 * 8),
        ("jited_prog_len", ct.c_uint32),
        ("xlated_prog_len", ct.c_uint32),
        ("jited_prog_insns", ct.c_uint64),
        ("xlated_prog_insns", ct.c_uint64),
        ("load_time", ct.c_uint64),
        ("created_by_uid", ct.c_uint32),
        ("nr_map_ids", ct.c_uint32),
        ("map_ids", ct.c_uint64),
        ("name", ct.c_char * 16),
    ]


_MAX_PROG_MAPS = 64  # map ids read per program; ebpflb's programs use fewer than 20


VERIFIER_LOG_SIZE = 1 << 24  # enough for a log of a rejected program of ours
VERIFIER_LOG_LINES = 12  # of its end, in the error


class _ProgLoadAttr(ct.Structure):
    """The BPF_PROG_LOAD member of union bpf_attr, up to expected_attach_type (4.17)."""

    _fields_ = [
        ("prog_type", ct.c_uint32),
        ("insn_cnt", ct.c_uint32),
        ("insns", ct.c_uint64),
        ("license", ct.c_uint64),
        ("log_level", ct.c_uint32),
        ("log_size", ct.c_uint32),
        ("log_buf", ct.c_uint64),
        ("kern_version", ct.c_uint32),
        ("prog_flags", ct.c_uint32),
        ("prog_name", ct.c_char * 16),
        ("prog_ifindex", ct.c_uint32),
        ("expected_attach_type", ct.c_uint32),
    ]


class _MapCreateAttr(ct.Structure):
    """The BPF_MAP_CREATE member of union bpf_attr, up to the BTF type ids (4.18)."""

    _fields_ = [
        ("map_type", ct.c_uint32),
        ("key_size", ct.c_uint32),
        ("value_size", ct.c_uint32),
        ("max_entries", ct.c_uint32),
        ("map_flags", ct.c_uint32),
        ("inner_map_fd", ct.c_uint32),
        ("numa_node", ct.c_uint32),
        ("map_name", ct.c_char * 16),
        ("map_ifindex", ct.c_uint32),
        ("btf_fd", ct.c_uint32),
        ("btf_key_type_id", ct.c_uint32),
        ("btf_value_type_id", ct.c_uint32),
    ]


class _BtfLoadAttr(ct.Structure):
    _fields_ = [
        ("btf", ct.c_uint64),
        ("btf_log_buf", ct.c_uint64),
        ("btf_size", ct.c_uint32),
        ("btf_log_size", ct.c_uint32),
        ("btf_log_level", ct.c_uint32),
    ]


class _BatchAttr(ct.Structure):
    _fields_ = [
        ("in_batch", ct.c_uint64),
        ("out_batch", ct.c_uint64),
        ("keys", ct.c_uint64),
        ("values", ct.c_uint64),
        ("count", ct.c_uint32),
        ("map_fd", ct.c_uint32),
        ("elem_flags", ct.c_uint64),
        ("flags", ct.c_uint64),
    ]


class _LinkCreateAttr(ct.Structure):
    _fields_ = [
        ("prog_fd", ct.c_uint32),
        ("target_fd", ct.c_uint32),
        ("attach_type", ct.c_uint32),
        ("flags", ct.c_uint32),
    ]


@dataclass(frozen=True, slots=True)
class MapInfo:
    type: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    name: str


@dataclass(frozen=True, slots=True)
class ProgInfo:
    id: int
    type: int
    name: str
    tag: str = ""  # hash of the instructions, map fds left out: equal for equal programs
    map_ids: tuple[int, ...] = ()  # the maps the program uses (kernel ids)
    xlated_insns: int = 0  # instructions as the verifier left them (8 bytes each)
    jited_bytes: int = 0  # machine code the JIT made of them


def _bpf(cmd: int, attr: ct.Structure, what: str) -> int:
    ret = _libc.syscall(_NR_BPF, cmd, ct.byref(attr), ct.sizeof(attr))
    if ret < 0:
        raise BpfError(what, ct.get_errno())
    return int(ret)


def _bpf_charged(cmd: int, attr: ct.Structure, what: str) -> int:
    """_bpf for commands that allocate kernel memory. Before 5.11 that memory counts against
    RLIMIT_MEMLOCK, shared by every process of the user: with an agent's maps loaded, a
    small limit refuses with EPERM. Like libbpf and BCC, raise the limit and retry once."""
    try:
        return _bpf(cmd, attr, what)
    except BpfError as exc:
        if exc.errno != errno.EPERM or not _raise_memlock_limit():
            raise
    return _bpf(cmd, attr, what)


def _raise_memlock_limit() -> bool:
    """RLIMIT_MEMLOCK to infinity; False if it already was, or may not be raised."""
    if resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] == resource.RLIM_INFINITY:
        return False
    try:
        resource.setrlimit(
            resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
        )
    except (ValueError, OSError):
        return False
    return True


def prog_load(
    prog_type: int, insns: bytes, what: str, expected_attach_type: int = 0, name: str = ""
) -> int:
    """Load a program given as raw instructions (8 bytes each); the caller owns the fd.
    BpfError keeps the kernel's errno (EINVAL for an unknown program type, attach type or
    helper). A rejected program is loaded once more with the verifier's log, whose last
    lines the error then carries (the first attempt takes none: a log costs the kernel)."""
    code = ct.create_string_buffer(insns, len(insns))
    license_ = ct.create_string_buffer(b"GPL")
    attr = _ProgLoadAttr(
        prog_type=prog_type,
        insn_cnt=len(insns) // 8,
        insns=ct.addressof(code),
        license=ct.addressof(license_),
        prog_name=name.encode()[:15],
        expected_attach_type=expected_attach_type,
    )
    try:
        return _bpf_charged(BPF_PROG_LOAD, attr, f"loading {what}")
    except BpfError as exc:
        if exc.errno not in (errno.EACCES, errno.EINVAL):
            raise
        log = ct.create_string_buffer(VERIFIER_LOG_SIZE)
        attr.log_level, attr.log_size, attr.log_buf = 1, VERIFIER_LOG_SIZE, ct.addressof(log)
        try:
            fd = _bpf_charged(BPF_PROG_LOAD, attr, f"loading {what}")
        except BpfError:
            tail = log.value.decode(errors="replace").strip().splitlines()[-VERIFIER_LOG_LINES:]
            detail = " | ".join(tail)
            raise BpfError(f"loading {what} (verifier: {detail})", exc.errno) from exc
        return fd  # accepted the second time (a transient failure): use it


def map_create(
    map_type: int,
    key_size: int,
    value_size: int,
    max_entries: int,
    what: str,
    flags: int = 0,
    btf_fd: int = 0,
    btf_key_type_id: int = 0,
    btf_value_type_id: int = 0,
    name: str = "",
    inner_map_fd: int = 0,
) -> int:
    """Create an (unpinned) map; the caller owns the fd. `inner_map_fd`: the template of a
    map-in-map's inner maps."""
    attr = _MapCreateAttr(
        map_name=name.encode()[:15],
        map_type=map_type,
        key_size=key_size,
        value_size=value_size,
        max_entries=max_entries,
        map_flags=flags,
        inner_map_fd=inner_map_fd,
        btf_fd=btf_fd,
        btf_key_type_id=btf_key_type_id,
        btf_value_type_id=btf_value_type_id,
    )
    return _bpf_charged(BPF_MAP_CREATE, attr, f"creating {what}")


def btf_load(blob: bytes, what: str) -> int:
    """Load BTF type information (raw .BTF section bytes); the caller owns the fd."""
    data = ct.create_string_buffer(blob, len(blob))
    attr = _BtfLoadAttr(btf=ct.addressof(data), btf_size=len(blob))
    return _bpf_charged(BPF_BTF_LOAD, attr, f"loading {what}")


def map_lookup_batch(map_fd: int, key_size: int, value_size: int, count: int, what: str) -> int:
    """One BPF_MAP_LOOKUP_BATCH from the start of the map: how many elements came back
    (BpfError ENOENT once the map is exhausted, EINVAL where the command does not exist)."""
    keys = ct.create_string_buffer(key_size * count)
    values = ct.create_string_buffer(value_size * count)
    out_batch = ct.create_string_buffer(8)
    attr = _BatchAttr(
        out_batch=ct.addressof(out_batch),
        keys=ct.addressof(keys),
        values=ct.addressof(values),
        count=count,
        map_fd=map_fd,
    )
    _bpf(BPF_MAP_LOOKUP_BATCH, attr, f"batch lookup in {what}")
    return int(attr.count)


def link_create(prog_fd: int, target_fd: int, attach_type: int, what: str) -> int:
    """Attach a program through a bpf link (5.7 for cgroups); the caller owns the fd."""
    attr = _LinkCreateAttr(prog_fd, target_fd & 0xFFFFFFFF, attach_type, 0)
    return _bpf(BPF_LINK_CREATE, attr, f"linking {what}")


def obj_pin(fd: int, path: str) -> None:
    """Pin an open map or program at `path` (on a bpffs)."""
    raw = ct.create_string_buffer(os.fsencode(path))
    attr = _ObjGetAttr(ct.cast(raw, ct.c_void_p).value or 0, fd, 0)
    _bpf(BPF_OBJ_PIN, attr, f"pinning at {path}")


def obj_get(path: str) -> int:
    """Open a pinned map or program; the caller owns (and closes) the fd."""
    raw = ct.create_string_buffer(os.fsencode(path))
    attr = _ObjGetAttr(ct.cast(raw, ct.c_void_p).value or 0, 0, 0)
    return _bpf(BPF_OBJ_GET, attr, f"opening pinned object {path}")


def map_info(fd: int, name: str) -> MapInfo:
    """The kernel's description of map `name` (open as `fd`)."""
    info = _MapInfo()
    _bpf(
        BPF_OBJ_GET_INFO_BY_FD,
        _InfoAttr(fd, ct.sizeof(info), ct.cast(ct.pointer(info), ct.c_void_p).value or 0),
        f"reading the info of map {name}",
    )
    return MapInfo(
        info.type,
        info.id,
        info.key_size,
        info.value_size,
        info.max_entries,
        info.map_flags,
        info.name.decode(errors="replace"),
    )


def prog_info(fd: int, what: str = "a program") -> ProgInfo:
    info = _ProgInfo()
    ids = (ct.c_uint32 * _MAX_PROG_MAPS)()
    info.nr_map_ids = _MAX_PROG_MAPS
    info.map_ids = ct.addressof(ids)
    _bpf(
        BPF_OBJ_GET_INFO_BY_FD,
        _InfoAttr(fd, ct.sizeof(info), ct.cast(ct.pointer(info), ct.c_void_p).value or 0),
        f"reading the info of {what}",
    )
    return ProgInfo(
        info.id,
        info.type,
        info.name.decode(errors="replace"),
        bytes(info.tag).hex(),
        tuple(ids[: min(info.nr_map_ids, _MAX_PROG_MAPS)]),
        info.xlated_prog_len // 8,
        info.jited_prog_len,
    )


def prog_fd_by_id(prog_id: int) -> int:
    """Open program `prog_id`; BpfError with errno ENOENT when it is gone."""
    return _bpf(
        BPF_PROG_GET_FD_BY_ID, _GetFdByIdAttr(prog_id, 0, 0), f"opening program id {prog_id}"
    )


def prog_query(target_fd: int, attach_type: int, target: str) -> list[int]:
    """Ids of the programs attached to `target` (a cgroup, open as target_fd) for one
    attach type."""
    capacity = 64
    while True:
        ids = (ct.c_uint32 * capacity)()
        attr = _QueryAttr(
            target_fd, attach_type, 0, 0, ct.cast(ids, ct.c_void_p).value or 0, capacity
        )
        try:
            _bpf(BPF_PROG_QUERY, attr, f"listing programs attached to {target}")
        except BpfError as exc:
            if exc.errno == errno.ENOSPC:
                capacity *= 4
                continue
            raise
        return [ids[i] for i in range(attr.prog_cnt)]


def prog_attach(target_fd: int, prog_fd: int, attach_type: int, flags: int, what: str) -> None:
    """Attach a program to a cgroup (BPF_F_ALLOW_MULTI in `flags`: next to others)."""
    attr = _DetachAttr(target_fd, prog_fd, attach_type, flags, 0)
    _bpf(BPF_PROG_ATTACH, attr, f"attaching {what}")


def prog_detach(target_fd: int, prog_fd: int, attach_type: int, what: str) -> None:
    """Detach one specific program (needed for BPF_F_ALLOW_MULTI attachments)."""
    attr = _DetachAttr(target_fd, prog_fd, attach_type, 0, 0)
    _bpf(BPF_PROG_DETACH, attr, f"detaching {what}")


@dataclass(frozen=True, slots=True)
class ProgRunResult:
    retval: int  # what the program returned (the last repetition's)
    data: bytes  # the packet as the program left it
    duration_ns: int  # kernel-measured time per repetition (mean)


def prog_test_run(
    prog_fd: int, data: bytes, ctx: ct.Structure | None, repeat: int, what: str
) -> ProgRunResult:
    """Run a loaded program `repeat` times on a copy of `data` (each repetition sees the
    packet as the previous one left it), with an optional context (struct __sk_buff or
    xdp_md prefix); BpfError naming `what` when the kernel refuses."""
    data_in = ct.create_string_buffer(data, len(data))
    data_out = ct.create_string_buffer(max(len(data) + 256, 4096))
    attr = _TestRunAttr(
        prog_fd=prog_fd,
        data_size_in=len(data),
        data_size_out=len(data_out),
        data_in=ct.addressof(data_in),
        data_out=ct.addressof(data_out),
        repeat=repeat,
    )
    if ctx is not None:
        attr.ctx_size_in = ct.sizeof(ctx)
        attr.ctx_in = ct.addressof(ctx)
    _bpf(BPF_PROG_TEST_RUN, attr, f"running {what} on a test packet")
    return ProgRunResult(attr.retval, data_out.raw[: attr.data_size_out], attr.duration)


# Map elements. Keys, values and batch positions are addresses of buffers the caller owns
# (ctypes.addressof, numpy's .ctypes.data); each call returns 0 or the errno.


def _errno_of(cmd: int, attr: ct.Structure) -> int:
    if _libc.syscall(_NR_BPF, cmd, ct.byref(attr), ct.sizeof(attr)) < 0:
        return int(ct.get_errno())
    return 0


def lookup_elem(map_fd: int, key: int, value: int) -> int:
    """Copy the value of `key` to `value`; ENOENT when absent."""
    return _errno_of(BPF_MAP_LOOKUP_ELEM, _ElemAttr(map_fd, key, value, 0))


def update_elem(map_fd: int, key: int, value: int, flags: int = 0) -> int:
    """Write one element (flags: BPF_ANY 0, BPF_NOEXIST 1, BPF_EXIST 2)."""
    return _errno_of(BPF_MAP_UPDATE_ELEM, _ElemAttr(map_fd, key, value, flags))


def delete_elem(map_fd: int, key: int) -> int:
    """Delete one element; ENOENT when absent."""
    return _errno_of(BPF_MAP_DELETE_ELEM, _ElemAttr(map_fd, key, 0, 0))


def get_next_key(map_fd: int, key: int, next_key: int) -> int:
    """The key after `key` (key 0, a NULL pointer: the first) into `next_key`; ENOENT at
    the end."""
    return _errno_of(BPF_MAP_GET_NEXT_KEY, _ElemAttr(map_fd, key, next_key, 0))


def lookup_batch(
    map_fd: int, in_batch: int, out_batch: int, keys: int, values: int, count: int
) -> tuple[int, int]:
    """One BPF_MAP_LOOKUP_BATCH of at most `count` elements, starting after the position in
    `in_batch` (0: from the start), the next position written to `out_batch`; (errno or 0,
    elements copied). ENOENT means the map's end was reached (the copied ones are valid)."""
    attr = _BatchAttr(
        in_batch=in_batch,
        out_batch=out_batch,
        keys=keys,
        values=values,
        count=count,
        map_fd=map_fd,
    )
    err = _errno_of(BPF_MAP_LOOKUP_BATCH, attr)
    return err, int(attr.count)


def update_batch(map_fd: int, keys: int, values: int, count: int) -> tuple[int, int]:
    """One BPF_MAP_UPDATE_BATCH of `count` elements; (errno or 0, elements written: on a
    failure, those before the failing one)."""
    attr = _BatchAttr(keys=keys, values=values, count=count, map_fd=map_fd)
    err = _errno_of(BPF_MAP_UPDATE_BATCH, attr)
    return err, int(attr.count)


def possible_cpus() -> int:
    """How many CPUs the kernel may bring up: the number of values a per-CPU map element
    holds (/sys/devices/system/cpu/possible, e.g. "0-3" or "0,2-5")."""
    with open("/sys/devices/system/cpu/possible") as f:
        text = f.read().strip()
    total = 0
    for part in text.split(","):
        low, _, high = part.partition("-")
        total += int(high or low) - int(low) + 1
    return total
