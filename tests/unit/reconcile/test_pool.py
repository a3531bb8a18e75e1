"""How the reconciler uses the slot pool across a sync: it lets go of the pool after
every apply (the kernel pool's mapping is not held between syncs), and a full apply right
after a restore trusts the digests the restore read from the pool instead of reading each
table again, while a table changed behind its back is still repaired."""

from __future__ import annotations

import pytest

from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.reconcile import Reconciler
from tests.unit.reconcile.test_reconcile import API, WEB, backends, desired, fe, table_names


@pytest.fixture
def maps() -> FakeMapSet:
    return FakeMapSet(max_services=8, max_backends=64, slot_pool_size=4096)


STATE = {
    **desired(WEB, fe(), backends(11, 12, 13)),
    **desired(API, fe("10.96.0.20"), backends(12, 14)),
}


def test_every_apply_releases_the_pool_even_one_that_raises(maps: FakeMapSet) -> None:
    rec = Reconciler(maps)
    rec.apply(STATE)
    rec.apply(desired(WEB, fe(), backends(11, 12)))
    assert maps.slots.releases == 2

    def broken(*_: object) -> dict[int, object]:
        raise RuntimeError("a bug")

    maps.slots.write_many = broken  # type: ignore[method-assign,assignment]
    with pytest.raises(RuntimeError):
        rec.apply(desired(WEB, fe(), backends(11, 15)))
    assert maps.slots.releases == 3


def test_a_restarted_apply_reads_each_table_once_and_writes_nothing(maps: FakeMapSet) -> None:
    Reconciler(maps).apply(STATE)
    restarted = Reconciler(maps)
    reads = maps.slots.reads
    restarted.restore()
    assert maps.slots.reads == reads + 2  # one per table, by the restore
    result = restarted.apply(STATE, full=True)
    assert maps.slots.reads == reads + 2 and result.writes == {} and result.errors == []


def test_a_table_changed_before_the_restart_is_still_repaired(maps: FakeMapSet) -> None:
    Reconciler(maps).apply(STATE)
    good = table_names(maps, fe())
    entry = maps.services.data[fe()]
    maps.slots.array[entry.table_off + 1] = 0
    restarted = Reconciler(maps)
    restarted.restore()
    result = restarted.apply(STATE, full=True)
    assert table_names(maps, fe()) == good and result.writes == {"ebpflb_slots": 1}


def test_an_incremental_apply_compares_against_the_pool(maps: FakeMapSet) -> None:
    """No restore before it: what is known may be stale, so a reused table is read."""
    rec = Reconciler(maps)
    rec.apply(STATE)
    reads = maps.slots.reads
    rec.apply(desired(WEB, fe(), backends(11, 12, 14)))
    assert maps.slots.reads == reads + 1


def test_a_table_naming_ids_past_the_backend_map_is_rewritten(maps: FakeMapSet) -> None:
    """A pool left by an agent with a larger backend map (or scribbled on) names ids this
    one has no room for: they count for nothing, and the table is rebuilt."""
    Reconciler(maps).apply(STATE)
    good = table_names(maps, fe())
    entry = maps.services.data[fe()]
    maps.slots.array[entry.table_off : entry.table_off + 3] = [64, 1000, 70000]
    restarted = Reconciler(maps)
    restarted.restore()
    result = restarted.apply(STATE, full=True)
    assert result.errors == [] and table_names(maps, fe()) == good
    assert len(restarted.backends) == len(maps.backends.data) == 4  # 11, 12, 13, 14
