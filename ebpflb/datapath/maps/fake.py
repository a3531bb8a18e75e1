"""The MapSet over dicts: the reconciler's, the agent's and `maps dump`'s unit tests run
against it. Same capacity limits as the kernel maps (a full map fails the same way), and
keys whose writes fail on demand, so error paths are tested without a kernel.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Set
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from ebpflb.datapath.contract import Counter, MapName
from ebpflb.datapath.maps import (
    SLOTS_PER_ELEMENT,
    AddrPort,
    AffinityMatch,
    BackendEntry,
    ConntrackEntry,
    Flow,
    InterfaceAddresses,
    NatEntry,
    ServiceCounters,
    ServiceEntry,
    SlotArray,
    SlotWrite,
    SourceRange,
    slot_pairs,
    write_one,
)
from ebpflb.datapath.maps.family import FamilyMap, flow_family, range_family
from ebpflb.errors import MapError, MapFullError
from ebpflb.model import Frontend

K = TypeVar("K")
V = TypeVar("V")


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
    """An array of slots, written in whole pairs like the kernel's."""

    def __init__(self, name: str, capacity: int, limit: int | None = None) -> None:
        self.name = name
        self.capacity = capacity
        self.limit = capacity if limit is None else limit
        self.array: SlotArray = np.zeros(capacity, dtype=np.uint32)
        self.slots_written = 0
        self.batches = 0  # write_many calls
        self.reads = 0
        self.releases = 0  # release calls (one per apply)
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
        self.reads += 1
        return self.array[offset : offset + count].copy()

    def release(self) -> None:
        self.releases += 1

    def grow(self, capacity: int) -> None:
        if not self.capacity < capacity <= self.limit or capacity % SLOTS_PER_ELEMENT:
            raise MapError(f"{self.name}: cannot grow from {self.capacity} to {capacity} slots")
        self.array = np.concatenate([self.array, np.zeros(capacity - self.capacity, np.uint32)])
        self.capacity = capacity


class FakeServiceCounters:
    """ebpflb_svcstats over a dict; tests play the programs by adding to `data`."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.data: dict[int, ServiceCounters] = {}
        self.resets: list[int] = []
        self.failing: set[int] = set()  # ids whose reset fails (tests)

    def get(self, svc_id: int) -> ServiceCounters:
        return self.data.get(svc_id, ServiceCounters())

    def read(self, upto: int) -> dict[int, ServiceCounters]:
        return {i: c for i, c in self.data.items() if c != ServiceCounters() and 0 < i <= upto}

    def reset(self, svc_ids: Sequence[int]) -> dict[int, MapError]:
        failures: dict[int, MapError] = {}
        for index, svc_id in enumerate(svc_ids):
            if svc_id in self.failing or not 0 <= svc_id < self.capacity:
                failures[index] = MapError(f"update {self.name}[{svc_id}]: cannot reset")
                continue
            self.data.pop(svc_id, None)
            self.resets.append(svc_id)
        return failures


class FakeMapSet:
    """All maps in memory; the reconciler's unit tests run against it."""

    def __init__(
        self,
        max_services: int = 1024,
        max_backends: int = 1024,
        slot_pool_size: int = 1 << 20,
        slot_pool_limit: int | None = None,
        src_range_max: int = 1024,
        ct_max: int = 1024,
        rnat_max: int = 1024,
        affinity_max: int = 1024,
    ) -> None:
        self.services: FakeMap[Frontend, ServiceEntry] = FakeMap(
            MapName.SERVICES.value, max_services
        )
        self.backends: FakeMap[int, BackendEntry] = FakeMap(MapName.BACKENDS.value, max_backends)
        self.service_meta: FakeMap[int, str] = FakeMap(MapName.SERVICE_META.value, max_services)
        self.slots = FakeSlotPool(MapName.SLOTS.value, slot_pool_size, slot_pool_limit)
        # Each family's twin on its own, as in the kernel (own names, own capacities).
        self.source_ranges4: FakeMap[SourceRange, int] = FakeMap(
            MapName.SOURCE_RANGES.value, src_range_max
        )
        self.source_ranges6: FakeMap[SourceRange, int] = FakeMap(
            MapName.SOURCE_RANGES6.value, src_range_max
        )
        self.source_ranges = FamilyMap(self.source_ranges4, self.source_ranges6, range_family)
        self.conntrack4: FakeMap[Flow, ConntrackEntry] = FakeMap(MapName.CONNTRACK.value, ct_max)
        self.conntrack6: FakeMap[Flow, ConntrackEntry] = FakeMap(MapName.CONNTRACK6.value, ct_max)
        self.conntrack = FamilyMap(self.conntrack4, self.conntrack6, flow_family)
        self.reply_nat4: FakeMap[Flow, NatEntry] = FakeMap(MapName.REPLY_NAT.value, rnat_max)
        self.reply_nat6: FakeMap[Flow, NatEntry] = FakeMap(MapName.REPLY_NAT6.value, rnat_max)
        self.reply_nat = FamilyMap(self.reply_nat4, self.reply_nat6, flow_family)
        self.iface_addrs = InterfaceAddresses()
        self.iface_mtus: dict[int, int] = {}
        self.service_counters = FakeServiceCounters(MapName.SERVICE_STATS.value, max_services + 1)
        self.affinity_match: FakeMap[AffinityMatch, int] = FakeMap(
            MapName.AFFINITY_MATCH.value, affinity_max
        )
        self.stats: dict[Counter, int] = {}  # what the programs would have counted
        # What destroy_udp_sockets was asked (no sockets here): frontend -> backends left.
        self.destroy_requests: list[dict[AddrPort, frozenset[AddrPort]]] = []

    def interface_addresses(self) -> InterfaceAddresses:
        return self.iface_addrs

    def interface_mtus(self) -> dict[int, int]:
        return dict(self.iface_mtus)

    def counters(self) -> dict[str, int]:
        return {counter.label: self.stats.get(counter, 0) for counter in Counter}

    def destroy_udp_sockets(self, left: Mapping[AddrPort, Set[AddrPort]]) -> int:
        self.destroy_requests.append({f: frozenset(b) for f, b in left.items()})
        return 0
