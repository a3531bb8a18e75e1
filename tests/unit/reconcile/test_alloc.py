from __future__ import annotations

import pytest

from ebpflb.errors import MapFullError
from ebpflb.reconcile.alloc import IdAllocator, SlotAllocator


def test_ids_start_at_one_reuse_lowest_and_respect_the_limit() -> None:
    ids = IdAllocator("m", 3)
    assert [ids.allocate("x") for _ in range(3)] == [1, 2, 3]
    with pytest.raises(MapFullError, match="m is full \\(limit 3\\): cannot add y"):
        ids.allocate("y")
    ids.release(2)
    assert ids.allocate("z") == 2


def test_reserved_ids_are_skipped() -> None:
    ids = IdAllocator("m", 10)
    ids.reserve(1)
    ids.reserve(3)
    assert [ids.allocate("x") for _ in range(3)] == [2, 4, 5]


def test_slot_ranges_first_fit_and_merge_on_release() -> None:
    slots = SlotAllocator("pool", 100)
    a = slots.allocate(30, "a")
    b = slots.allocate(30, "b")
    c = slots.allocate(30, "c")
    assert (a, b, c) == (0, 30, 60) and slots.used == 90
    with pytest.raises(MapFullError, match="pool is full \\(limit 100\\)"):
        slots.allocate(20, "d")
    slots.release(b, 30)
    slots.release(a, 30)  # merges with b's range
    assert slots.allocate(60, "e") == 0
    slots.release(0, 60)
    slots.release(60, 30)
    assert slots.largest_free() == 100 and slots.used == 0


def test_slot_reserve_rejects_overlap() -> None:
    slots = SlotAllocator("pool", 100)
    slots.reserve(10, 20)
    with pytest.raises(ValueError):
        slots.reserve(25, 10)
    assert slots.allocate(10, "a") == 0
    assert slots.allocate(10, "b") == 30


def test_ids_outside_the_limit_are_never_in_use() -> None:
    ids = IdAllocator("m", 4)
    ids.reserve(9)  # an id some other writer put in the map: ours never reach it
    ids.reserve(2)
    assert 2 in ids and 9 not in ids and "x" not in ids and len(ids) == 1
    ids.release(9)
    assert [ids.allocate("x") for _ in range(3)] == [1, 3, 4]


def test_who_needs_room_is_described_only_when_there_is_none() -> None:
    calls: list[str] = []

    def needed_by() -> str:
        calls.append("called")
        return "service web"

    ids = IdAllocator("m", 1)
    ids.allocate(needed_by)
    assert calls == []
    with pytest.raises(MapFullError, match="cannot add service web"):
        ids.allocate(needed_by)
    slots = SlotAllocator("pool", 10)
    with pytest.raises(MapFullError, match="cannot add service web \\(20 slots"):
        slots.allocate(20, needed_by)
