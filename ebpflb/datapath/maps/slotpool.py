"""The Maglev slot pool in the kernel: a BPF array of slot pairs, written and read as
memory where the kernel lets it (BPF_F_MMAPABLE): a full sync stores millions of slots,
which costs about 0.2 us each through a syscall.

The pool is mapped only while a sync uses it (`release` after each): the kernel maps every
page of a mapping at mmap time, and those pages count in the agent's RSS for as long as
it holds them (~389 MiB at 100,000 services x 10 endpoints). A sync touching a few tables
maps just their pages, one short-lived window per access; one touching many maps the
whole pool once, which is cheaper than thousands of windows.
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import errno
import mmap
import os
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ebpflb.datapath import contract
from ebpflb.datapath.maps import (
    SLOTS_PER_ELEMENT,
    SlotArray,
    SlotWrite,
    growable,
    slot_pairs,
    write_one,
)
from ebpflb.datapath.maps.elementio import ElementIO, errno_error
from ebpflb.datapath.maps.pinned import PinnedMap
from ebpflb.datapath.syscall import bpfsys
from ebpflb.errors import MapError

SLOT_BYTES = np.dtype(np.uint32).itemsize
# Windows a sync may map before the whole pool is mapped instead: a window (mmap and
# munmap) costs ~8 us, mapping the pool ~0.4 us per page (a loaded 2-core machine: 32 MiB
# in 3 ms, 256 MiB in 26 ms), so the budget grows with the pool (and a restore reading
# 10,000 tables maps it once).
MIN_WINDOWS = 16
PAGES_PER_WINDOW = 32


def _pages(nbytes: int) -> int:
    return -(-nbytes // mmap.PAGESIZE)


class KernelSlotPool:
    """The Maglev slot pool array (two slots per element).

    Written and read as memory when the array was created with BPF_F_MMAPABLE (the maps
    header asks for it): numpy arrays over the kernel's own pages, the way a BPF program
    sees them. A pool pinned without the flag (by an older ebpflb) is written with
    BPF_MAP_UPDATE_BATCH and read with BPF_MAP_LOOKUP_BATCH.
    """

    def __init__(self, pinned: PinnedMap, limit: int | None = None) -> None:
        self.name = pinned.name
        self._open(pinned)
        # Slots the pool may grow to (growable.py); None: it stays as it is (a reader).
        self.limit = self.capacity if limit is None else max(limit, self.capacity)

    def _open(self, pinned: PinnedMap) -> None:
        self.pinned = pinned
        self.capacity = pinned.capacity * SLOTS_PER_ELEMENT
        self.io = ElementIO(pinned.fd, pinned.name, pinned.info.key_size, pinned.info.value_size)
        self._mmapable = bool(pinned.info.flags & contract.BPF_F_MMAPABLE)
        self._mmap: mmap.mmap | None = None  # the whole pool, while a sync needs it
        self._slots: SlotArray | None = None  # over _mmap, one uint32 per slot
        self._windows = 0  # mapped since the last release
        pages = _pages(self.capacity * SLOT_BYTES)
        self.window_budget = max(MIN_WINDOWS, pages // PAGES_PER_WINDOW)

    @property
    def mapped(self) -> bool:
        """Written and read as memory (else through batched syscalls)."""
        return self._mmapable

    @property
    def holds_mapping(self) -> bool:
        """Whether the whole pool is mapped now (until `release`)."""
        return self._slots is not None

    def _map(self, offset: int, count: int) -> tuple[mmap.mmap, SlotArray]:
        """A shared mapping of the pages holding slots [offset, offset + count), and the
        view of exactly those slots."""
        first_page = offset * SLOT_BYTES // mmap.PAGESIZE
        end_page = _pages((offset + count) * SLOT_BYTES)
        try:
            memory = mmap.mmap(
                self.pinned.fd,
                (end_page - first_page) * mmap.PAGESIZE,
                offset=first_page * mmap.PAGESIZE,
            )
        except OSError as exc:
            raise MapError(f"cannot map {self.pinned.path} into memory: {exc.strerror}") from exc
        skip = offset * SLOT_BYTES - first_page * mmap.PAGESIZE
        view: SlotArray = np.frombuffer(memory, dtype=np.uint32, count=count, offset=skip)
        return memory, view

    def _whole(self) -> SlotArray:
        if self._slots is None:
            self._mmap, self._slots = self._map(0, self.capacity)
        return self._slots

    def _span(self, offset: int, count: int) -> SlotArray:
        """Slots [offset, offset + count) as memory: of the whole mapping if it is held or
        the window budget is spent, else of a window of their own (unmapped with the
        last reference to the view). Past the pool's end: what there is, as a slice."""
        count = max(0, min(count, self.capacity - offset))
        if count == 0:
            return np.zeros(0, dtype=np.uint32)
        if self._slots is None and self._windows < self.window_budget:
            self._windows += 1
            return self._map(offset, count)[1]
        return self._whole()[offset : offset + count]

    def release(self) -> None:
        """Unmap the pool (the next access maps what it needs again): called after each
        sync, so that the kernel's pages are not held in between."""
        self._slots = None
        if self._mmap is not None:
            # A view still referenced keeps the mapping: it goes with the last one.
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None
        self._windows = 0

    def grow(self, capacity: int) -> None:
        """Swap in a pool of `capacity` slots (at most `limit`) holding every slot of this
        one. The agent is the pool's only writer, so the copy is exact: a program sees the
        old pool or the new one, with the same tables."""
        if not self.capacity < capacity <= self.limit or capacity % SLOTS_PER_ELEMENT:
            raise MapError(f"{self.name}: cannot grow from {self.capacity} to {capacity} slots")
        spec = contract.MAPS[contract.MapName.SLOTS]
        fd = growable.create(spec, capacity // SLOTS_PER_ELEMENT)
        try:
            size = _pages(capacity * SLOT_BYTES) * mmap.PAGESIZE
            with mmap.mmap(fd, size) as memory:
                new: SlotArray = np.frombuffer(memory, dtype=np.uint32, count=capacity)
                new[: self.capacity] = self.read(0, self.capacity)
                del new
            growable.swap(self.pinned.path.parent, contract.MapName.SLOTS, fd)
        except (OSError, bpfsys.BpfError) as exc:
            raise MapError(f"growing {self.name} to {capacity} slots failed: {exc}") from exc
        finally:
            os.close(fd)
        old = self.pinned
        self.close()
        old.close()
        self._open(PinnedMap(old.path))

    def write(
        self, offset: int, table: SlotArray, changed: npt.NDArray[np.int64] | None = None
    ) -> None:
        write_one(self, SlotWrite(offset, table, changed))

    def write_many(self, writes: Sequence[SlotWrite]) -> dict[int, MapError]:
        failures: dict[int, MapError] = {}
        fitting = []
        for index, write in enumerate(writes):
            if write.offset % SLOTS_PER_ELEMENT:
                failures[index] = MapError(f"{self.name}: table offset {write.offset} is odd")
            elif write.offset + len(write.table) > self.capacity:
                failures[index] = MapError(
                    f"{self.name}: slot {write.offset + len(write.table)} beyond capacity"
                    f" {self.capacity}"
                )
            else:
                fitting.append(index)
        if not self._mmapable:
            failures.update(self._update_batch(writes, fitting))
            return dict(sorted(failures.items()))
        if len(fitting) > self.window_budget - self._windows:
            self._whole()  # cheaper than a window each
        for index in fitting:
            write = writes[index]
            # Whole pairs, as the kernel's element update: an odd table's padding slot too.
            padded = len(write.table) + len(write.table) % SLOTS_PER_ELEMENT
            try:
                self._store(self._span(write.offset, padded), write)
            except MapError as exc:
                failures[index] = exc
        return dict(sorted(failures.items()))

    @staticmethod
    def _store(slots: SlotArray, write: SlotWrite) -> None:
        """Memory stores of 4-byte slots into `slots` (the table's own, from its offset),
        like the kernel's own element update: a reader sees each slot old or new, never
        torn."""
        if write.changed is None:
            slots[: len(write.table)] = write.table
            if len(write.table) % SLOTS_PER_ELEMENT:
                slots[len(write.table)] = 0  # the padding slot, as a pair write has it
        else:
            slots[write.changed] = write.table[write.changed]

    def _update_batch(self, writes: Sequence[SlotWrite], indexes: list[int]) -> dict[int, MapError]:
        """All the writes' elements in one BPF_MAP_UPDATE_BATCH (more after a failure)."""
        if not indexes:
            return {}
        pairs = [slot_pairs(writes[i].offset, writes[i].table, writes[i].changed) for i in indexes]
        keys = np.concatenate([k for k, _ in pairs])
        values = np.concatenate([v for _, v in pairs])
        ends = np.cumsum([len(k) for k, _ in pairs])  # element after each write's last

        def after_write_of(element: int) -> int:
            """The next write's first element: the rest of a failed write is not needed."""
            return int(ends[np.searchsorted(ends, element, side="right")])

        errors = self.io.update(
            keys.ctypes.data, values.ctypes.data, len(keys), resume=after_write_of
        )
        failures = {}
        for element, err in errors.items():
            index = indexes[int(np.searchsorted(ends, element, side="right"))]
            failures[index] = errno_error(
                f"batch update of {len(writes[index].table)} slots at {writes[index].offset}"
                f" in {self.name}",
                err,
            )
        return failures

    def read(self, offset: int, count: int) -> SlotArray:
        if self._mmapable:
            view = self._span(offset, count)
            view.flags.writeable = False
            return view
        return self._read_batch(offset, count)

    def _read_batch(self, offset: int, count: int) -> SlotArray:
        if count == 0:
            return np.zeros(0, dtype=np.uint32)
        first = offset // SLOTS_PER_ELEMENT
        n_pairs = (offset + count + 1) // SLOTS_PER_ELEMENT - first
        keys = np.zeros(n_pairs, dtype=np.uint32)
        values: SlotArray = np.zeros(n_pairs * SLOTS_PER_ELEMENT, dtype=np.uint32)
        # A batch lookup starts at the key *after* in_batch (NULL: at key 0); ENOENT means
        # it reached the array's end.
        in_batch = ct.c_uint32(first - 1)
        out_batch = ct.c_uint32(0)
        err, n = bpfsys.lookup_batch(
            self.pinned.fd,
            ct.addressof(in_batch) if first else 0,
            ct.addressof(out_batch),
            keys.ctypes.data,
            values.ctypes.data,
            n_pairs,
        )
        if err and err != errno.ENOENT:
            raise errno_error(f"batch lookup of {n_pairs} slot pairs in {self.name}", err)
        if n != n_pairs:
            raise MapError(f"{self.name}: read {n} of {n_pairs} slot pairs at {offset}")
        start = offset - first * SLOTS_PER_ELEMENT
        return values[start : start + count].copy()

    def close(self) -> None:
        """Unmap the pool; views handed out keep their mapping alive until they are gone."""
        self.release()
