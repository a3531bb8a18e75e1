"""The slot pool starts small and grows (issue 15, "Kernel memory that follows the
cluster"): a frontend that does not fit makes the pool grow by a quarter, up to its
limit, with every table kept; the grow is counted and logged; at the limit a frontend fails
alone, as before.
The kernel side (the swap under traffic, adoption after a restart) is
tests/kernel/datapath/test_grow.py."""

from __future__ import annotations

import logging
from ipaddress import IPv4Address

import pytest
from prometheus_client import CollectorRegistry

from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.desired import DesiredFrontend, WeightedBackend
from ebpflb.errors import MapError
from ebpflb.model import Backend, Frontend, NamespacedName, Proto, ServicePortName, SvcFlags
from ebpflb.observe.metrics import Metrics
from ebpflb.reconcile import Reconciler
from ebpflb.reconcile.alloc import SlotAllocator

State = dict[NamespacedName, dict[Frontend, DesiredFrontend]]


def services(count: int) -> State:
    """`count` ClusterIP services of 3 backends: a 509-slot table each (510 with padding)."""
    state: State = {}
    for i in range(count):
        owner = NamespacedName("default", f"svc{i}")
        frontend = Frontend(IPv4Address("10.96.0.1") + i, 80, Proto.TCP)
        backends = tuple(
            WeightedBackend(Backend(IPv4Address("10.244.0.1") + 3 * i + j, 8080, Proto.TCP))
            for j in range(3)
        )
        port = ServicePortName(owner, "http", Proto.TCP)
        state[owner] = {frontend: DesiredFrontend(frontend, port, SvcFlags.CLUSTER_IP, backends)}
    return state


def grows(rec: Reconciler) -> float | None:
    assert rec.metrics is not None
    return rec.metrics.registry.get_sample_value("ebpflb_map_grows_total", {"map": "ebpflb_slots"})


def tables(maps: FakeMapSet) -> dict[int, list[int]]:
    return {
        e.svc_id: maps.slots.read(e.table_off, e.table_size).tolist()
        for e in maps.services.data.values()
    }


def test_a_full_pool_grows_and_keeps_every_table(caplog: pytest.LogCaptureFixture) -> None:
    maps = FakeMapSet(slot_pool_size=1024, slot_pool_limit=8192)
    rec = Reconciler(maps, metrics=Metrics(CollectorRegistry()))
    rec.apply(services(2), full=True)  # 1020 of 1024 slots
    assert maps.slots.capacity == 1024 and grows(rec) is None
    before = tables(maps)
    with caplog.at_level(logging.INFO, logger="ebpflb.reconcile.reconciler"):
        result = rec.apply(services(5), full=True)
    assert not result.errors and not result.failed
    # 2,550 slots needed: 1024 -> 2048 (a quarter, in steps of 1024) -> 3072
    assert maps.slots.capacity == 3072
    assert len(maps.services.data) == 5
    after = tables(maps)
    assert {k: after[k] for k in before} == before  # the old tables untouched
    assert all(sorted(set(t)) != [0] for t in after.values())
    assert grows(rec) == 2
    assert "ebpflb_slots grew from 1024 to" in caplog.text
    assert rec.space.slots.capacity == maps.slots.capacity


def test_at_its_limit_the_pool_fails_the_frontend_that_does_not_fit() -> None:
    maps = FakeMapSet(slot_pool_size=1024, slot_pool_limit=2048)
    rec = Reconciler(maps, metrics=Metrics(CollectorRegistry()))
    result = rec.apply(services(5), full=True)
    assert maps.slots.capacity == 2048
    assert len(maps.services.data) == 4  # 4 x 510 slots fit in 2048
    assert len(result.failed) == 1
    (error,) = result.errors
    assert "ebpflb_slots is full (limit 2048)" in error
    assert grows(rec) == 1


def test_a_pool_without_room_to_grow_fails_as_before() -> None:
    maps = FakeMapSet(slot_pool_size=1024)  # limit = capacity: a reader's pool
    rec = Reconciler(maps, metrics=Metrics(CollectorRegistry()))
    result = rec.apply(services(3), full=True)
    assert len(result.failed) == 1 and maps.slots.capacity == 1024 and grows(rec) is None


def test_grow_refuses_to_shrink_or_pass_the_limit() -> None:
    maps = FakeMapSet(slot_pool_size=1024, slot_pool_limit=2048)
    for capacity in (1024, 512, 4096, 1025):
        with pytest.raises(MapError):
            maps.slots.grow(capacity)


def test_extending_the_allocator_merges_the_free_tail() -> None:
    slots = SlotAllocator("pool", 100, 2)
    slots.allocate(60, "a")
    slots.extend(200)
    assert slots.capacity == 200 and slots.used == 60
    assert slots.allocate(140, "b") == 60  # the old free tail and the new room, one range
    assert slots.used == 200
