"""The room frontends take besides backends: service ids, Maglev slot ranges and
source-range entries.

A slot range a frontend stopped using (it was removed, or its table moved) is kept one
sync in quarantine before it is reused: a BPF program that read the old service entry
may still index the old range while the sync that replaced it runs.
"""

from __future__ import annotations

from ebpflb.datapath.maps import SLOTS_PER_ELEMENT, MapSet
from ebpflb.errors import MapFullError
from ebpflb.reconcile.alloc import IdAllocator, NeededBy, SlotAllocator, describe


class Space:
    def __init__(self, maps: MapSet) -> None:
        self.svc_ids = IdAllocator(maps.services.name, maps.services.capacity)
        self.slots = SlotAllocator(maps.slots.name, maps.slots.capacity, SLOTS_PER_ELEMENT)
        self._quarantine: list[tuple[int, int]] = []
        self._range_map = maps.source_ranges.name
        self._range_capacity = maps.source_ranges.capacity
        self.range_count = 0  # source-range entries written or reserved

    @property
    def quarantined(self) -> tuple[tuple[int, int], ...]:
        return tuple(self._quarantine)

    def keep_quarantined(self, ranges: tuple[tuple[int, int], ...]) -> None:
        """After a restore reserved every table found: the ranges the last apply freed
        stay unused until the next apply. One that a table in the maps overlaps (written
        behind the agent's back) is that table's."""
        for start, size in ranges:
            try:
                self.slots.reserve(start, size)
            except ValueError:
                continue
            self._quarantine.append((start, size))

    def start_apply(self) -> None:
        """The ranges freed by the previous apply are free from now on."""
        for start, size in self._quarantine:
            self.slots.release(start, size)
        self._quarantine = []

    def retire(self, start: int, size: int) -> None:
        """A range no entry names any more: free at the next apply."""
        self._quarantine.append((start, size))

    def reserve_ranges(self, count: int, needed_by: NeededBy) -> None:
        """Room for `count` more source ranges (LPM tries cannot say how full they are)."""
        if self.range_count + count > self._range_capacity:
            raise MapFullError(
                self._range_map,
                self._range_capacity,
                f"{count} source ranges of {describe(needed_by)}",
            )
        self.range_count += count
