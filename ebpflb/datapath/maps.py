"""The map layer as the control plane sees it: typed entries and a Protocol.

``KernelMapSet`` (ebpflb.datapath.kernel) implements it over the pinned BPF maps;
``FakeMapSet`` here implements it over dicts for unit tests of the reconciler, with the
same capacity limits, so "map full" paths are tested without a kernel.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network
from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from ebpflb.errors import MapError, MapFullError
from ebpflb.model import Backend, BackendFlags, Frontend, SvcFlags

K = TypeVar("K")
V = TypeVar("V")

SlotArray = npt.NDArray[np.uint32]


class MapName(enum.StrEnum):
    """Pinned map names (bpf/lib/maps.h); also the file names under the bpffs directory."""

    SERVICES = "ebpflb_svc4"
    BACKENDS = "ebpflb_be4"
    SLOTS = "ebpflb_slots"
    SERVICE_META = "ebpflb_svcmeta"
    REVERSE_SOCK = "ebpflb_revsk4"
    STATS = "ebpflb_stats"
    CONNTRACK = "ebpflb_ct4"
    REPLY_NAT = "ebpflb_rnat4"
    SOURCE_RANGES = "ebpflb_srcrng4"
    IFACE_ADDRS = "ebpflb_ifaddr4"


@dataclass(frozen=True, slots=True)
class ServiceEntry:
    """Value of ebpflb_svc4 (struct lb4_svc_val). table_size == 0 means "refuse"."""

    svc_id: int
    table_off: int
    table_size: int
    backend_count: int
    flags: SvcFlags


@dataclass(frozen=True, slots=True)
class BackendEntry:
    """Value of ebpflb_be4 (struct lb4_backend)."""

    backend: Backend
    flags: BackendFlags = BackendFlags.NONE


@dataclass(frozen=True, slots=True, order=True)
class SourceRange:
    """Key of ebpflb_srcrng4: a prefix allowed to reach one LoadBalancer frontend."""

    svc_id: int
    network: IPv4Network


class KeyValueMap(Protocol[K, V]):
    """One BPF hash map with typed keys and values."""

    @property
    def name(self) -> str: ...

    @property
    def capacity(self) -> int: ...

    def get(self, key: K) -> V | None: ...

    def put(self, key: K, value: V) -> None:
        """Insert or replace; MapFullError when inserting into a full map."""

    def put_many(self, items: Sequence[tuple[K, V]]) -> dict[int, MapError]:
        """Insert or replace every item, in order, in as few syscalls as the kernel allows.

        Never raises for one item: the items that failed, by index, each with the error
        `put` would have raised (MapFullError for a full map). Every other item is written.
        """

    def delete(self, key: K) -> bool:
        """Remove the key; False (not an error) when it was absent."""

    def items(self) -> Iterator[tuple[K, V]]: ...

    def __len__(self) -> int: ...


SLOTS_PER_ELEMENT = 2  # struct lb4_slot_pair: two slots per 8-byte array element


@dataclass(frozen=True, slots=True)
class SlotWrite:
    """One table to store at `offset` (even): all of it, or only the elements holding the
    `changed` slot indexes (a delta)."""

    offset: int
    table: SlotArray
    changed: npt.NDArray[np.int64] | None = None


class SlotPool(Protocol):
    """The Maglev slot pool: backend ids, stored two per element (struct lb4_slot_pair).

    Tables start at even slots; writes go by whole elements, so a table's last element
    carries a padding slot that is never read (lookups stay below the table size)."""

    @property
    def name(self) -> str: ...

    @property
    def capacity(self) -> int:
        """Slots (twice the array's elements)."""
        ...

    def write(
        self, offset: int, table: SlotArray, changed: npt.NDArray[np.int64] | None = None
    ) -> None:
        """Store the table at `offset` (even): all of it, or only the elements holding
        the `changed` slot indexes (a delta). MapError if it cannot."""

    def write_many(self, writes: Sequence[SlotWrite]) -> dict[int, MapError]:
        """Every write, in as few syscalls as possible; the ones that failed, by index (a
        failed write may be partly stored: its range must not be used). Never raises."""

    def read(self, offset: int, count: int) -> SlotArray:
        """The slots as they are now: a copy, or a read-only view of the pool that follows
        later writes (so read again rather than keep it across a write of the range)."""
        ...


def slot_pairs(
    offset: int, table: SlotArray, changed: npt.NDArray[np.int64] | None
) -> tuple[npt.NDArray[np.uint32], SlotArray]:
    """(element indexes, their slot values flattened in pairs) for a SlotPool write."""
    if offset % SLOTS_PER_ELEMENT:
        raise ValueError(f"slot table offset {offset} is not even")
    padded = np.zeros(len(table) + len(table) % SLOTS_PER_ELEMENT, dtype=np.uint32)
    padded[: len(table)] = table
    pairs = padded.reshape(-1, SLOTS_PER_ELEMENT)
    index = (
        np.arange(len(pairs), dtype=np.int64)
        if changed is None
        else np.unique(np.asarray(changed, dtype=np.int64) // SLOTS_PER_ELEMENT)
    )
    keys = (index + offset // SLOTS_PER_ELEMENT).astype(np.uint32)
    return keys, np.ascontiguousarray(pairs[index]).reshape(-1)


def write_one(pool: SlotPool, write: SlotWrite) -> None:
    """`SlotPool.write` in terms of `write_many`, raising its error."""
    failures = pool.write_many([write])
    if failures:
        raise failures[0]


class MapSet(Protocol):
    """Every map the control plane writes."""

    @property
    def services(self) -> KeyValueMap[Frontend, ServiceEntry]: ...

    @property
    def backends(self) -> KeyValueMap[int, BackendEntry]: ...

    @property
    def service_meta(self) -> KeyValueMap[int, str]: ...

    @property
    def slots(self) -> SlotPool: ...

    @property
    def source_ranges(self) -> KeyValueMap[SourceRange, int]: ...

    def counters(self) -> dict[str, int]:
        """Datapath event counters summed over CPUs (bpf/lib/consts.h STAT_*)."""
        ...


class FakeMap(Generic[K, V]):
    """Dict-backed KeyValueMap with a capacity, like a BPF hash map."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.data: dict[K, V] = {}
        self.writes = 0
        self.deletes = 0
        self.batches = 0  # put_many calls
        self.failing: set[K] = set()  # keys whose writes fail (tests inject errors)

    def get(self, key: K) -> V | None:
        return self.data.get(key)

    def put(self, key: K, value: V) -> None:
        if key in self.failing:
            raise MapError(f"update {self.name}[{key}]: injected failure")
        if key not in self.data and len(self.data) >= self.capacity:
            raise MapFullError(self.name, self.capacity, str(key))
        self.data[key] = value
        self.writes += 1

    def put_many(self, items: Sequence[tuple[K, V]]) -> dict[int, MapError]:
        self.batches += 1
        failures: dict[int, MapError] = {}
        for index, (key, value) in enumerate(items):
            try:
                self.put(key, value)
            except MapError as exc:
                failures[index] = exc
        return failures

    def delete(self, key: K) -> bool:
        self.deletes += 1
        return self.data.pop(key, None) is not None

    def items(self) -> Iterator[tuple[K, V]]:
        return iter(list(self.data.items()))

    def __len__(self) -> int:
        return len(self.data)


class FakeSlotPool:
    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.array: SlotArray = np.zeros(capacity, dtype=np.uint32)
        self.slots_written = 0
        self.batches = 0  # write_many calls
        self.failing: set[int] = set()  # table offsets whose writes fail (tests)

    def write(
        self, offset: int, table: SlotArray, changed: npt.NDArray[np.int64] | None = None
    ) -> None:
        write_one(self, SlotWrite(offset, table, changed))

    def write_many(self, writes: Sequence[SlotWrite]) -> dict[int, MapError]:
        self.batches += 1
        failures: dict[int, MapError] = {}
        pairs = self.array.reshape(-1, SLOTS_PER_ELEMENT)
        for index, write in enumerate(writes):
            keys, values = slot_pairs(write.offset, write.table, write.changed)
            if len(keys) and (int(keys.max()) >= len(pairs) or write.offset in self.failing):
                failures[index] = MapError(
                    f"{self.name}: cannot write {len(write.table)} slots at {write.offset}"
                )
                continue
            pairs[keys] = values.reshape(-1, SLOTS_PER_ELEMENT)
            self.slots_written += len(values)
        return failures

    def read(self, offset: int, count: int) -> SlotArray:
        return self.array[offset : offset + count].copy()


class FakeMapSet:
    """All maps in memory; the reconciler's unit tests run against it."""

    def __init__(
        self,
        max_services: int = 1024,
        max_backends: int = 1024,
        slot_pool_size: int = 1 << 20,
        src_range_max: int = 1024,
    ) -> None:
        self.services: FakeMap[Frontend, ServiceEntry] = FakeMap(
            MapName.SERVICES.value, max_services
        )
        self.backends: FakeMap[int, BackendEntry] = FakeMap(MapName.BACKENDS.value, max_backends)
        self.service_meta: FakeMap[int, str] = FakeMap(MapName.SERVICE_META.value, max_services)
        self.slots = FakeSlotPool(MapName.SLOTS.value, slot_pool_size)
        self.source_ranges: FakeMap[SourceRange, int] = FakeMap(
            MapName.SOURCE_RANGES.value, src_range_max
        )

    def counters(self) -> dict[str, int]:
        return {}
