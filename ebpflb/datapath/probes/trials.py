"""What each feature probe tries: a few hand-assembled instructions loaded as a program of
the hook's type, or a tiny map of the kind the agent creates, dropped at once. Each trial
returns when the kernel accepts it and raises BpfError (with the kernel's errno) when not.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable

from ebpflb.datapath.syscall import bpfsys, uapi
from ebpflb.datapath.syscall.uapi import MapType

Probe = Callable[[], None]


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def mov(dst: int, imm: int) -> bytes:
    return insn(0xB7, dst=dst, imm=imm)  # BPF_ALU64 | BPF_MOV | BPF_K


def call(helper: int) -> bytes:
    return insn(0x85, imm=helper)  # BPF_JMP | BPF_CALL


EXIT = insn(0x95)  # BPF_JMP | BPF_EXIT


def load(prog_type: int, code: bytes, what: str, attach_type: int = 0) -> Probe:
    def probe() -> None:
        os.close(bpfsys.prog_load(prog_type, code, what, attach_type, name="ebpflb_probe"))

    return probe


def sock_addr(attach_type: int, what: str, code: bytes = mov(0, 1) + EXIT) -> Probe:
    return load(uapi.BPF_PROG_TYPE_CGROUP_SOCK_ADDR, code, what, attach_type)


def new_map(map_type: int, what: str, flags: int = 0) -> Probe:
    def probe() -> None:
        os.close(bpfsys.map_create(map_type, 4, 8, 1, what, flags))

    return probe


def inner_map() -> None:
    """An array that may sit in a map of maps whatever its size (BPF_F_INNER_MAP), held
    by a one-slot array of maps: how the slot pool and conntrack grow (maps/growable.py)."""
    inner = bpfsys.map_create(
        MapType.ARRAY, 4, 8, 2, "a probe inner array", uapi.BPF_F_MMAPABLE | uapi.BPF_F_INNER_MAP
    )
    try:
        outer = bpfsys.map_create(
            MapType.ARRAY_OF_MAPS, 4, 4, 1, "a probe array of maps", inner_map_fd=inner
        )
        os.close(outer)
    finally:
        os.close(inner)


def batch_ops() -> None:
    fd = bpfsys.map_create(MapType.HASH, 4, 4, 1, "a probe hash map")
    try:
        bpfsys.map_lookup_batch(fd, 4, 4, 1, "a probe hash map")
    except bpfsys.BpfError as exc:
        if exc.errno != errno.ENOENT:  # ENOENT: the command ran and found the map empty
            raise
    finally:
        os.close(fd)


def int_btf() -> bytes:
    """A BTF blob with one type, id 1: a 32-bit signed int (uapi/linux/btf.h)."""
    strings = b"\0int\0"
    types = struct.pack("<III", 1, 1 << 24, 4) + struct.pack("<I", (1 << 24) | 32)
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return header + types + strings


def sk_storage_map() -> int:
    """A socket storage map (int key and value, BTF-described as the kernel demands)."""
    btf = bpfsys.btf_load(int_btf(), "probe BTF")
    try:
        return bpfsys.map_create(
            MapType.SK_STORAGE, 4, 4, 0, "a probe socket storage", uapi.BPF_F_NO_PREALLOC, btf, 1, 1
        )
    finally:
        os.close(btf)


def sk_storage() -> None:
    os.close(sk_storage_map())


def ld_map_fd(dst: int, fd: int) -> bytes:
    """r`dst` = the map `fd` (BPF_LD | BPF_IMM | BPF_DW with BPF_PSEUDO_MAP_FD: two slots)."""
    return insn(uapi.BPF_LD_IMM64, dst=dst, src=uapi.BPF_PSEUDO_MAP_FD, imm=fd) + insn(0)


def sk_storage_in_sock_addr() -> None:
    """A connect4 program calling bpf_sk_storage_get(map, ctx->sk, NULL, 0)."""
    fd = sk_storage_map()
    try:
        code = (
            insn(0x79, dst=2, src=1, off=uapi.SOCK_ADDR_SK_OFFSET)  # r2 = ctx->sk (u64 load)
            + ld_map_fd(1, fd)
            + mov(3, 0)
            + mov(4, 0)
            + call(uapi.BPF_FUNC_SK_STORAGE_GET)
            + mov(0, 1)
            + EXIT
        )
        what = "a probe program calling bpf_sk_storage_get"
        sock_addr(uapi.BPF_CGROUP_INET4_CONNECT, what, code)()
    finally:
        os.close(fd)


def links() -> None:
    prog = bpfsys.prog_load(
        uapi.BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
        mov(0, 1) + EXIT,
        "a probe connect4 program",
        uapi.BPF_CGROUP_INET4_CONNECT,
        name="ebpflb_probe",
    )
    try:
        # No target (fd -1): a kernel with links answers EBADF, one without EINVAL. Nothing
        # is ever attached.
        os.close(bpfsys.link_create(prog, -1, uapi.BPF_CGROUP_INET4_CONNECT, "a probe program"))
    except bpfsys.BpfError as exc:
        if exc.errno != errno.EBADF:
            raise
    finally:
        os.close(prog)
