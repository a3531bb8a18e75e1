"""ctypes mirrors of bpf/lib/structs.h and the only place byte order is converted.

Each class mirrors one C struct field for field; tests/kernel/test_layout.py compares
their sizes and offsets with the Key/Leaf types BCC generates from the C source. Fields
the C side types __be16/__be32 hold network byte order: the encode_*/decode_* functions
below are the only code that converts.
"""

from __future__ import annotations

import ctypes as ct
import enum
import socket
from ipaddress import IPv4Address

from ebpflb.datapath.maps import BackendEntry, ReverseSockEntry, ServiceEntry
from ebpflb.model import Backend, BackendFlags, Frontend, Proto, Scope, SvcFlags

SVC_NAME_LEN = 144  # EBPFLB_SVC_NAME_LEN in bpf/lib/consts.h


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


class Counter(enum.IntEnum):
    """Indexes of the per-CPU ebpflb_stats array: mirrors STAT_* in bpf/lib/consts.h."""

    CONNECT_XLATED = 0
    SENDMSG_XLATED = 1
    RECVMSG_XLATED = 2
    PEER_XLATED = 3
    NO_BACKEND = 4
    SLOT_MISS = 5
    REVSK_UPDATE_FAIL = 6


STATS_SIZE = 8  # STAT_MAX


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


def decode_revsk(key: Lb4RevskKey, val: Lb4RevskVal) -> ReverseSockEntry:
    return ReverseSockEntry(
        cookie=key.cookie,
        backend_address=f"{be32_to_addr(key.addr)}:{be16_to_port(key.port)}",
        frontend_address=f"{be32_to_addr(val.addr)}:{be16_to_port(val.port)}",
    )
