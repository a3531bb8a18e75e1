"""ctypes mirrors of bpf/lib/structs.h and the only place byte order is converted.

Each class mirrors one C struct field for field; tests/kernel/test_layout.py compares
their sizes and offsets with the Key/Leaf types BCC generates from the C source. Fields
the C side types __be16/__be32 hold network byte order: the encode_*/decode_* functions
below are the only code that converts.

The maps a sync writes and a full resync reads in bulk also have numpy mirrors (the
*_DTYPE records, checked against the ctypes ones by the unit tests) with functions that
convert whole arrays at once: a start writes, and every resync reads, 500,000 entries at
100,000 services, and element-wise ctypes conversion costs several microseconds each.
"""

from __future__ import annotations

import ctypes as ct
import enum
import socket
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ebpflb.datapath.maps import BackendEntry, ServiceEntry, SourceRange
from ebpflb.model import Backend, BackendFlags, Frontend, Proto, Scope, SvcFlags

SVC_NAME_LEN = 144  # EBPFLB_SVC_NAME_LEN in bpf/lib/consts.h
MAX_IFACES = 64  # EBPFLB_MAX_IFACES in bpf/lib/consts.h


class Lb4SvcKey(ct.Structure):
    """Must match struct lb4_svc_key in bpf/lib/structs.h."""

    _fields_ = [
        ("addr", ct.c_uint32),
        ("port", ct.c_uint16),
        ("proto", ct.c_uint8),
        ("scope", ct.c_uint8),
    ]


class Lb4SvcVal(ct.Structure):
    """Must match struct lb4_svc_val in bpf/lib/structs.h."""

    _fields_ = [
        ("svc_id", ct.c_uint32),
        ("table_off", ct.c_uint32),
        ("table_size", ct.c_uint32),
        ("backend_count", ct.c_uint16),
        ("flags", ct.c_uint16),
    ]


class Lb4SlotPair(ct.Structure):
    """Must match struct lb4_slot_pair in bpf/lib/structs.h."""

    _fields_ = [("backend_id", ct.c_uint32 * 2)]


class Lb4Backend(ct.Structure):
    """Must match struct lb4_backend in bpf/lib/structs.h."""

    _fields_ = [
        ("addr", ct.c_uint32),
        ("port", ct.c_uint16),
        ("proto", ct.c_uint8),
        ("flags", ct.c_uint8),
    ]


class Lb4SvcMeta(ct.Structure):
    """Must match struct lb4_svc_meta in bpf/lib/structs.h."""

    _fields_ = [("name", ct.c_char * SVC_NAME_LEN)]


class Lb4RevskKey(ct.Structure):
    """Must match struct lb4_revsk_key in bpf/lib/structs.h."""

    _fields_ = [
        ("cookie", ct.c_uint64),
        ("addr", ct.c_uint32),
        ("port", ct.c_uint16),
        ("pad", ct.c_uint16),
    ]


class Lb4RevskVal(ct.Structure):
    """Must match struct lb4_revsk_val in bpf/lib/structs.h."""

    _fields_ = [
        ("addr", ct.c_uint32),
        ("port", ct.c_uint16),
        ("pad", ct.c_uint16),
    ]


class Flow4(ct.Structure):
    """Must match struct flow4 in bpf/lib/structs.h."""

    _fields_ = [
        ("saddr", ct.c_uint32),
        ("daddr", ct.c_uint32),
        ("sport", ct.c_uint16),
        ("dport", ct.c_uint16),
        ("proto", ct.c_uint8),
        ("pad", ct.c_uint8 * 3),
    ]


class Ct4Entry(ct.Structure):
    """Must match struct ct4_entry in bpf/lib/structs.h."""

    _fields_ = [
        ("backend_addr", ct.c_uint32),
        ("backend_port", ct.c_uint16),
        ("flags", ct.c_uint16),
        ("nat_addr", ct.c_uint32),
        ("nat_port", ct.c_uint16),
        ("pad", ct.c_uint16),
        ("svc_id", ct.c_uint32),
        ("backend_id", ct.c_uint32),
        ("expires", ct.c_uint64),
        ("packets", ct.c_uint64),
        ("bytes", ct.c_uint64),
    ]


class Rnat4Val(ct.Structure):
    """Must match struct rnat4_val in bpf/lib/structs.h."""

    _fields_ = [
        ("client_addr", ct.c_uint32),
        ("frontend_addr", ct.c_uint32),
        ("client_port", ct.c_uint16),
        ("frontend_port", ct.c_uint16),
        ("flags", ct.c_uint16),
        ("pad", ct.c_uint16),
        ("expires", ct.c_uint64),
    ]


