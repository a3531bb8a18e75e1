"""The room frontends take besides backends: service ids, Maglev slot ranges and
source-range entries.

A slot range a frontend stopped using (it was removed, or its table moved) is kept one
sync in quarantine before it is reused: a BPF program that read the old service entry
may still index the old range while the sync that replaced it runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ebpflb.datapath.maps import SLOTS_PER_ELEMENT, MapSet, SlotPool
from ebpflb.errors import MapError, MapFullError
from ebpflb.reconcile.alloc import IdAllocator, NeededBy, SlotAllocator, describe

log = logging.getLogger(__name__)

GROW_STEP = 1 << 10  # slots: pools grow in whole KiB multiples (whole pages)


@dataclass(frozen=True, slots=True)
class Grow:
    """A map that grew (reported once by the reconciler: log line and metric)."""

    map: str
    before: int
    after: int
    limit: int


class Space:
    def __init__(self, maps: MapSet) -> None:
        self.svc_ids = IdAllocator(maps.services.name, maps.services.capacity)
        self._pool: SlotPool = maps.slots
        self.slots = SlotAllocator(maps.slots.name, maps.slots.capacity, SLOTS_PER_ELEMENT)
        self.grown: list[Grow] = []  # since the reconciler last took them
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

    def allocate_slots(self, size: int, needed_by: NeededBy) -> int:
        """A slot range of `size`; when the pool has no room for it, the pool grows
        (by a quarter, up to its limit) and the range is taken from the new room. A pool at its
        limit: MapFullError naming it, as before."""
        try:
            return self.slots.allocate(size, needed_by)
        except MapFullError:
            pool = self._pool
            if pool.capacity >= pool.limit:
                raise
            # By a quarter (at least the range, in steps of GROW_STEP slots): kernel memory
            # stays within 25% of what the tables take; a grow costs a copy of the pool
            # (about 1 ms per 1 Mi slots), so a first sync that grows it ~15 times from
            # 1 MiB to 40 MiB spends well under a second on it.
            target = max(pool.capacity * 5 // 4, pool.capacity + self.slots.span(size))
            target = -(-target // GROW_STEP) * GROW_STEP
            target = min(target, pool.limit)
            target -= target % SLOTS_PER_ELEMENT
            try:
                pool.grow(target)
            except MapError as exc:
                log.warning("%s could not grow to %d slots: %s", pool.name, target, exc)
                raise MapFullError(pool.name, pool.capacity, describe(needed_by)) from exc
            self.grown.append(Grow(pool.name, self.slots.capacity, pool.capacity, pool.limit))
            self.slots.extend(pool.capacity)
            return self.slots.allocate(size, needed_by)

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
