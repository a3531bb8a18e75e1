"""Typed map entries <-> the C structs (ebpflb.datapath.contract), the only place byte
order is converted.

Fields the C side types __be16/__be32 hold network byte order (each struct mirror names
them in `_network_order_`): the encode_*/decode_* functions below are the only code that
converts them.

The maps a sync writes and a full resync reads in bulk also have numpy records, derived
from the ctypes mirrors (`record_dtype`), with functions that convert whole arrays at once:
a start writes, and every resync reads, 500,000 entries at 100,000 services, and
element-wise ctypes conversion costs several microseconds each.

Over 400 lines on purpose: one converter pair per struct, both address families; split,
the byte-order conversions would be scattered again.
"""

from __future__ import annotations

import ctypes as ct
import socket
import struct
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from ebpflb.datapath.contract import (
    SRC_RANGE_ID_PREFIXLEN,
    SVC_NAME_LEN,
    Addr6,
    AffMatchKey,
    Ct4Entry,
    Ct6Entry,
    CtFlags,
    Flow4,
    Flow6,
    Lb4Backend,
    Lb4RevskKey,
    Lb4RevskVal,
    Lb4SvcKey,
    Lb6Backend,
    Lb6RevskKey,
    Lb6RevskVal,
    Lb6SvcKey,
    LbSvcMeta,
    LbSvcVal,
    NatFlags,
    Rnat4Val,
    Rnat6Val,
    SrcRange4Key,
    SrcRange6Key,
)
from ebpflb.datapath.maps import (
    AddrPort,
    AffinityMatch,
    BackendEntry,
    ConntrackEntry,
    Flow,
    NatEntry,
    ServiceEntry,
    SourceRange,
)
from ebpflb.model import Backend, BackendFlags, Frontend, IPAddress, Proto, Scope, SvcFlags


def addr_to_be32(address: IPv4Address) -> int:
    """IPv4 address -> the host-order int whose memory bytes are the network-order address."""
    return int.from_bytes(address.packed, "little")


def be32_to_addr(value: int) -> IPv4Address:
    return IPv4Address(value.to_bytes(4, "little"))


def v4(address: IPAddress) -> IPv4Address:
    """An address bound for an IPv4 map; TypeError for an IPv6 one (a routing bug)."""
    if not isinstance(address, IPv4Address):
        raise TypeError(f"{address} is not an IPv4 address")
    return address


def v6(address: IPAddress) -> IPv6Address:
    """An address bound for an IPv6 map; TypeError for an IPv4 one (a routing bug)."""
    if not isinstance(address, IPv6Address):
        raise TypeError(f"{address} is not an IPv6 address")
    return address


def addr_to_be32x4(address: IPv6Address) -> tuple[int, int, int, int]:
    """IPv6 address -> the four host-order ints of a __be32[4] whose memory bytes are the
    network-order address."""
    a, b, c, d = struct.unpack("=4I", address.packed)
    return a, b, c, d


def be32x4_to_addr(words: Sequence[int]) -> IPv6Address:
    return IPv6Address(struct.pack("=4I", *words))


def port_to_be16(port: int) -> int:
    return socket.htons(port)


def be16_to_port(value: int) -> int:
    return socket.ntohs(value)


def encode_frontend(frontend: Frontend) -> Lb4SvcKey:
    return Lb4SvcKey(
        addr_to_be32(v4(frontend.address)),
        port_to_be16(frontend.port),
        int(frontend.protocol),
        int(frontend.scope),
    )


def decode_frontend(key: Lb4SvcKey) -> Frontend:
    return Frontend(
        be32_to_addr(key.addr), be16_to_port(key.port), Proto(key.proto), Scope(key.scope)
    )


def encode_service(entry: ServiceEntry) -> LbSvcVal:
    return LbSvcVal(
        entry.svc_id, entry.table_off, entry.table_size, entry.backend_count, int(entry.flags)
    )


def decode_service(val: LbSvcVal) -> ServiceEntry:
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
        addr_to_be32(v4(backend.address)),
        port_to_be16(backend.port),
        int(backend.protocol),
        int(entry.flags),
    )


def decode_backend(val: Lb4Backend) -> BackendEntry:
    backend = Backend(be32_to_addr(val.addr), be16_to_port(val.port), Proto(val.proto))
    return BackendEntry(backend, BackendFlags(val.flags))