class SrcRange4Key(ct.Structure):
    """Must match struct src_range4_key in bpf/lib/structs.h."""

    _fields_ = [
        ("prefixlen", ct.c_uint32),
        ("svc_id", ct.c_uint32),
        ("addr", ct.c_uint32),
    ]


class CtFlags(enum.IntFlag):
    """Mirrors CT_F_* in bpf/lib/consts.h."""

    SNAT = 1 << 0
    REPLY_SEEN = 1 << 1
    CLOSING = 1 << 2
    ESTABLISHED = 1 << 3


RNAT_F_SNAT = 1 << 0  # RNAT_F_SNAT in bpf/lib/consts.h


class Counter(enum.IntEnum):
    """Indexes of the per-CPU ebpflb_stats array: mirrors STAT_* in bpf/lib/consts.h."""

    CONNECT_XLATED = 0
    SENDMSG_XLATED = 1
    RECVMSG_XLATED = 2
    PEER_XLATED = 3
    NO_BACKEND = 4
    SLOT_MISS = 5
    REVSK_UPDATE_FAIL = 6
    NP_NEW_FLOW = 7
    NP_FWD = 8
    NP_REPLY = 9
    NP_NO_BACKEND = 10
    SNAT_EXHAUSTED = 11
    SRC_RANGE_DROP = 12
    CT_CREATE_FAIL = 13
    FRAGMENT = 14
    FIB_FAIL = 15


STATS_SIZE = 24  # STAT_MAX


def addr_to_be32(address: IPv4Address) -> int:
    """IPv4 address -> the host-order int whose memory bytes are the network-order address."""
    return int.from_bytes(address.packed, "little")


def be32_to_addr(value: int) -> IPv4Address:
    return IPv4Address(value.to_bytes(4, "little"))


def port_to_be16(port: int) -> int:
    return socket.htons(port)


def be16_to_port(value: int) -> int:
    return socket.ntohs(value)


def encode_frontend(frontend: Frontend) -> Lb4SvcKey:
    return Lb4SvcKey(
        addr_to_be32(frontend.address),
        port_to_be16(frontend.port),
        int(frontend.protocol),
        int(frontend.scope),
    )


def decode_frontend(key: Lb4SvcKey) -> Frontend:
    return Frontend(
        be32_to_addr(key.addr), be16_to_port(key.port), Proto(key.proto), Scope(key.scope)
    )


def encode_service(entry: ServiceEntry) -> Lb4SvcVal:
    return Lb4SvcVal(
        entry.svc_id, entry.table_off, entry.table_size, entry.backend_count, int(entry.flags)
    )


def decode_service(val: Lb4SvcVal) -> ServiceEntry:
    return ServiceEntry(
        svc_id=val.svc_id,
        table_off=val.table_off,
        table_size=val.table_size,
        backend_count=val.backend_count,
        flags=SvcFlags(val.flags),
    )


def encode_backend(entry: BackendEntry) -> Lb4Backend:
    backend = entry.backend
    return Lb4Backend(
        addr_to_be32(backend.address),
        port_to_be16(backend.port),
        int(backend.protocol),
        int(entry.flags),
    )


def decode_backend(val: Lb4Backend) -> BackendEntry:
    backend = Backend(be32_to_addr(val.addr), be16_to_port(val.port), Proto(val.proto))
    return BackendEntry(backend, BackendFlags(val.flags))


def encode_meta(name: str) -> Lb4SvcMeta:
    raw = name.encode()
    if len(raw) >= SVC_NAME_LEN:
        # Kubernetes bounds namespace, name and port name, so only a bug gets here.
        raise ValueError(f"service name {name!r} exceeds {SVC_NAME_LEN - 1} bytes")
    return Lb4SvcMeta(raw)


def decode_meta(val: Lb4SvcMeta) -> str:
    return bytes(val.name).decode(errors="replace")


def encode_source_range(key: SourceRange) -> SrcRange4Key:
    # LPM matches bytes in order: the service id is stored big-endian so that the first
    # 32 bits of the prefix are exactly the id.
    return SrcRange4Key(
        32 + key.network.prefixlen,
        int.from_bytes(key.svc_id.to_bytes(4, "big"), "little"),
        addr_to_be32(key.network.network_address),
    )


def decode_source_range(raw: SrcRange4Key) -> SourceRange:
    svc_id = int.from_bytes(raw.svc_id.to_bytes(4, "little"), "big")
    return SourceRange(svc_id, IPv4Network((be32_to_addr(raw.addr), raw.prefixlen - 32)))


def format_flow(raw: Flow4) -> tuple[str, str]:
    """("ip:port", "ip:port") of a flow's source and destination."""
    return (
        f"{be32_to_addr(raw.saddr)}:{be16_to_port(raw.sport)}",
        f"{be32_to_addr(raw.daddr)}:{be16_to_port(raw.dport)}",
    )


