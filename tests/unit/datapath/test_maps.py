from __future__ import annotations

import ctypes as ct
from collections.abc import Callable
from ipaddress import IPv4Address, IPv6Address, IPv6Network
from typing import Any

import numpy as np
import pytest

from ebpflb.datapath import contract
from ebpflb.datapath.contract import SRC_RANGE_ID_PREFIXLEN, CtFlags, NatFlags
from ebpflb.datapath.maps import (
    AddrPort,
    BackendEntry,
    ConntrackEntry,
    Flow,
    NatEntry,
    ServiceEntry,
    SlotWrite,
    SourceRange,
    layout,
    slot_pairs,
)
from ebpflb.datapath.maps.fake import FakeMap, FakeSlotPool
from ebpflb.errors import MapFullError
from ebpflb.model import Backend, BackendFlags, Frontend, Proto, Scope, SvcFlags


def u32(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.uint32)


def test_a_table_is_written_in_whole_pairs_with_padding() -> None:
    keys, values = slot_pairs(4, u32(7, 8, 9), None)
    assert keys.tolist() == [2, 3] and values.tolist() == [7, 8, 9, 0]


def test_a_delta_writes_the_pairs_holding_changed_slots() -> None:
    keys, values = slot_pairs(4, u32(1, 2, 3, 4, 5), np.array([3, 2, 4]))
    assert keys.tolist() == [3, 4] and values.tolist() == [3, 4, 5, 0]


def test_tables_start_on_pairs() -> None:
    with pytest.raises(ValueError, match="not even"):
        slot_pairs(3, u32(1), None)


def test_fake_pool_round_trip() -> None:
    pool = FakeSlotPool("p", 16)
    pool.write(2, u32(5, 6, 7))
    pool.write(8, u32(9, 9, 9))
    pool.write(2, u32(5, 1, 7), np.array([1]))
    assert pool.read(2, 3).tolist() == [5, 1, 7]
    assert pool.read(8, 3).tolist() == [9, 9, 9]
    assert pool.array.tolist()[:12] == [0, 0, 5, 1, 7, 0, 0, 0, 9, 9, 9, 0]


