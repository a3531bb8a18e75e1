"""Batched element operations and the mapped slot pool on real kernel maps (the ones
bpf/lib/maps.h declares, compiled into a private bpffs directory): what they write is what
one-by-one writes write, and a failure in the middle of a batch is attributed to its own
element, the others being written."""

from __future__ import annotations

import errno
import mmap
import os
import time
import uuid
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from pathlib import Path

import numpy as np
import pytest
from bcc import BPF

from ebpflb.config import Config
from ebpflb.datapath import contract
from ebpflb.datapath.contract import CtFlags, MapName, NatFlags
from ebpflb.datapath.maps import (
    AddrPort,
    BackendEntry,
    ConntrackEntry,
    Flow,
    InterfaceAddresses,
    NatEntry,
    ServiceEntry,
    SlotWrite,
    SourceRange,
    growable,
)
from ebpflb.datapath.maps.elementio import LOOKUP_CHUNK
from ebpflb.datapath.maps.kernel import KernelMapSet
from ebpflb.datapath.maps.pinned import PinnedMap
from ebpflb.datapath.maps.pins import ensure_bpffs, pinned_layout
from ebpflb.datapath.maps.slotpool import KernelSlotPool
from ebpflb.datapath.programs import compiler, loader
from ebpflb.datapath.syscall import bpfsys
from ebpflb.errors import DatapathError, MapError, MapFullError
from ebpflb.model import Backend, Frontend, Proto, SvcFlags

MAX_SERVICES = 16
MAX_BACKENDS = LOOKUP_CHUNK + 1000  # a whole-map read takes two batches
POOL = 1024


@pytest.fixture(scope="module")
def pins() -> Iterator[Path]:
    path = Path("/sys/fs/bpf") / f"ebpflb-batch-{uuid.uuid4().hex[:8]}"
    config = Config(
        bpffs_dir=path,
        slot_pool_size=POOL,
        maglev_max_table_size=1021,
        max_services=MAX_SERVICES,
        max_backends=MAX_BACKENDS,
        rev_sk_max=16,
        src_range_max=LOOKUP_CHUNK + 100,
    )
    ensure_bpffs(path)
    growable.ensure(config)  # as the loader does: the programs open the pinned ref maps
    bpf = compiler.compile_program(
        loader.BPF_DIR / "sock_lb.c", contract.cflags(config) + loader.Features(False).cflags()
    )
    try:
        yield path
    finally:
        bpf.cleanup()
        for pin in path.iterdir():
            pin.unlink()
        path.rmdir()


@pytest.fixture
def maps(pins: Path) -> Iterator[KernelMapSet]:
    with KernelMapSet(pins) as opened:
        yield opened
        for frontend, _ in list(opened.services.items()):
            opened.services.delete(frontend)
        for backend_id, _ in list(opened.backends.items()):
            opened.backends.delete(backend_id)


def frontend(i: int) -> Frontend:
    return Frontend(IPv4Address("10.96.0.0") + i, 80 + i, Proto.UDP if i % 2 else Proto.TCP)


def backend(i: int) -> BackendEntry:
    return BackendEntry(Backend(IPv4Address("10.244.0.0") + i, 8080, Proto.TCP))


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-by-one"])
def test_many_entries_written_and_read_back(maps: KernelMapSet, batched: bool) -> None:
    maps.backends4.io.batched = batched
    written = {i: backend(i) for i in range(1, MAX_BACKENDS + 1)}
    assert maps.backends.put_many(sorted(written.items())) == {}
    assert maps.backends4.io.batched == batched
    assert dict(maps.backends.items()) == written
    assert maps.backends.get(7) == written[7]
    services = [
        (frontend(i), ServiceEntry(i + 1, 2 * i, 101, 3, SvcFlags.CLUSTER_IP)) for i in range(5)
    ]
    assert maps.services.put_many(services) == {}
    assert sorted(maps.services.items()) == sorted(services)
    assert maps.service_meta.put_many([(1, "default/web:http")]) == {}
    assert dict(maps.service_meta.items()) == {1: "default/web:http"}


