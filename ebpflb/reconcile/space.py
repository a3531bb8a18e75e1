"""The room frontends take besides backends: service ids, Maglev slot ranges and
source-range entries.

A slot range a frontend stopped using (it was removed, or its table moved) is kept one
sync in quarantine before it is reused: a BPF program that read the old service entry
may still index the old range while the sync that replaced it runs.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from ebpflb.datapath.maps import SLOTS_PER_ELEMENT, MapSet, SlotPool
from ebpflb.errors import MapError, MapFullError
from ebpflb.model import IPNetwork
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
        # Each family's source ranges have a map of their own (ebpflb_srcrng4/6), and a
        # capacity of their own: counted apart, so one family's cannot crowd out the other's.
        self._range_maps = {
            family: (maps.source_ranges.twin(family).name, maps.source_ranges.twin(family).capacity)
            for family in (4, 6)
        }
        self.range_counts = {4: 0, 6: 0}  # source-range entries written or reserved, by family

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

    @property
    def range_count(self) -> int:
        """Source-range entries written or reserved, both families."""
        return sum(self.range_counts.values())

    def reserve_ranges(self, networks: Collection[IPNetwork], needed_by: NeededBy) -> None:
        """Room for these source ranges in their families' maps (LPM tries cannot say how
        full they are): all of them, or none (MapFullError naming the full map)."""
        wanted = Counter(network.version for network in networks)
        for family, count in wanted.items():
            name, capacity = self._range_maps[family]
            if self.range_counts[family] + count > capacity:
                raise MapFullError(
                    name, capacity, f"{count} source ranges of {describe(needed_by)}"
                )
        for family, count in wanted.items():
            self.range_counts[family] += count

    def release_ranges(self, networks: Iterable[IPNetwork]) -> None:
        """Source ranges deleted, or reserved and then not written."""
        for network in networks:
            self.range_counts[network.version] -= 1

    def count_ranges(self, networks: Iterable[IPNetwork]) -> None:
        """The source ranges the maps hold (restore): the counts start from them."""
        self.range_counts = {4: 0, 6: 0}
        for network in networks:
            self.range_counts[network.version] += 1