def test_fake_put_many_writes_the_rest_and_names_the_failures() -> None:
    fake: FakeMap[int, str] = FakeMap("m", capacity=3)
    fake.failing = {2}
    failures = fake.put_many([(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")])
    assert fake.data == {1: "a", 3: "c", 4: "d"} and fake.batches == 1
    assert sorted(failures) == [1, 4]
    assert "injected" in str(failures[1])
    assert isinstance(failures[4], MapFullError) and "m is full (limit 3)" in str(failures[4])


def test_fake_pool_write_many_fails_only_the_writes_that_do_not_fit() -> None:
    pool = FakeSlotPool("p", 8)
    failures = pool.write_many([SlotWrite(0, u32(1, 2)), SlotWrite(6, u32(3, 4, 5))])
    assert list(failures) == [1] and "cannot write 3 slots at 6" in str(failures[1])
    assert pool.array.tolist() == [1, 2, 0, 0, 0, 0, 0, 0]


# ---- numpy mirrors of the map records (layout.py): same bytes as the ctypes ones ---------

FRONTENDS = [
    Frontend(IPv4Address("10.96.0.10"), 80, Proto.TCP),
    Frontend(IPv4Address("192.168.1.2"), 30080, Proto.UDP, Scope.INTERNAL),
]
SERVICES = [
    ServiceEntry(1, 0, 509, 3, SvcFlags.CLUSTER_IP),
    ServiceEntry(70000, 2**31, 131071, 1000, SvcFlags.NODE_PORT | SvcFlags.ETP_LOCAL),
]
BACKENDS = [
    BackendEntry(Backend(IPv4Address("10.244.1.11"), 8080, Proto.TCP)),
    BackendEntry(
        Backend(IPv4Address("255.1.2.3"), 65535, Proto.UDP),
        BackendFlags.LOCAL | BackendFlags.TERMINATING,
    ),
]


@pytest.mark.parametrize(
    ("ctype", "dtype"),
    [
        (contract.Lb4SvcKey, layout.SVC_KEY_DTYPE),
        (contract.LbSvcVal, layout.SVC_VAL_DTYPE),
        (contract.Lb4Backend, layout.BACKEND_DTYPE),
        (contract.LbSvcMeta, layout.META_DTYPE),
    ],
    ids=lambda t: getattr(t, "__name__", ""),
)
def test_numpy_mirrors_have_the_ctypes_layout(ctype: type, dtype: np.dtype) -> None:
    assert dtype.itemsize == ct.sizeof(ctype)
    assert dtype.names is not None
    for name, *_ in ctype._fields_:  # type: ignore[attr-defined]
        assert dtype.fields is not None and dtype.fields[name][1] == getattr(ctype, name).offset


@pytest.mark.parametrize(
    ("values", "encode", "to_array", "from_array"),
    [
        (FRONTENDS, layout.encode_frontend, layout.frontends_to_array, layout.frontends_from_array),
        (SERVICES, layout.encode_service, layout.services_to_array, layout.services_from_array),
        (BACKENDS, layout.encode_backend, layout.backends_to_array, layout.backends_from_array),
        (
            ["default/web:http", "kube-system/dns:"],
            layout.encode_meta,
            layout.metas_to_array,
            layout.metas_from_array,
        ),
        ([0, 1, 2**32 - 1], ct.c_uint32, layout.u32s_to_array, layout.u32s_from_array),
    ],
    ids=["frontend", "service", "backend", "meta", "u32"],
)
def test_array_conversions_write_the_bytes_of_the_element_ones(
    values: list[Any],
    encode: Callable[[Any], Any],
    to_array: Callable[[list[Any]], np.ndarray],
    from_array: Callable[[np.ndarray], list[Any]],
) -> None:
    array = to_array(values)
    assert array.tobytes() == b"".join(bytes(encode(v)) for v in values)
    assert from_array(array) == values


def test_a_name_too_long_for_the_meta_map_is_refused_in_bulk_too() -> None:
    with pytest.raises(ValueError, match="exceeds 143 bytes"):
        layout.metas_to_array(["ok", "x" * 144])


# ---- conntrack and NAT rows: typed values <-> the C structs ------------------------------

FLOW = Flow(
    AddrPort(IPv4Address("198.51.100.7"), 40001),
    AddrPort(IPv4Address("203.0.113.1"), 80),
    Proto.TCP,
)


@pytest.mark.parametrize(
    "entry",
    [
        ConntrackEntry(
            AddrPort(IPv4Address("10.244.2.21"), 8080),
            CtFlags.SNAT | CtFlags.CLOSING,
            AddrPort(IPv4Address("192.168.1.10"), 40123),
            svc_id=8,
            backend_id=2,
            expires_ns=2**63,
            packets=1,
            bytes=60,
        ),
        ConntrackEntry(
            AddrPort(IPv4Address("10.244.1.11"), 65535), CtFlags.REPLY_SEEN, None, 1, 1, 0, 0, 0
        ),
    ],
    ids=["snat", "local"],
)
def test_conntrack_rows_round_trip_in_network_order(entry: ConntrackEntry) -> None:
    raw = layout.encode_conntrack(entry)
    assert layout.decode_conntrack(raw) == entry
    assert bytes(raw)[:4] == entry.backend.address.packed  # network order in memory
    assert bytes(raw)[4:6] == entry.backend.port.to_bytes(2, "big")


def test_flows_and_nat_rows_round_trip() -> None:
    raw = layout.encode_flow(FLOW)
    assert bytes(raw) == (
        FLOW.source.address.packed
        + FLOW.destination.address.packed
        + (40001).to_bytes(2, "big")
        + (80).to_bytes(2, "big")
        + bytes([6, 0, 0, 0])
    )
    assert layout.decode_flow(raw) == FLOW
    nat = NatEntry(FLOW.source, FLOW.destination, NatFlags.SNAT, 123)
    assert layout.decode_nat(layout.encode_nat(nat)) == nat


def test_a_whole_array_read_leaves_out_elements_never_written_or_cleared() -> None:
    # ebpflb_be4 is an array: ids 1 and 3 written, 0 and 2 all zero (2 was cleared).
    keys = b"".join(i.to_bytes(4, "little") for i in range(4))
    values = (
        bytes(8) + b"\x0a\x00\x00\x01\x00\x50\x06\x00" + bytes(8) + b"\x0a" + bytes(6) + b"\x01"
    )
    kept_keys, kept_values, count = layout.drop_zero_values(keys, values, 4, 8)
    assert count == 2 == layout.count_nonzero_values(values, 4, 8)
    assert kept_keys == (1).to_bytes(4, "little") + (3).to_bytes(4, "little")
    assert kept_values == values[8:16] + values[24:32]
    assert layout.drop_zero_values(b"", b"", 0, 8) == (b"", b"", 0)


FLOW6 = Flow(
    AddrPort(IPv6Address("2001:db8:c::7"), 40001),
    AddrPort(IPv6Address("2001:db8:1b::1"), 80),
    Proto.UDP,
)


def test_ipv6_flows_conntrack_and_nat_rows_round_trip_in_network_order() -> None:
    raw = layout.encode_flow6(FLOW6)
    assert bytes(raw) == (
        FLOW6.source.address.packed
        + FLOW6.destination.address.packed
        + (40001).to_bytes(2, "big")
        + (80).to_bytes(2, "big")
        + bytes([17, 0, 0, 0])
    )
    assert layout.decode_flow6(raw) == FLOW6
    entry = ConntrackEntry(
        AddrPort(IPv6Address("fd00:244::21"), 8080),
        CtFlags.SNAT,
        AddrPort(IPv6Address("2001:db8::10"), 40123),
        svc_id=8,
        backend_id=2,
        expires_ns=2**63,
        packets=1,
        bytes=80,
    )
    ct6 = layout.encode_conntrack6(entry)
    assert bytes(ct6)[:16] == entry.backend.address.packed
    assert entry.snat is not None and bytes(ct6)[16:32] == entry.snat.address.packed
    assert bytes(ct6)[32:34] == (8080).to_bytes(2, "big")
    assert layout.decode_conntrack6(ct6) == entry
    local = ConntrackEntry(entry.backend, CtFlags.NONE, None, 8, 2, 0, 0, 0)
    assert layout.decode_conntrack6(layout.encode_conntrack6(local)) == local
    nat = NatEntry(FLOW6.source, FLOW6.destination, NatFlags.SNAT, 123)
    raw_nat = layout.encode_nat6(nat)
    assert bytes(raw_nat)[:16] == FLOW6.source.address.packed
    assert layout.decode_nat6(raw_nat) == nat
    with pytest.raises(TypeError):
        layout.encode_flow6(FLOW)  # an IPv4 flow never reaches ebpflb_ct6
    with pytest.raises(TypeError):
        layout.encode_flow(FLOW6)


def test_ipv6_source_ranges_and_interface_addresses_are_laid_out_as_the_c_structs() -> None:
    key = SourceRange(0x01020304, IPv6Network("2001:db8:c::/48"))
    raw = layout.encode_source_range6(key)
    assert raw.prefixlen == SRC_RANGE_ID_PREFIXLEN + 48  # service id bits, then the prefix
    assert bytes(raw)[4:8] == bytes([1, 2, 3, 4])  # the id big-endian, for the LPM match
    assert bytes(raw)[8:24] == IPv6Address("2001:db8:c::").packed
    assert layout.decode_source_range6(raw) == key
    with pytest.raises(TypeError):
        layout.encode_source_range(key)  # an IPv6 range never reaches ebpflb_srcrng4
    address = IPv6Address("2001:db8::10")
    assert bytes(layout.encode_addr6(address)) == address.packed
    assert layout.decode_addr6(layout.encode_addr6(address)) == address