def test_a_trie_is_read_back_in_batches_too(maps: KernelMapSet) -> None:
    """Not a hash map: a batch ends at a key (12 bytes here), not at a bucket number."""
    ranges = [
        (SourceRange(i // 8 + 1, IPv4Network(f"10.{i % 8}.{i // 256 % 256}.0/24")), 1)
        for i in range(LOOKUP_CHUNK + 50)
    ]
    try:
        assert maps.source_ranges.put_many(ranges) == {}
        assert sorted(maps.source_ranges.items()) == sorted(ranges)
    finally:
        for source_range, _ in ranges:
            maps.source_ranges.delete(source_range)


def test_a_full_map_fails_only_the_entries_that_need_room(maps: KernelMapSet) -> None:
    first = [(frontend(i), ServiceEntry(i + 1, 0, 0, 0, SvcFlags.CLUSTER_IP)) for i in range(10)]
    assert maps.services.put_many(first) == {}
    # 8 more new keys, with updates of existing ones among them: 6 fit, 2 do not.
    more = [(frontend(i), ServiceEntry(i + 100, 0, 0, 0, SvcFlags.NODE_PORT)) for i in range(5, 18)]
    failures = maps.services.put_many(more)
    assert sorted(failures) == [11, 12]  # frontends 16 and 17
    assert all(isinstance(e, MapFullError) for e in failures.values())
    assert "ebpflb_svc4 is full (limit 16)" in str(failures[11])
    stored = dict(maps.services.items())
    assert len(stored) == MAX_SERVICES and frontend(16) not in stored
    assert stored[frontend(5)].svc_id == 105 and stored[frontend(15)].svc_id == 115


def test_a_batch_resumes_after_the_element_the_kernel_refused(pins: Path) -> None:
    with KernelMapSet(pins) as opened:
        io = opened.slots.io  # an array: a key past its end is refused (E2BIG)
        keys = np.array([1, 2, POOL, 3], dtype=np.uint32)  # POOL // 2 elements exist
        values = np.array([[5, 6], [7, 8], [9, 9], [10, 11]], dtype=np.uint32)
        errors = io.update(keys.ctypes.data, values.ctypes.data, len(keys))
        assert errors == {2: errno.E2BIG}
        assert opened.slots.read(2, 6).tolist() == [5, 6, 7, 8, 10, 11]
        opened.slots.write(0, np.zeros(8, dtype=np.uint32))


def test_the_slot_pool_is_mapped_and_written_as_memory(maps: KernelMapSet) -> None:
    pool = maps.slots
    assert pool.mapped and pool.capacity == POOL
    table = np.arange(1, 102, dtype=np.uint32)
    failures = pool.write_many(
        [SlotWrite(100, table), SlotWrite(POOL - 2, table), SlotWrite(300, table[:3])]
    )
    assert list(failures) == [1] and "beyond capacity" in str(failures[1])
    view = pool.read(100, 101)
    assert view.tolist() == table.tolist() and not view.flags.writeable
    assert pool.read(201, 1).tolist() == [0]  # the odd table's padding slot
    changed = table.copy()
    changed[[0, 50]] = 99
    pool.write(100, changed, np.array([0, 50]))
    assert view[[0, 1, 50]].tolist() == [99, 2, 99]  # a view follows the pool
    assert pool._read_batch(100, 101).tolist() == changed.tolist()  # as the kernel sees it
    pool.write(100, np.zeros(102, dtype=np.uint32))
    pool.write(300, np.zeros(4, dtype=np.uint32))


def bpf_map_mappings() -> int:
    """Mappings of BPF maps in this process (the kernel names them anon_inode:bpf-map)."""
    with open("/proc/self/maps") as maps:
        return sum("bpf-map" in line for line in maps)


def test_the_pool_is_mapped_only_while_used(pins: Path) -> None:
    """Windows at page offsets of a many-page pool write what the kernel then reads; many
    writes map the whole pool, and release leaves no mapping behind."""
    pairs = 1 << 14  # 128 KiB: 32 pages
    array = int(contract.MAPS[contract.MapName.SLOTS].type)
    fd = bpfsys.map_create(array, 4, 8, pairs, "a pool", flags=contract.BPF_F_MMAPABLE)
    path = pins / "windowed_slots"
    try:
        bpfsys.obj_pin(fd, str(path))
    finally:
        os.close(fd)
    pinned = PinnedMap(path)
    before = bpf_map_mappings()
    try:
        pool = KernelSlotPool(pinned)
        table = np.arange(1, 102, dtype=np.uint32)
        at = 5 * mmap.PAGESIZE // 4 - 40  # across a page boundary, past page 0
        assert pool.write_many([SlotWrite(at, table)]) == {}
        assert not pool.holds_mapping and bpf_map_mappings() == before
        assert pool._read_batch(at, 102).tolist() == [*table.tolist(), 0]
        assert pool.read(at, 101).tolist() == table.tolist()
        many = [SlotWrite(k * 256, table) for k in range(pool.window_budget + 1)]
        assert pool.write_many(many) == {}
        assert pool.holds_mapping and bpf_map_mappings() == before + 1
        assert pool._read_batch(pool.window_budget * 256, 101).tolist() == table.tolist()
        pool.release()
        assert not pool.holds_mapping and bpf_map_mappings() == before
        pool.close()
    finally:
        pinned.close()
        path.unlink()


def test_a_pool_pinned_without_the_mmap_flag_is_written_in_batches(pins: Path) -> None:
    """An older ebpflb pinned the pool without BPF_F_MMAPABLE: batches of syscalls."""
    path = pins / "legacy_slots"
    bpf = BPF(
        text=(
            'BPF_TABLE_PINNED("array", u32, u64, legacy_slots, 64, "' + str(path) + '");'
        ).encode()
    )
    pinned = PinnedMap(path)
    try:
        pool = KernelSlotPool(pinned)
        assert not pool.mapped and pool.capacity == 128
        table = np.arange(1, 8, dtype=np.uint32)
        failures = pool.write_many(
            [SlotWrite(0, table), SlotWrite(126, table), SlotWrite(10, table, np.array([3]))]
        )
        assert list(failures) == [1]
        assert pool.read(0, 8).tolist() == [*table.tolist(), 0]
        assert pool.read(10, 8).tolist() == [0, 0, 3, 4, 0, 0, 0, 0]  # the pair of slot 3
        with pytest.raises(MapError):
            pool.write(127, table)
    finally:
        pinned.close()
        bpf.cleanup()
        path.unlink()


def test_conntrack_and_nat_rows_read_back_typed_and_idle_ones_expire(maps: KernelMapSet) -> None:
    """The rows the programs write, as `maps dump` reads them; expire_flows deletes only
    reply translations past their deadline (CLOCK_MONOTONIC, as bpf_ktime_get_ns)."""
    now = time.monotonic_ns()
    client = AddrPort(IPv4Address("198.51.100.7"), 40001)
    frontend = AddrPort(IPv4Address("203.0.113.1"), 80)
    snat = AddrPort(IPv4Address("192.168.1.10"), 40123)
    backend_at = AddrPort(IPv4Address("10.244.2.21"), 8080)
    flow = Flow(client, frontend, Proto.TCP)
    entry = ConntrackEntry(backend_at, CtFlags.SNAT, snat, 8, 2, now + 10**12, 3, 180)
    live = (
        Flow(backend_at, snat, Proto.TCP),
        NatEntry(client, frontend, NatFlags.SNAT, now + 10**12),
    )
    idle = (
        Flow(backend_at, AddrPort(snat.address, 40124), Proto.TCP),
        NatEntry(AddrPort(client.address, 40002), frontend, NatFlags.SNAT, now - 1),
    )
    try:
        maps.conntrack.put(flow, entry)
        assert maps.reply_nat.put_many([live, idle]) == {}
        assert list(maps.conntrack.items()) == [(flow, entry)]
        assert sorted(maps.reply_nat.items()) == sorted([live, idle])
        assert maps.expire_flows() == 1
        assert list(maps.reply_nat.items()) == [live]
    finally:
        maps.conntrack.delete(flow)
        maps.reply_nat.delete(live[0])
        assert not maps.reply_nat.delete(idle[0])  # gone already: not an error


def test_syscall_failures_are_project_errors_naming_the_object(pins: Path, tmp_path: Path) -> None:
    missing = pins / "no_such_map"
    with pytest.raises(bpfsys.BpfError, match=f"opening pinned object {missing}") as info:
        bpfsys.obj_get(str(missing))
    assert info.value.errno == errno.ENOENT and isinstance(info.value, DatapathError)
    with pytest.raises(MapError, match=f"cannot open pinned map {missing}: No such file"):
        PinnedMap(missing)
    assert pinned_layout(missing) is None
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)  # a directory, not a cgroup
    try:
        with pytest.raises(bpfsys.BpfError, match=f"listing programs attached to {tmp_path}"):
            bpfsys.prog_query(fd, loader.SockHook.CONNECT4.attach_type, str(tmp_path))
    finally:
        os.close(fd)


def test_ipv6_rows_go_to_the_ipv6_twins_and_read_back_typed(maps: KernelMapSet) -> None:
    """ebpflb_ct6, ebpflb_rnat6, ebpflb_srcrng6 and ebpflb_ifaddr6 through the MapSet's
    family joins: each IPv6 row in its twin, read back as written, idle IPv6 reply
    translations expired like IPv4 ones; an LPM lookup finds the IPv6 prefix."""
    now = time.monotonic_ns()
    client = AddrPort(IPv6Address("2001:db8:c::7"), 40001)
    frontend = AddrPort(IPv6Address("2001:db8:1b::1"), 80)
    snat = AddrPort(IPv6Address("2001:db8::10"), 40123)
    backend_at = AddrPort(IPv6Address("fd00:244::21"), 8080)
    flow = Flow(client, frontend, Proto.UDP)
    entry = ConntrackEntry(backend_at, CtFlags.SNAT, snat, 8, 2, now + 10**12, 3, 180)
    live = (
        Flow(backend_at, snat, Proto.UDP),
        NatEntry(client, frontend, NatFlags.SNAT, now + 10**12),
    )
    idle = (
        Flow(backend_at, AddrPort(snat.address, 40124), Proto.UDP),
        NatEntry(AddrPort(client.address, 40002), frontend, NatFlags.SNAT, now - 1),
    )
    ranges = [
        (SourceRange(9, IPv6Network("2001:db8:c::/48")), 1),
        (SourceRange(9, IPv4Network("198.51.100.0/24")), 1),
    ]
    try:
        maps.conntrack.put(flow, entry)
        assert maps.reply_nat.put_many([live, idle]) == {}
        assert maps.source_ranges.put_many(ranges) == {}
        assert list(maps.conntrack.v6.items()) == [(flow, entry)] and not len(maps.conntrack.v4)
        assert maps.conntrack.get(flow) == entry
        assert sorted(maps.reply_nat.v6.items()) == sorted([live, idle])
        assert list(maps.source_ranges.v6.items()) == [ranges[0]]
        assert list(maps.source_ranges.v4.items()) == [ranges[1]]
        assert maps.expire_flows() == 1
        assert list(maps.reply_nat.items()) == [live]
        maps.set_interface_addresses(
            InterfaceAddresses(
                {3: IPv4Address("192.168.1.10")}, {3: snat.address, 4: client.address}
            )
        )
        assert maps.interface_addresses() == InterfaceAddresses(
            {3: IPv4Address("192.168.1.10")}, {3: snat.address, 4: client.address}
        )
        maps.set_interface_addresses(InterfaceAddresses({}, {4: frontend.address}))
        assert maps.interface_addresses() == InterfaceAddresses({}, {4: frontend.address})
    finally:
        maps.conntrack.delete(flow)
        maps.reply_nat.delete(live[0])
        for source_range, _ in ranges:
            maps.source_ranges.delete(source_range)
        maps.set_interface_addresses(InterfaceAddresses())
    assert not len(maps.conntrack) and not len(maps.source_ranges)


def test_ipv6_conntrack_grows_on_its_own(maps: KernelMapSet) -> None:
    """ebpflb_ct6 half full doubles, its flows kept; ebpflb_ct4 (empty) stays."""
    initial = maps.conntrack.v6.capacity
    target = AddrPort(IPv6Address("fd00:244::21"), 8080)
    flows = [
        (
            Flow(
                AddrPort(IPv6Address("2001:db8:c::7") + i // 60000, 1000 + i % 60000),
                AddrPort(IPv6Address("2001:db8:1b::1"), 80),
                Proto.TCP,
            ),
            ConntrackEntry(target, CtFlags.NONE, None, 1, 1, 2**62, 0, 0),
        )
        for i in range(initial // 2)
    ]
    try:
        assert maps.conntrack.put_many(flows) == {}
        limit = initial * 4
        assert maps.grow_conntrack(limit, MapName.CONNTRACK) is None  # ct4: empty
        assert maps.grow_conntrack(limit, MapName.CONNTRACK6) == (initial, initial * 2)
        assert maps.conntrack.v6.capacity == initial * 2
        assert dict(maps.conntrack.items()) == dict(flows)
    finally:
        for flow, _ in flows:
            maps.conntrack.delete(flow)
