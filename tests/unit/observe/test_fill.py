"""Map fill levels: what the reconciler knows for the maps it writes, a count for the maps
the programs write, exposed as ebpflb_map_{entries,capacity,fill_ratio}."""

from __future__ import annotations

import dataclasses
from ipaddress import IPv4Address, IPv6Address

from prometheus_client import CollectorRegistry

from ebpflb.clock import FakeClock
from ebpflb.config import Config
from ebpflb.datapath.contract import MAPS, STAT_MAX, MapName, MapType
from ebpflb.datapath.maps import AddrPort, ConntrackEntry, CtFlags, Flow
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.k8s.sources.base import Kind
from ebpflb.model import Proto
from ebpflb.observe.fill import (
    CachedCounts,
    MapFill,
    MapFillCollector,
    agent_fill,
    capacity_of,
    has_fill_level,
    pins_fill,
)
from ebpflb.observe.metrics import Metrics
from ebpflb.sync.agent import Agent
from tests.factories import endpoint_slice, service


def max_entries(maps: FakeMapSet) -> dict[MapName, int]:
    return {
        MapName.SERVICES: maps.services.capacity,
        MapName.BACKENDS: maps.backends.capacity + 1,  # the array has an element 0
        MapName.SLOTS: maps.slots.capacity // 2,  # the array's elements hold two slots
        MapName.SERVICE_META: maps.service_meta.capacity,
        MapName.REVERSE_SOCK: 4096,
        MapName.STATS: STAT_MAX,
        MapName.CONNTRACK: maps.conntrack.capacity,
        MapName.REPLY_NAT: maps.reply_nat.capacity,
        MapName.SOURCE_RANGES: maps.source_ranges.capacity,
        MapName.IFACE_ADDRS: 64,
        MapName.AFFINITY: maps.affinity_match.capacity,
        MapName.AFFINITY_MATCH: maps.affinity_match.capacity,
        MapName.SERVICES6: maps.services.capacity,
        MapName.REVERSE_SOCK6: 4096,
        MapName.CONNTRACK6: maps.conntrack6.capacity,
        MapName.REPLY_NAT6: maps.reply_nat6.capacity,
        MapName.SOURCE_RANGES6: maps.source_ranges6.capacity,
        MapName.IFACE_ADDRS6: 64,
        MapName.IFACE_MTUS: 64,
        MapName.FRAGMENTS: 8192,
        MapName.FRAGMENTS6: 8192,
        MapName.FRAG_DEFER: 8192,
    }


def counted(maps: FakeMapSet) -> dict[MapName, int]:
    """What a kernel count of the programs' maps would find."""
    return {
        MapName.CONNTRACK: len(maps.conntrack4),
        MapName.REPLY_NAT: len(maps.reply_nat4),
        MapName.REVERSE_SOCK: 17,
        MapName.IFACE_ADDRS: 1,
        MapName.AFFINITY: 0,
        MapName.SERVICES6: 0,
        MapName.REVERSE_SOCK6: 0,
        MapName.CONNTRACK6: len(maps.conntrack6),
        MapName.REPLY_NAT6: len(maps.reply_nat6),
        MapName.IFACE_ADDRS6: 1,
        MapName.IFACE_MTUS: 3,
        MapName.FRAGMENTS: 0,
        MapName.FRAGMENTS6: 0,
        MapName.FRAG_DEFER: 0,
    }


def synced_agent() -> tuple[Agent, FakeMapSet]:
    maps = FakeMapSet(max_services=100, max_backends=50, slot_pool_size=4096, ct_max=8)
    agent = Agent(Config(), maps, Metrics(CollectorRegistry()), clock=FakeClock())
    agent.object_updated(Kind.SERVICE, service())
    agent.object_updated(Kind.SERVICE, service("dns", cluster_ip="10.96.0.53"))
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice())
    agent.initial_list_done(Kind.SERVICE)
    agent.initial_list_done(Kind.ENDPOINT_SLICE)
    agent.runner.run_once()
    flow = Flow(
        AddrPort(IPv4Address("198.51.100.1"), 4000),
        AddrPort(IPv4Address("192.0.2.1"), 80),
        Proto.TCP,
    )
    entry = ConntrackEntry(
        AddrPort(IPv4Address("10.244.1.11"), 8080), CtFlags.NONE, None, 1, 1, 0, 0, 0
    )
    maps.conntrack.put(flow, entry)
    flow6 = Flow(
        AddrPort(IPv6Address("2001:db8:c::1"), 4000),
        AddrPort(IPv6Address("2001:db8::1"), 80),
        Proto.TCP,
    )
    entry6 = ConntrackEntry(
        AddrPort(IPv6Address("fd00:244::11"), 8080), CtFlags.NONE, None, 1, 1, 0, 0, 0
    )
    maps.conntrack.put(flow6, entry6)
    maps.conntrack.put(
        dataclasses.replace(flow6, source=AddrPort(flow6.source.address, 4001)), entry6
    )
    return agent, maps