def format_endpoint(addr: int, port: int) -> str:
    return f"{be32_to_addr(addr)}:{be16_to_port(port)}"


# ---- numpy mirrors, for many elements at once ---------------------------------------------

Records = npt.NDArray[Any]  # a structured array of one of the dtypes below
F = TypeVar("F", SvcFlags, BackendFlags)

U32_DTYPE = np.dtype("=u4")
# Network-order fields read as big-endian give host-order values directly.
SVC_KEY_DTYPE = np.dtype([("addr", ">u4"), ("port", ">u2"), ("proto", "u1"), ("scope", "u1")])
SVC_VAL_DTYPE = np.dtype(
    [
        ("svc_id", "=u4"),
        ("table_off", "=u4"),
        ("table_size", "=u4"),
        ("backend_count", "=u2"),
        ("flags", "=u2"),
    ]
)
BACKEND_DTYPE = np.dtype([("addr", ">u4"), ("port", ">u2"), ("proto", "u1"), ("flags", "u1")])
META_DTYPE = np.dtype([("name", f"S{SVC_NAME_LEN}")])

# Enum members by value: calling an enum class is slow, and flags take few values.
_PROTOS = {int(p): p for p in Proto}
_SCOPES = {int(s): s for s in Scope}
_FLAGS: dict[type[Any], dict[int, Any]] = {SvcFlags: {}, BackendFlags: {}}


def _proto(value: int) -> Proto:
    return _PROTOS[value] if value in _PROTOS else Proto(value)  # ValueError: not ours


def _scope(value: int) -> Scope:
    return _SCOPES[value] if value in _SCOPES else Scope(value)


def _flags(cls: type[F], value: int) -> F:
    cache: dict[int, F] = _FLAGS[cls]
    flags = cache.get(value)
    if flags is None:
        flags = cache[value] = cls(value)
    return flags


def u32s_to_array(values: Sequence[int]) -> Records:
    return np.array(values, dtype=U32_DTYPE)


def u32s_from_array(array: Records) -> list[int]:
    return [int(v) for v in array.tolist()]


def frontends_to_array(frontends: Sequence[Frontend]) -> Records:
    array = np.zeros(len(frontends), dtype=SVC_KEY_DTYPE)
    array["addr"] = [int(f.address) for f in frontends]
    array["port"] = [f.port for f in frontends]
    array["proto"] = [f.protocol for f in frontends]
    array["scope"] = [f.scope for f in frontends]
    return array


def frontends_from_array(array: Records) -> list[Frontend]:
    return [
        Frontend(IPv4Address(addr), port, _proto(proto), _scope(scope))
        for addr, port, proto, scope in array.tolist()
    ]


def services_to_array(entries: Sequence[ServiceEntry]) -> Records:
    array = np.zeros(len(entries), dtype=SVC_VAL_DTYPE)
    for field in ("svc_id", "table_off", "table_size", "backend_count", "flags"):
        array[field] = [getattr(e, field) for e in entries]
    return array


def services_from_array(array: Records) -> list[ServiceEntry]:
    return [
        ServiceEntry(svc_id, table_off, table_size, backend_count, _flags(SvcFlags, flags))
        for svc_id, table_off, table_size, backend_count, flags in array.tolist()
    ]


def backends_to_array(entries: Sequence[BackendEntry]) -> Records:
    array = np.zeros(len(entries), dtype=BACKEND_DTYPE)
    array["addr"] = [int(e.backend.address) for e in entries]
    array["port"] = [e.backend.port for e in entries]
    array["proto"] = [e.backend.protocol for e in entries]
    array["flags"] = [e.flags for e in entries]
    return array


def backends_from_array(array: Records) -> list[BackendEntry]:
    return [
        BackendEntry(Backend(IPv4Address(addr), port, _proto(proto)), _flags(BackendFlags, flags))
        for addr, port, proto, flags in array.tolist()
    ]


def metas_to_array(names: Sequence[str]) -> Records:
    raw = [name.encode() for name in names]
    too_long = next((n for n, r in zip(names, raw, strict=True) if len(r) >= SVC_NAME_LEN), None)
    if too_long is not None:
        raise ValueError(f"service name {too_long!r} exceeds {SVC_NAME_LEN - 1} bytes")
    array = np.zeros(len(names), dtype=META_DTYPE)
    array["name"] = raw
    return array


def metas_from_array(array: Records) -> list[str]:
    # A C string: up to the first NUL, as decode_meta reads it.
    return [raw.split(b"\0", 1)[0].decode(errors="replace") for raw in array["name"].tolist()]
