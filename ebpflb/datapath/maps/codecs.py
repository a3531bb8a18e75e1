"""How each map's keys and values convert between typed Python values and the bytes the
kernel holds: one element through its ctypes mirror (contract/), many at once through
its numpy record where layout.py has one (the maps a sync writes and reads in bulk)."""

from __future__ import annotations

import ctypes as ct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from ipaddress import IPv6Address
from typing import Any, Generic, TypeVar

import numpy as np

from ebpflb.datapath import contract
from ebpflb.datapath.maps import (
    AffinityMatch,
    BackendEntry,
    ConntrackEntry,
    Flow,
    NatEntry,
    ServiceEntry,
    SourceRange,
    layout,
)
from ebpflb.model import Frontend

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Codec(Generic[T]):
    """One side (key or value) of a map."""

    ctype: contract.CType
    encode: Callable[[T], Any]
    decode: Callable[[Any], T]
    dtype: np.dtype[Any] | None = None
    encode_many: Callable[[Sequence[T]], layout.Records] | None = None
    decode_many: Callable[[layout.Records], list[T]] | None = None

    def to_buffer(self, values: Sequence[T]) -> layout.Records | ct.Array[Any]:
        """The values laid out as the kernel wants them, contiguous."""
        if self.encode_many is not None:
            return self.encode_many(values)
        return (self.ctype * len(values))(*(self.encode(v) for v in values))

    def from_bytes(self, raw: bytes, count: int, start: int = 0) -> list[T]:
        """`count` values laid out contiguously in `raw` from the `start`-th on."""
        size = ct.sizeof(self.ctype)
        if self.dtype is not None and self.decode_many is not None:
            records = np.frombuffer(raw, dtype=self.dtype, count=count, offset=start * size)
            return self.decode_many(records)
        return [
            self.decode(self.ctype.from_buffer_copy(raw, (start + i) * size)) for i in range(count)
        ]


def address_of(buffer: layout.Records | ct.Array[Any]) -> int:
    return buffer.ctypes.data if isinstance(buffer, np.ndarray) else ct.addressof(buffer)


U32: Codec[int] = Codec(
    ct.c_uint32,
    ct.c_uint32,
    lambda raw: int(raw.value),
    layout.U32_DTYPE,
    layout.u32s_to_array,
    layout.u32s_from_array,
)
U8: Codec[int] = Codec(ct.c_uint8, ct.c_uint8, lambda raw: int(raw.value))
FRONTEND: Codec[Frontend] = Codec(
    contract.Lb4SvcKey,
    layout.encode_frontend,
    layout.decode_frontend,
    layout.SVC_KEY_DTYPE,
    layout.frontends_to_array,
    layout.frontends_from_array,
)
SERVICE: Codec[ServiceEntry] = Codec(
    contract.LbSvcVal,
    layout.encode_service,
    layout.decode_service,
    layout.SVC_VAL_DTYPE,
    layout.services_to_array,
    layout.services_from_array,
)
BACKEND: Codec[BackendEntry] = Codec(
    contract.Lb4Backend,
    layout.encode_backend,
    layout.decode_backend,
    layout.BACKEND_DTYPE,
    layout.backends_to_array,
    layout.backends_from_array,
)
# IPv6 frontends and backends: few, so one element at a time (no numpy records).
FRONTEND6: Codec[Frontend] = Codec(
    contract.Lb6SvcKey, layout.encode_frontend6, layout.decode_frontend6
)
BACKEND6: Codec[BackendEntry] = Codec(
    contract.Lb6Backend, layout.encode_backend6, layout.decode_backend6
)
META: Codec[str] = Codec(
    contract.LbSvcMeta,
    layout.encode_meta,
    layout.decode_meta,
    layout.META_DTYPE,
    layout.metas_to_array,
    layout.metas_from_array,
)
SOURCE_RANGE: Codec[SourceRange] = Codec(
    contract.SrcRange4Key, layout.encode_source_range, layout.decode_source_range
)
FLOW: Codec[Flow] = Codec(contract.Flow4, layout.encode_flow, layout.decode_flow)
CONNTRACK: Codec[ConntrackEntry] = Codec(
    contract.Ct4Entry, layout.encode_conntrack, layout.decode_conntrack
)
NAT: Codec[NatEntry] = Codec(contract.Rnat4Val, layout.encode_nat, layout.decode_nat)
# The IPv6 twins: flows are read (dumps, stale UDP) far less often than a sync writes
# frontends, so one element at a time, as IPv4's.
SOURCE_RANGE6: Codec[SourceRange] = Codec(
    contract.SrcRange6Key, layout.encode_source_range6, layout.decode_source_range6
)
FLOW6: Codec[Flow] = Codec(contract.Flow6, layout.encode_flow6, layout.decode_flow6)
CONNTRACK6: Codec[ConntrackEntry] = Codec(
    contract.Ct6Entry, layout.encode_conntrack6, layout.decode_conntrack6
)
NAT6: Codec[NatEntry] = Codec(contract.Rnat6Val, layout.encode_nat6, layout.decode_nat6)
ADDR6: Codec[IPv6Address] = Codec(contract.Addr6, layout.encode_addr6, layout.decode_addr6)
AFFINITY_MATCH: Codec[AffinityMatch] = Codec(
    contract.AffMatchKey, layout.encode_affinity_match, layout.decode_affinity_match
)