def test_an_agent_reports_every_pinned_map() -> None:
    agent, maps = synced_agent()
    asked: list[MapName] = []

    def count(name: MapName) -> int:
        asked.append(name)
        return counted(maps)[name]

    known = agent.reconciler.map_entries()
    levels = {level.map: level for level in agent_fill(known, max_entries(maps), count)}
    # Every map but the counter arrays (indexed, so never "full").
    assert set(levels) == {name.value for name in MapName if has_fill_level(name)}
    assert {"ebpflb_svc4", "ebpflb_slots", "ebpflb_ct4"} <= set(levels)
    assert "ebpflb_stats" not in levels
    # The reconciler's own figures: two frontends (web has 3 backends, dns none).
    assert levels["ebpflb_svc4"] == MapFill("ebpflb_svc4", 2, 100)
    assert levels["ebpflb_svcmeta"].entries == 2
    assert levels["ebpflb_be4"] == MapFill("ebpflb_be4", 3, 50)
    assert levels["ebpflb_slots"].capacity == 4096  # slots, not elements
    assert 0 < levels["ebpflb_slots"].entries == agent.reconciler.space.slots.used
    assert "ebpflb_stats" not in levels  # fixed counter indexes: nothing fills up
    # Only the programs' maps are counted in the kernel.
    assert sorted(asked) == sorted(
        [
            MapName.CONNTRACK,
            MapName.REPLY_NAT,
            MapName.REVERSE_SOCK,
            MapName.IFACE_ADDRS,
            MapName.AFFINITY,
            MapName.REVERSE_SOCK6,
            MapName.CONNTRACK6,
            MapName.REPLY_NAT6,
            MapName.IFACE_ADDRS6,
            MapName.IFACE_MTUS,
            MapName.FRAGMENTS,
            MapName.FRAGMENTS6,
            MapName.FRAG_DEFER,
        ]
    )
    assert levels["ebpflb_affpair4"].entries == len(maps.affinity_match)  # the reconciler's
    assert levels["ebpflb_ct4"] == MapFill("ebpflb_ct4", 1, 8)
    assert levels["ebpflb_ct4"].ratio == 0.125
    assert levels["ebpflb_ct6"] == MapFill("ebpflb_ct6", 2, 8)  # each family its own table
    assert levels["ebpflb_srcrng6"] == MapFill("ebpflb_srcrng6", 0, 1024)


def test_the_collector_exposes_entries_capacity_and_ratio() -> None:
    registry = CollectorRegistry()
    registry.register(
        MapFillCollector(lambda: [MapFill("ebpflb_ct4", 192, 256), MapFill("ebpflb_be4", 0, 0)])
    )

    def value(name: str, map_name: str) -> float | None:
        return registry.get_sample_value(name, {"map": map_name})

    assert value("ebpflb_map_entries", "ebpflb_ct4") == 192
    assert value("ebpflb_map_capacity", "ebpflb_ct4") == 256
    assert value("ebpflb_map_fill_ratio", "ebpflb_ct4") == 0.75
    assert value("ebpflb_map_fill_ratio", "ebpflb_be4") == 0.0  # no division by zero


def test_a_failing_read_leaves_the_scrape_working() -> None:
    def broken() -> list[MapFill]:
        raise OSError("pin gone")

    registry = CollectorRegistry()
    registry.register(MapFillCollector(broken))
    assert registry.get_sample_value("ebpflb_map_entries", {"map": "ebpflb_ct4"}) is None


def test_pins_alone_count_every_hash_map() -> None:
    _, maps = synced_agent()
    sizes = {MapName.SERVICES: 2, MapName.SERVICE_META: 2, MapName.BACKENDS: 3,
             MapName.SOURCE_RANGES: 0, MapName.SOURCE_RANGES6: 0, MapName.AFFINITY_MATCH: 0,
             **counted(maps)}  # fmt: skip
    levels = {lv.map: lv for lv in pins_fill(max_entries(maps), sizes.__getitem__, 509)}
    assert levels["ebpflb_slots"] == MapFill("ebpflb_slots", 509, 4096)
    assert levels["ebpflb_be4"].entries == 3
    assert levels["ebpflb_revsk4"] == MapFill("ebpflb_revsk4", 17, 4096)


def test_kernel_counts_are_reused_for_a_while() -> None:
    clock = FakeClock()
    calls: list[MapName] = []

    def count(name: MapName) -> int:
        calls.append(name)
        return len(calls)

    counts = CachedCounts(count, clock, max_age=10)
    assert counts(MapName.CONNTRACK) == 1
    clock.advance(9.9)
    assert counts(MapName.CONNTRACK) == 1  # reused
    assert counts(MapName.REPLY_NAT) == 2  # each map its own
    clock.advance(0.1)
    assert counts(MapName.CONNTRACK) == 3  # counted again


def test_every_hash_map_has_a_fill_level_and_no_counter_array() -> None:
    """A map added to the contract gets a fill level if it can fill up (counted in the
    kernel unless the reconciler knows it): arrays of counters by index and socket storage
    cannot; the slot pool and the backend array (indexed by allocated ids) can."""
    unsized = (MapType.ARRAY, MapType.PERCPU_ARRAY, MapType.ARRAY_OF_MAPS, MapType.SK_STORAGE)
    for name, spec in MAPS.items():
        assert has_fill_level(name) == (
            name in (MapName.SLOTS, MapName.BACKENDS) or spec.type not in unsized
        )
    assert not has_fill_level(MapName.STATS) and has_fill_level(MapName.CONNTRACK)
    assert not has_fill_level(MapName.SOCK_STORAGE)
    assert capacity_of(MapName.BACKENDS, 65537) == 65536  # element 0 is never an id
