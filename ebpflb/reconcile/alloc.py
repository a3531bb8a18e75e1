"""Allocators for the dense ids and slot ranges the maps are keyed by. Pure.

Both can be rebuilt from what is in the pinned maps (``reserve``), so a restarted agent
keeps every id and range and rewrites nothing.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable

from ebpflb.errors import MapFullError

# Who needs the room, for the error when there is none; a callable is only called then
# (formatting a service and frontend name for each of 100,000 allocations is not free).
NeededBy = str | Callable[[], str]


def describe(needed_by: NeededBy) -> str:
    return needed_by if isinstance(needed_by, str) else needed_by()


class IdAllocator:
    """Lowest-free ids in [1, limit]; 0 is never handed out (an all-zero value is "none").

    Which ids are in use is a bitmap of `limit` bytes, not a set: 400,000 ids in a set
    cost 20 MiB."""

    def __init__(self, map_name: str, limit: int) -> None:
        self.map_name = map_name
        self.limit = limit
        self._next = 1
        self._free: list[int] = []  # released ids below _next, a heap (may hold stale ones)
        self._used = bytearray(limit + 1)
        self._count = 0

    def allocate(self, needed_by: NeededBy) -> int:
        while self._free:
            candidate = heapq.heappop(self._free)
            if not self._used[candidate]:
                self._take(candidate)
                return candidate
        while self._next <= self.limit and self._used[self._next]:
            self._next += 1
        if self._next > self.limit:
            raise MapFullError(self.map_name, self.limit, describe(needed_by))
        self._take(self._next)
        self._next += 1
        return self._next - 1

    def reserve(self, ident: int) -> None:
        if 0 < ident <= self.limit and not self._used[ident]:
            self._take(ident)

    def release(self, ident: int) -> None:
        if 0 < ident <= self.limit and self._used[ident]:
            self._used[ident] = 0
            self._count -= 1
            heapq.heappush(self._free, ident)

    def _take(self, ident: int) -> None:
        self._used[ident] = 1
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def __contains__(self, ident: object) -> bool:
        return isinstance(ident, int) and 0 < ident <= self.limit and bool(self._used[ident])


class SlotAllocator:
    """First-fit ranges of the slot pool, with free neighbours merged on release.

    Ranges start at multiples of `align` and are padded to a multiple of it (the pool
    stores slots in pairs, and no pair may be shared by two tables)."""

    def __init__(self, map_name: str, capacity: int, align: int = 1) -> None:
        self.map_name = map_name
        self.align = align
        self.capacity = capacity - capacity % align
        self._starts: list[int] = [0]  # free extents, sorted by start
        self._lengths: dict[int, int] = {0: self.capacity}
        self.used = 0

    def span(self, size: int) -> int:
        """Slots a range of `size` really takes."""
        return -(-size // self.align) * self.align

    def allocate(self, size: int, needed_by: NeededBy) -> int:
        size = self.span(size)
        for start in self._starts:
            length = self._lengths[start]
            if length >= size:
                self._take(start, size)
                return start
        raise MapFullError(
            self.map_name,
            self.capacity,
            f"{describe(needed_by)} ({size} slots; {self.capacity - self.used} free but fragmented"
            f" or too few)",
        )

    def reserve(self, start: int, size: int) -> None:
        """Mark [start, start+size) used (restoring from the maps); it must be free."""
        size = self.span(size)
        if start % self.align:
            raise ValueError(f"slot range {start}+{size} is not aligned to {self.align}")
        index = bisect.bisect_right(self._starts, start) - 1
        if index < 0:
            raise ValueError(f"slot range {start}+{size} overlaps a used range")
        extent = self._starts[index]
        length = self._lengths[extent]
        if start + size > extent + length:
            raise ValueError(f"slot range {start}+{size} overlaps a used range")
        del self._starts[index]
        del self._lengths[extent]
        if start > extent:
            self._insert(extent, start - extent)
        if extent + length > start + size:
            self._insert(start + size, extent + length - start - size)
        self.used += size

    def release(self, start: int, size: int) -> None:
        size = self.span(size)
        index = bisect.bisect_left(self._starts, start)
        end = start + size
        # Merge with the following and the preceding free extent when adjacent.
        if index < len(self._starts) and self._starts[index] == end:
            following = self._starts.pop(index)
            end += self._lengths.pop(following)
        if index > 0:
            previous = self._starts[index - 1]
            if previous + self._lengths[previous] == start:
                self._lengths[previous] = end - previous
                self.used -= size
                return
        self._insert(start, end - start)
        self.used -= size

    def extend(self, capacity: int) -> None:
        """The pool grew to `capacity`: the new room is free (merged with a free tail)."""
        capacity -= capacity % self.align
        if capacity <= self.capacity:
            return
        old, self.capacity = self.capacity, capacity
        self.used += capacity - old  # release() takes it off again
        self.release(old, capacity - old)

    def _take(self, start: int, size: int) -> None:
        length = self._lengths.pop(start)
        self._starts.remove(start)
        if length > size:
            self._insert(start + size, length - size)
        self.used += size

    def _insert(self, start: int, length: int) -> None:
        bisect.insort(self._starts, start)
        self._lengths[start] = length

    def largest_free(self) -> int:
        return max(self._lengths.values(), default=0)
