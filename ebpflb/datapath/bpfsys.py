"""The few bpf(2) commands BCC's Python API does not offer, called through ctypes.

BCC creates, loads and attaches; what it lacks is opening a pin by path (for `maps dump`
and restarts without compiling), reading an object's kernel-side info (to check a pin's
layout and find our programs by name), and listing/detaching what a cgroup has attached
(for cleanup and restarts of another process's programs). Map element operations use
libbcc's exported wrappers (bcc.libbcc.lib).
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
from dataclasses import dataclass

_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long

_NR_BPF = {"x86_64": 321, "aarch64": 280}[os.uname().machine]

BPF_PROG_DETACH = 9
BPF_PROG_GET_FD_BY_ID = 13
BPF_MAP_GET_FD_BY_ID = 14
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_QUERY = 16
BPF_OBJ_GET = 7

BPF_MAP_TYPE_NAMES = {
    1: "hash",
    2: "array",
    6: "percpu_array",
    9: "lru_hash",
    11: "lpm_trie",
}


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


class _DetachAttr(ct.Structure):
    _fields_ = [
        ("target_fd", ct.c_uint32),
        ("attach_bpf_fd", ct.c_uint32),
        ("attach_type", ct.c_uint32),
        ("attach_flags", ct.c_uint32),
        ("replace_bpf_fd", ct.c_uint32),
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


@dataclass(frozen=True, slots=True)
class MapInfo:
    type: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    name: str

    @property
    def type_name(self) -> str:
        return BPF_MAP_TYPE_NAMES.get(self.type, str(self.type))


@dataclass(frozen=True, slots=True)
class ProgInfo:
    id: int
    type: int
    name: str


def _bpf(cmd: int, attr: ct.Structure) -> int:
    ret = _libc.syscall(_NR_BPF, cmd, ct.byref(attr), ct.sizeof(attr))
    if ret < 0:
        err = ct.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


def obj_get(path: str) -> int:
    """Open a pinned map or program; the caller owns (and closes) the fd."""
    raw = ct.create_string_buffer(os.fsencode(path))
    attr = _ObjGetAttr(ct.cast(raw, ct.c_void_p).value or 0, 0, 0)
    return _bpf(BPF_OBJ_GET, attr)


def map_info(fd: int) -> MapInfo:
    info = _MapInfo()
    _bpf(
        BPF_OBJ_GET_INFO_BY_FD,
        _InfoAttr(fd, ct.sizeof(info), ct.cast(ct.pointer(info), ct.c_void_p).value or 0),
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


def prog_info(fd: int) -> ProgInfo:
    info = _ProgInfo()
    _bpf(
        BPF_OBJ_GET_INFO_BY_FD,
        _InfoAttr(fd, ct.sizeof(info), ct.cast(ct.pointer(info), ct.c_void_p).value or 0),
    )
    return ProgInfo(info.id, info.type, info.name.decode(errors="replace"))


def prog_fd_by_id(prog_id: int) -> int:
    return _bpf(BPF_PROG_GET_FD_BY_ID, _GetFdByIdAttr(prog_id, 0, 0))


def prog_query(target_fd: int, attach_type: int) -> list[int]:
    """Ids of the programs attached to a cgroup (or other target) for one attach type."""
    capacity = 64
    while True:
        ids = (ct.c_uint32 * capacity)()
        attr = _QueryAttr(
            target_fd, attach_type, 0, 0, ct.cast(ids, ct.c_void_p).value or 0, capacity
        )
        try:
            _bpf(BPF_PROG_QUERY, attr)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                capacity *= 4
                continue
            raise
        return [ids[i] for i in range(attr.prog_cnt)]


def prog_detach(target_fd: int, prog_fd: int, attach_type: int) -> None:
    """Detach one specific program (needed for BPF_F_ALLOW_MULTI attachments)."""
    _bpf(BPF_PROG_DETACH, _DetachAttr(target_fd, prog_fd, attach_type, 0, 0))
