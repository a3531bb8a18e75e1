"""The kernel slot pool's memory mapping, over a file standing in for the array's fd (a
shared file mapping behaves as the kernel's does for these reads and writes): writes
land whether they go through a window or the whole pool, and after `release` the pool
holds no mapping yet still reads and writes right."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from ebpflb.datapath import contract
from ebpflb.datapath.maps import SlotWrite
from ebpflb.datapath.maps.pinned import PinnedMap
from ebpflb.datapath.maps.slotpool import KernelSlotPool
from ebpflb.datapath.syscall.bpfsys import MapInfo

SLOTS = 64 * 1024  # 256 KiB: 64 pages
PAGE_SLOTS = mmap.PAGESIZE // 4


class FilePin:
    """What KernelSlotPool reads of a PinnedMap, over a file of the pool's size."""

    def __init__(self, path: Path, slots: int) -> None:
        self.path = path
        self.name = path.name
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT)
        os.ftruncate(self.fd, slots * 4)
        self.capacity = slots // 2
        self.info = MapInfo(2, 1, 4, 8, self.capacity, contract.BPF_F_MMAPABLE, self.name)

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def pin(tmp_path: Path) -> Iterator[FilePin]:
    pinned = FilePin(tmp_path / "ebpflb_slots", SLOTS)
    yield pinned
    pinned.close()


def pool_of(pin: FilePin) -> KernelSlotPool:
    return KernelSlotPool(cast(PinnedMap, pin))


def on_disk(pin: FilePin, offset: int, count: int) -> list[int]:
    data = os.pread(pin.fd, count * 4, offset * 4)
    return np.frombuffer(data, dtype=np.uint32).tolist()


def test_a_few_writes_map_windows_and_hold_nothing_after(pin: FilePin) -> None:
    pool = pool_of(pin)
    table = np.arange(1, 102, dtype=np.uint32)  # odd: a padding slot after it
    at = 3 * PAGE_SLOTS - 50  # across a page boundary
    assert pool.write_many([SlotWrite(at, table), SlotWrite(10, table[:4])]) == {}
    assert not pool.holds_mapping
    assert on_disk(pin, at, 102) == [*table.tolist(), 0]
    assert on_disk(pin, 10, 4) == [1, 2, 3, 4]
    changed = table.copy()
    changed[[0, 100]] = 77
    pool.write(at, changed, np.array([0, 100]))
    view = pool.read(at, 101)
    assert view.tolist() == changed.tolist() and not view.flags.writeable
    assert not pool.holds_mapping


def test_many_accesses_map_the_pool_once_and_release_unmaps_it(pin: FilePin) -> None:
    pool = pool_of(pin)
    writes = [SlotWrite(k * 128, np.full(101, k + 1, np.uint32)) for k in range(200)]
    assert len(writes) > pool.window_budget
    assert pool.write_many(writes) == {}
    assert pool.holds_mapping
    assert all(pool.read(k * 128, 101).tolist() == [k + 1] * 101 for k in range(200))
    kept = pool.read(5 * 128, 2)
    pool.release()
    assert not pool.holds_mapping
    assert kept.tolist() == [6, 6]  # a view handed out keeps its mapping
    pool.write(5 * 128, np.array([9, 8], dtype=np.uint32))
    assert kept.tolist() == [9, 8]  # ... of the same pages
    assert on_disk(pin, 199 * 128, 101) == [200] * 101
    pool.close()


def test_reads_past_the_window_budget_map_the_whole_pool(pin: FilePin) -> None:
    pool = pool_of(pin)
    for k in range(pool.window_budget):
        pool.read(k * 2, 2)
    assert not pool.holds_mapping
    pool.read(0, 2)
    assert pool.holds_mapping
    pool.release()
    pool.read(0, 2)  # a new budget after a release
    assert not pool.holds_mapping


def test_out_of_range_writes_fail_alone_and_reads_stop_at_the_end(pin: FilePin) -> None:
    pool = pool_of(pin)
    table = np.arange(1, 5, dtype=np.uint32)
    failures = pool.write_many(
        [SlotWrite(SLOTS - 2, table), SlotWrite(3, table), SlotWrite(SLOTS - 4, table)]
    )
    assert sorted(failures) == [0, 1]
    assert pool.read(SLOTS - 4, 10).tolist() == [1, 2, 3, 4]
    assert pool.read(SLOTS, 4).tolist() == []
