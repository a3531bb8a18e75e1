"""An IPv4 map and its IPv6 twin seen as one KeyValueMap, so the reconciler, `maps dump`
and `explain` read and write frontends, backends, source ranges, conntrack and reply NAT
of both families through one interface (ebpflb.datapath.maps.kernel builds them over the
pinned maps, ebpflb.datapath.maps.fake over dicts)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from ebpflb.datapath.maps import BackendEntry, Flow, KeyValueMap, SourceRange
from ebpflb.errors import MapError
from ebpflb.model import Frontend

K = TypeVar("K")
V = TypeVar("V")


class FamilyMap(Generic[K, V]):
    """An IPv4 map and its IPv6 twin seen as one KeyValueMap (ebpflb_svc4 + ebpflb_svc6,
    ebpflb_be4 + ebpflb_be6), so the reconciler writes frontends and backends of both
    families through one interface. `family(key, value)` says where an item goes: 4 or 6,
    or 0 when the key alone does not say (a backend id: ids are one space over both
    arrays); `get` and `delete` then try both. Named and sized as the IPv4 map: for
    frontends and backends the families share one capacity (service ids, backend ids);
    where each twin has its own (source ranges, conntrack, reply NAT), `v4` and `v6` say
    it, and a full twin's MapFullError names that twin."""

    def __init__(
        self,
        v4: KeyValueMap[K, V],
        v6: KeyValueMap[K, V],
        family: Callable[[K, V | None], int],
    ) -> None:
        self.v4 = v4
        self.v6 = v6
        self._family = family

    @property
    def name(self) -> str:
        return self.v4.name

    def twin(self, family: int) -> KeyValueMap[K, V]:
        if family not in (4, 6):
            raise ValueError(f"{self.v4.name}: no twin for address family {family}")
        return self.v4 if family == 4 else self.v6

    @property
    def capacity(self) -> int:
        return self.v4.capacity

    def _maps(self, key: K, value: V | None) -> tuple[KeyValueMap[K, V], ...]:
        family = self._family(key, value)
        if family == 4:
            return (self.v4,)
        return (self.v6,) if family == 6 else (self.v4, self.v6)

    def get(self, key: K) -> V | None:
        for table in self._maps(key, None):
            value = table.get(key)
            if value is not None:
                return value
        return None

    def put(self, key: K, value: V) -> None:
        self._maps(key, value)[0].put(key, value)

    def put_many(self, items: Sequence[tuple[K, V]]) -> dict[int, MapError]:
        v6 = [i for i, (key, value) in enumerate(items) if self._family(key, value) == 6]
        if not v6:
            return self.v4.put_many(items)  # the usual case: no IPv6 at all
        wanted = set(v6)
        v4 = [i for i in range(len(items)) if i not in wanted]
        failures: dict[int, MapError] = {}
        for table, indexes in ((self.v4, v4), (self.v6, v6)):
            if indexes:
                errors = table.put_many([items[i] for i in indexes])
                failures.update({indexes[j]: error for j, error in errors.items()})
        return failures

    def delete(self, key: K) -> bool:
        deleted = False
        for table in self._maps(key, None):
            deleted = table.delete(key) or deleted
        return deleted

    def items(self) -> Iterator[tuple[K, V]]:
        return itertools.chain(self.v4.items(), self.v6.items())

    def __len__(self) -> int:
        return len(self.v4) + len(self.v6)


def frontend_family(frontend: Frontend, _: object = None) -> int:
    """Where a frontend's entry lives: ebpflb_svc4 (4) or ebpflb_svc6 (6)."""
    return frontend.address.version


def backend_family(_: int, entry: BackendEntry | None) -> int:
    """Where a backend id's entry lives: known from the entry being written, else either."""
    return entry.backend.address.version if entry is not None else 0


def flow_family(flow: Flow, _: object = None) -> int:
    """Where a flow's conntrack or reply-NAT entry lives: ebpflb_ct4/rnat4 (4) or
    ebpflb_ct6/rnat6 (6)."""
    return flow.source.address.version


def range_family(source_range: SourceRange, _: object = None) -> int:
    """Where a source range lives: ebpflb_srcrng4 (4) or ebpflb_srcrng6 (6)."""
    return source_range.network.version