def encode_frontend6(frontend: Frontend) -> Lb6SvcKey:
    return Lb6SvcKey(
        addr_to_be32x4(v6(frontend.address)),
        port_to_be16(frontend.port),
        int(frontend.protocol),
        int(frontend.scope),
    )


def decode_frontend6(key: Lb6SvcKey) -> Frontend:
    return Frontend(
        be32x4_to_addr(key.addr), be16_to_port(key.port), _proto(key.proto), _scope(key.scope)
    )


def encode_backend6(entry: BackendEntry) -> Lb6Backend:
    backend = entry.backend
    return Lb6Backend(
        addr_to_be32x4(v6(backend.address)),
        port_to_be16(backend.port),
        int(backend.protocol),
        int(entry.flags),
    )


def decode_backend6(val: Lb6Backend) -> BackendEntry:
    backend = Backend(be32x4_to_addr(val.addr), be16_to_port(val.port), _proto(val.proto))
    return BackendEntry(backend, _flags(BackendFlags, val.flags))


def decode_reverse(
    key: Lb4RevskKey | Lb6RevskKey, val: Lb4RevskVal | Lb6RevskVal
) -> tuple[IPAddress, int, IPAddress, int]:
    """A socket-LB reverse entry (ebpflb_revsk4 or ebpflb_revsk6): (backend address,
    port, frontend address, port)."""
    if isinstance(key, Lb6RevskKey) and isinstance(val, Lb6RevskVal):
        backend: IPAddress = be32x4_to_addr(key.addr)
        frontend: IPAddress = be32x4_to_addr(val.addr)
    else:
        backend, frontend = be32_to_addr(key.addr), be32_to_addr(val.addr)
    return backend, be16_to_port(key.port), frontend, be16_to_port(val.port)


def encode_meta(name: str) -> LbSvcMeta:
    raw = name.encode()
    if len(raw) >= SVC_NAME_LEN:
        # Kubernetes bounds namespace, name and port name, so only a bug gets here.
        raise ValueError(f"service name {name!r} exceeds {SVC_NAME_LEN - 1} bytes")
    return LbSvcMeta(raw)


def decode_meta(val: LbSvcMeta) -> str:
    return bytes(val.name).decode(errors="replace")


def _svc_id_to_lpm(svc_id: int) -> int:
    # LPM matches bytes in order: the service id is stored big-endian so that the first
    # 32 bits of the prefix are exactly the id.
    return int.from_bytes(svc_id.to_bytes(4, "big"), "little")


def _svc_id_from_lpm(raw: int) -> int:
    return int.from_bytes(raw.to_bytes(4, "little"), "big")


def _net4(network: IPv4Network | IPv6Network) -> IPv4Network:
    if not isinstance(network, IPv4Network):
        raise TypeError(f"{network} is not an IPv4 network")
    return network


def _net6(network: IPv4Network | IPv6Network) -> IPv6Network:
    if not isinstance(network, IPv6Network):
        raise TypeError(f"{network} is not an IPv6 network")
    return network


def encode_source_range(key: SourceRange) -> SrcRange4Key:
    network = _net4(key.network)
    return SrcRange4Key(
        SRC_RANGE_ID_PREFIXLEN + network.prefixlen,
        _svc_id_to_lpm(key.svc_id),
        addr_to_be32(network.network_address),
    )


def decode_source_range(raw: SrcRange4Key) -> SourceRange:
    prefixlen = raw.prefixlen - SRC_RANGE_ID_PREFIXLEN
    return SourceRange(
        _svc_id_from_lpm(raw.svc_id), IPv4Network((be32_to_addr(raw.addr), prefixlen))
    )


def encode_source_range6(key: SourceRange) -> SrcRange6Key:
    network = _net6(key.network)
    return SrcRange6Key(
        SRC_RANGE_ID_PREFIXLEN + network.prefixlen,
        _svc_id_to_lpm(key.svc_id),
        addr_to_be32x4(network.network_address),
    )


def decode_source_range6(raw: SrcRange6Key) -> SourceRange:
    prefixlen = raw.prefixlen - SRC_RANGE_ID_PREFIXLEN
    return SourceRange(
        _svc_id_from_lpm(raw.svc_id), IPv6Network((be32x4_to_addr(raw.addr), prefixlen))
    )


