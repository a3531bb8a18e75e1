"""The Maglev slot pool in the kernel: a BPF array of slot pairs, written and read as
memory where the kernel lets it (BPF_F_MMAPABLE): a full sync stores millions of slots,
which costs about 0.2 us each through a syscall."""

from __future__ import annotations

import contextlib
import ctypes as ct
import errno
import mmap
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ebpflb.datapath import bpfsys, contract, growable
from ebpflb.datapath.elementio import ElementIO, errno_error
from ebpflb.datapath.maps import SLOTS_PER_ELEMENT, SlotArray, SlotWrite, slot_pairs, write_one
from ebpflb.errors import MapError

if TYPE_CHECKING:
    from ebpflb.datapath.kernel import PinnedMap


class KernelSlotPool:
    """The Maglev slot pool array (two slots per element).

    Mapped into memory when the array was created with BPF_F_MMAPABLE (the maps header
    asks for it): tables are then written and read as a numpy array over the kernel's own
    pages, the way a BPF program sees them. A pool pinned without the flag (by an older
    ebpflb) is written with BPF_MAP_UPDATE_BATCH and read with BPF_MAP_LOOKUP_BATCH.
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
        self._mmap: mmap.mmap | None = None
        self._slots: SlotArray | None = None  # the mapped pool, one uint32 per slot
        if pinned.info.flags & contract.BPF_F_MMAPABLE:
            size = self.capacity * np.dtype(np.uint32).itemsize
            try:
                self._mmap = mmap.mmap(pinned.fd, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE)
            except OSError as exc:
                raise MapError(f"cannot map {pinned.path} into memory: {exc.strerror}") from exc
            self._slots = np.frombuffer(self._mmap, dtype=np.uint32, count=self.capacity)

    @property
    def mapped(self) -> bool:
        return self._slots is not None

    def grow(self, capacity: int) -> None:
        """Swap in a pool of `capacity` slots (at most `limit`) holding every slot of this
        one. The agent is the pool's only writer, so the copy is exact: a program sees the
        old pool or the new one, with the same tables."""
        if not self.capacity < capacity <= self.limit or capacity % SLOTS_PER_ELEMENT:
            raise MapError(f"{self.name}: cannot grow from {self.capacity} to {capacity} slots")
        spec = contract.MAPS[contract.MapName.SLOTS]
        fd = growable.create(spec, capacity // SLOTS_PER_ELEMENT)
        try:
            size = -(-capacity * 4 // mmap.PAGESIZE) * mmap.PAGESIZE
            with mmap.mmap(fd, size) as memory:
                new: SlotArray = np.frombuffer(memory, dtype=np.uint32, count=capacity)
                new[: self.capacity] = self.read(0, self.capacity)
                del new
            growable.swap(self.pinned.path.parent, contract.MapName.SLOTS, fd)
        except (OSError, bpfsys.BpfError) as exc:
            raise MapError(f"growing {self.name} to {capacity} slots failed: {exc}") from exc
        finally:
            os.close(fd)
        from ebpflb.datapath.kernel import PinnedMap

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
        if self._slots is not None:
            for index in fitting:
                self._store(self._slots, writes[index])
        else:
            failures.update(self._update_batch(writes, fitting))
        return dict(sorted(failures.items()))

    @staticmethod
    def _store(slots: SlotArray, write: SlotWrite) -> None:
        """Memory stores of 4-byte slots, like the kernel's own element update: a reader
        sees each slot old or new, never torn."""
        start = write.offset
        if write.changed is None:
            slots[start : start + len(write.table)] = write.table
            if len(write.table) % SLOTS_PER_ELEMENT:
                slots[start + len(write.table)] = 0  # the padding slot, as a pair write has it
        else:
            slots[start + write.changed] = write.table[write.changed]

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
        if self._slots is not None:
            view = self._slots[offset : offset + count]
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
        """Unmap the pool; views handed out keep the mapping alive until they are gone."""
        self._slots = None
        if self._mmap is not None:
            # A view still referenced keeps the mapping: it goes with the last one.
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None
