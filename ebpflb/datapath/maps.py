"""The map layer as the control plane sees it: typed entries and a Protocol.

``KernelMapSet`` (ebpflb.datapath.kernel) implements it over the pinned BPF maps;
``FakeMapSet`` here implements it over dicts for unit tests of the reconciler, with the
same capacity limits, so "map full" paths are tested without a kernel.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Network
from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from ebpflb.errors import MapFullError
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

    def delete(self, key: K) -> bool:
        """Remove the key; False (not an error) when it was absent."""

    def items(self) -> Iterator[tuple[K, V]]: ...

    def __len__(self) -> int: ...


SLOTS_PER_ELEMENT = 2  # struct lb4_slot_pair: two slots per 8-byte array element


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
        the `changed` slot indexes (a delta)."""

    def read(self, offset: int, count: int) -> SlotArray: ...


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

    def get(self, key: K) -> V | None:
        return self.data.get(key)

    def put(self, key: K, value: V) -> None:
        if key not in self.data and len(self.data) >= self.capacity:
            raise MapFullError(self.name, self.capacity, str(key))
        self.data[key] = value
        self.writes += 1

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

    def write(
        self, offset: int, table: SlotArray, changed: npt.NDArray[np.int64] | None = None
    ) -> None:
        keys, values = slot_pairs(offset, table, changed)
        pairs = self.array.reshape(-1, SLOTS_PER_ELEMENT)
        pairs[keys] = values.reshape(-1, SLOTS_PER_ELEMENT)
        self.slots_written += len(values)

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