def encode_affinity_match(key: AffinityMatch) -> AffMatchKey:
    return AffMatchKey(key.svc_id, key.backend_id)


def decode_affinity_match(raw: AffMatchKey) -> AffinityMatch:
    return AffinityMatch(int(raw.svc_id), int(raw.backend_id))


def _addr_port(addr: int, port: int) -> AddrPort:
    return AddrPort(be32_to_addr(addr), be16_to_port(port))


def encode_flow(flow: Flow) -> Flow4:
    return Flow4(
        addr_to_be32(v4(flow.source.address)),
        addr_to_be32(v4(flow.destination.address)),
        port_to_be16(flow.source.port),
        port_to_be16(flow.destination.port),
        int(flow.protocol),
    )


def decode_flow(raw: Flow4) -> Flow:
    return Flow(
        _addr_port(raw.saddr, raw.sport), _addr_port(raw.daddr, raw.dport), _proto(raw.proto)
    )


def encode_conntrack(entry: ConntrackEntry) -> Ct4Entry:
    snat = entry.snat or AddrPort(IPv4Address(0), 0)
    return Ct4Entry(
        backend_addr=addr_to_be32(v4(entry.backend.address)),
        backend_port=port_to_be16(entry.backend.port),
        flags=int(entry.flags),
        nat_addr=addr_to_be32(v4(snat.address)),
        nat_port=port_to_be16(snat.port),
        svc_id=entry.svc_id,
        backend_id=entry.backend_id,
        expires=entry.expires_ns,
        packets=entry.packets,
        bytes=entry.bytes,
    )


def decode_conntrack(raw: Ct4Entry) -> ConntrackEntry:
    flags = CtFlags(raw.flags)
    return ConntrackEntry(
        backend=_addr_port(raw.backend_addr, raw.backend_port),
        flags=flags,
        snat=_addr_port(raw.nat_addr, raw.nat_port) if flags & CtFlags.SNAT else None,
        svc_id=raw.svc_id,
        backend_id=raw.backend_id,
        expires_ns=raw.expires,
        packets=raw.packets,
        bytes=raw.bytes,
    )


def encode_nat(entry: NatEntry) -> Rnat4Val:
    return Rnat4Val(
        client_addr=addr_to_be32(v4(entry.client.address)),
        frontend_addr=addr_to_be32(v4(entry.frontend.address)),
        client_port=port_to_be16(entry.client.port),
        frontend_port=port_to_be16(entry.frontend.port),
        flags=int(entry.flags),
        expires=entry.expires_ns,
    )


def decode_nat(raw: Rnat4Val) -> NatEntry:
    return NatEntry(
        client=_addr_port(raw.client_addr, raw.client_port),
        frontend=_addr_port(raw.frontend_addr, raw.frontend_port),
        flags=NatFlags(raw.flags),
        expires_ns=raw.expires,
    )


def _addr_port6(addr: Sequence[int], port: int) -> AddrPort:
    return AddrPort(be32x4_to_addr(addr), be16_to_port(port))


def encode_flow6(flow: Flow) -> Flow6:
    return Flow6(
        addr_to_be32x4(v6(flow.source.address)),
        addr_to_be32x4(v6(flow.destination.address)),
        port_to_be16(flow.source.port),
        port_to_be16(flow.destination.port),
        int(flow.protocol),
    )


def decode_flow6(raw: Flow6) -> Flow:
    return Flow(
        _addr_port6(raw.saddr, raw.sport),
        _addr_port6(raw.daddr, raw.dport),
        _proto(raw.proto),
    )


def encode_conntrack6(entry: ConntrackEntry) -> Ct6Entry:
    snat = entry.snat or AddrPort(IPv6Address(0), 0)
    return Ct6Entry(
        backend_addr=addr_to_be32x4(v6(entry.backend.address)),
        nat_addr=addr_to_be32x4(v6(snat.address)),
        backend_port=port_to_be16(entry.backend.port),
        flags=int(entry.flags),
        nat_port=port_to_be16(snat.port),
        svc_id=entry.svc_id,
        backend_id=entry.backend_id,
        expires=entry.expires_ns,
        packets=entry.packets,
        bytes=entry.bytes,
    )


