"""What is in the maps now: one `Realized` record per frontend, indexed by owner, and the
maps' contents read back in one go (for restore).

Records are small on purpose: at 100,000 services there are several hundred thousand of
them. Tables are not kept: a digest stands for each one (the slot pool is the record).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ebpflb.datapath.maps import BackendEntry, MapSet, ServiceEntry, SlotArray, SourceRange
from ebpflb.desired import DesiredFrontend
from ebpflb.maglev import MIN_SLOTS_PER_BACKEND
from ebpflb.model import Frontend, IPNetwork, NamespacedName

BackendIds = tuple[int, ...]  # sorted; a tuple takes a third of a frozenset's memory
NO_RANGES: frozenset[IPNetwork] = frozenset()  # shared: almost no frontend has any
EMPTY_TABLE: SlotArray = np.zeros(0, dtype=np.uint32)


def table_digest(table: SlotArray) -> bytes:
    """What a table is compared by across resyncs (16 bytes instead of the whole table)."""
    data = np.ascontiguousarray(table, dtype=np.uint32).data
    return hashlib.blake2b(data, digest_size=16).digest()


def table_ids(table: SlotArray) -> BackendIds:
    """Backend ids a table names (0 is "none")."""
    return tuple(i for i in np.unique(table).tolist() if i)


def source_ranges(networks: Iterable[IPNetwork]) -> frozenset[IPNetwork]:
    return frozenset(networks) or NO_RANGES


def frontend_order(frontend: Frontend) -> tuple[int, int, int, int, int]:
    """A sort key giving Frontend's own order (address, port, protocol, scope), in ints,
    IPv4 before IPv6: ordering 100,000 frontends through their dataclass comparisons costs
    a second, and addresses of two families do not compare at all."""
    address = frontend.address
    return (address.version, int(address), frontend.port, frontend.protocol, frontend.scope)


def parse_owner(name: str) -> NamespacedName | None:
    """Service of a stored "namespace/name:port" string; None when it is not one."""
    service, sep, _port = name.rpartition(":")
    namespace, slash, svc = service.partition("/")
    if not sep or not slash or not namespace or not svc:
        return None
    return NamespacedName(namespace, svc)


def undersized(entry: ServiceEntry) -> bool:
    """Whether a table gives its backends fewer than the paper's 100 slots each (only when
    the largest table allowed is too small for them: the balance is then looser)."""
    return entry.table_size < MIN_SLOTS_PER_BACKEND * entry.backend_count


@dataclass(slots=True)
class Realized:
    """One frontend as it is in the maps. Replaced, never changed, once it is recorded."""

    entry: ServiceEntry
    name: str  # "namespace/name:port" as stored in ebpflb_svcmeta
    owner: NamespacedName | None
    backend_ids: BackendIds  # what its table names
    digest: bytes  # of its table (table_digest), b"" when it has none
    owns_range: bool = True  # False: the table overlaps another; the next apply moves it
    # What it was written for; None when unknown (restored, and not as last written).
    desired: DesiredFrontend | None = None
    ranges: frozenset[IPNetwork] = NO_RANGES  # loadBalancerSourceRanges written


class RealizedState:
    """Every realized frontend, with the index that keeps an incremental apply
    proportional to what changed (the frontends of one owner) and the count of undersized
    tables (for a gauge, without a pass over every frontend)."""

    def __init__(self) -> None:
        self.frontends: dict[Frontend, Realized] = {}
        # Lists, not sets: most services have one frontend, and 100,000 sets take 20 MiB.
        self._by_owner: dict[NamespacedName | None, list[Frontend]] = {}
        self.undersized = 0
        self.ipv6 = 0  # IPv6 frontends (ebpflb_svc6's entries; the rest are ebpflb_svc4's)

    def __len__(self) -> int:
        return len(self.frontends)

    def get(self, frontend: Frontend) -> Realized | None:
        return self.frontends.get(frontend)

    def owned_by(self, owner: NamespacedName) -> Sequence[Frontend]:
        return self._by_owner.get(owner, ())

    def set(self, frontend: Frontend, realized: Realized) -> None:
        previous = self.frontends.get(frontend)
        if previous is None:
            self.ipv6 += frontend.address.version == 6
        else:
            entry = previous.entry  # undersized(), inlined: this runs for every frontend
            self.undersized -= entry.table_size < MIN_SLOTS_PER_BACKEND * entry.backend_count
            if previous.owner != realized.owner:
                self._by_owner[previous.owner].remove(frontend)
        self.frontends[frontend] = realized
        entry = realized.entry
        self.undersized += entry.table_size < MIN_SLOTS_PER_BACKEND * entry.backend_count
        owned = self._by_owner.setdefault(realized.owner, [])
        if frontend not in owned:
            owned.append(frontend)

    def drop(self, frontend: Frontend) -> Realized:
        realized = self.frontends.pop(frontend)
        self.undersized -= undersized(realized.entry)
        self.ipv6 -= frontend.address.version == 6
        owned = self._by_owner[realized.owner]
        owned.remove(frontend)
        if not owned:
            del self._by_owner[realized.owner]
        return realized


@dataclass(slots=True)
class MapContents:
    """What the maps the reconciler writes hold, read back in one go."""

    backends: dict[int, BackendEntry]
    metas: dict[int, str]
    ranges: dict[int, frozenset[IPNetwork]]  # by service id
    services: list[tuple[Frontend, ServiceEntry]]

    @classmethod
    def read(cls, maps: MapSet) -> MapContents:
        ranges: dict[int, set[IPNetwork]] = {}
        for source_range, _ in maps.source_ranges.items():
            ranges.setdefault(source_range.svc_id, set()).add(source_range.network)
        return cls(
            backends=dict(maps.backends.items()),
            metas=dict(maps.service_meta.items()),
            ranges={svc_id: frozenset(networks) for svc_id, networks in ranges.items()},
            services=list(maps.services.items()),
        )


@dataclass(slots=True)
class Leftovers:
    """What a restore found in the maps that no frontend owns (a removal cut short by a
    crash leaves some); the next full apply removes it before planning anything."""

    stray: list[Frontend] = field(default_factory=list)  # entries with a duplicate id
    metas: list[int] = field(default_factory=list)  # svcmeta of ids no entry uses
    ranges: list[SourceRange] = field(default_factory=list)  # of ids no entry uses

    def __bool__(self) -> bool:
        return bool(self.stray or self.metas or self.ranges)
