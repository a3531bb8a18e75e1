"""The reconciler's parts on their own: backend id lifetime, slot-range quarantine,
table building."""

from __future__ import annotations

from ipaddress import IPv4Address

import pytest

from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.errors import MapFullError
from ebpflb.model import Backend, Proto
from ebpflb.reconcile.backends import Backends
from ebpflb.reconcile.result import ApplyResult
from ebpflb.reconcile.space import Space


def backend(n: int) -> Backend:
    return Backend(IPv4Address("10.244.0.0") + n, 8080, Proto.TCP)


def test_a_failed_plan_gives_its_new_backend_ids_back_at_once() -> None:
    ids = Backends("ebpflb_be4", 3)
    shared = ids.id_for(backend(1), "a")
    mark = ids.mark()
    assert ids.id_for(backend(1), "b") == shared  # known: not the plan's to give back
    fresh = [ids.id_for(backend(n), "b") for n in (2, 3)]
    with pytest.raises(MapFullError, match="limit 3"):
        ids.id_for(backend(4), "b")
    ids.give_back_since(mark)
    assert [ids.id_for(backend(n), "c") for n in (5, 6)] == fresh
    assert ids.id_for(backend(1), "c") == shared
    ids.planned()
    with pytest.raises(MapFullError):
        ids.id_for(backend(7), "d")


def test_unreferenced_backends_are_deleted_by_collect_and_referenced_ones_stay() -> None:
    maps = FakeMapSet()
    ids = Backends(maps.backends.name, maps.backends.capacity)
    one, two = ids.id_for(backend(1), "a"), ids.id_for(backend(2), "a")
    ids.reference((one, two))
    ids.reference((one,), (one, two))  # the table stopped naming two
    result = ApplyResult()
    ids.collect(maps.backends, result)
    assert ids.id_for(backend(2), "a") == two  # never written: its id was given back
    assert result.writes == {}


def test_a_retired_range_is_free_only_from_the_next_apply() -> None:
    space = Space(FakeMapSet(slot_pool_size=204))
    first = space.slots.allocate(101, "a")
    space.slots.allocate(101, "b")
    space.retire(first, 101)  # a's frontend went: a reader may still be in its table
    with pytest.raises(MapFullError):
        space.slots.allocate(101, "c")
    space.start_apply()
    assert space.slots.allocate(101, "c") == first


def test_a_quarantined_range_a_table_took_behind_our_back_stays_that_tables() -> None:
    space = Space(FakeMapSet(slot_pool_size=204))
    space.slots.reserve(0, 101)  # restored: a table in the maps uses it
    space.keep_quarantined(((0, 101), (102, 101)))
    assert space.quarantined == ((102, 101),)
    space.start_apply()
    assert space.slots.allocate(101, "x") == 102