def decode_conntrack6(raw: Ct6Entry) -> ConntrackEntry:
    flags = CtFlags(raw.flags)
    return ConntrackEntry(
        backend=_addr_port6(raw.backend_addr, raw.backend_port),
        flags=flags,
        snat=_addr_port6(raw.nat_addr, raw.nat_port) if flags & CtFlags.SNAT else None,
        svc_id=raw.svc_id,
        backend_id=raw.backend_id,
        expires_ns=raw.expires,
        packets=raw.packets,
        bytes=raw.bytes,
    )


def encode_nat6(entry: NatEntry) -> Rnat6Val:
    return Rnat6Val(
        client_addr=addr_to_be32x4(v6(entry.client.address)),
        frontend_addr=addr_to_be32x4(v6(entry.frontend.address)),
        client_port=port_to_be16(entry.client.port),
        frontend_port=port_to_be16(entry.frontend.port),
        flags=int(entry.flags),
        expires=entry.expires_ns,
    )


def decode_nat6(raw: Rnat6Val) -> NatEntry:
    return NatEntry(
        client=_addr_port6(raw.client_addr, raw.client_port),
        frontend=_addr_port6(raw.frontend_addr, raw.frontend_port),
        flags=NatFlags(raw.flags),
        expires_ns=raw.expires,
    )


def encode_addr6(address: IPv6Address) -> Addr6:
    """Value of ebpflb_ifaddr6."""
    return Addr6(addr_to_be32x4(address))


def decode_addr6(raw: Addr6) -> IPv6Address:
    return be32x4_to_addr(raw.addr)


# ---- numpy mirrors, for many elements at once ---------------------------------------------

Records = npt.NDArray[Any]  # a structured array of one of the dtypes below
F = TypeVar("F", SvcFlags, BackendFlags)


def record_dtype(struct: type[ct.Structure]) -> np.dtype[Any]:
    """The numpy record of a struct mirror: its fields at their ctypes offsets.
    Network-order fields are read as big-endian, which gives host-order values directly."""
    network: tuple[str, ...] = getattr(struct, "_network_order_", ())
    formats: list[np.dtype[Any]] = []
    for field in struct._fields_:
        name, ctype = field[0], cast(Any, field[1])
        element: Any = ctype._type_ if issubclass(ctype, ct.Array) else ctype
        if element is ct.c_char:
            formats.append(np.dtype(f"S{ctype._length_}"))
            continue
        kind = np.dtype(element).newbyteorder(">" if name in network else "=")
        formats.append(np.dtype((kind, (ctype._length_,))) if element is not ctype else kind)
    names = [name for name, *_ in struct._fields_]
    return np.dtype(
        {
            "names": names,
            "formats": formats,
            "offsets": [getattr(struct, name).offset for name in names],
            "itemsize": ct.sizeof(struct),
        }
    )


U32_DTYPE = np.dtype("=u4")
SVC_KEY_DTYPE = record_dtype(Lb4SvcKey)
SVC_VAL_DTYPE = record_dtype(LbSvcVal)
BACKEND_DTYPE = record_dtype(Lb4Backend)
META_DTYPE = record_dtype(LbSvcMeta)

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


def _nonzero(values: bytes, count: int, value_size: int) -> npt.NDArray[np.bool_]:
    """Which of `count` contiguous values hold a non-zero byte (an array element written)."""
    rows = np.frombuffer(values, dtype=np.uint8, count=count * value_size)
    return cast(npt.NDArray[np.bool_], rows.reshape(count, value_size).any(axis=1))


def drop_zero_values(
    keys: bytes, values: bytes, count: int, value_size: int
) -> tuple[bytes, bytes, int]:
    """The (keys, values, count) of a whole-array read without its all-zero elements (never
    written, or cleared: an array cannot delete)."""
    if not count:
        return keys, values, 0
    kept = _nonzero(values, count, value_size)
    key_size = len(keys) // count
    key_rows = np.frombuffer(keys, dtype=np.uint8, count=count * key_size).reshape(count, -1)
    value_rows = np.frombuffer(values, dtype=np.uint8, count=count * value_size)
    value_rows = value_rows.reshape(count, value_size)
    return key_rows[kept].tobytes(), value_rows[kept].tobytes(), int(kept.sum())


def count_nonzero_values(values: bytes, count: int, value_size: int) -> int:
    return int(_nonzero(values, count, value_size).sum()) if count else 0
