"""Desired frontends -> BPF maps, writing only what differs.

The reconciler remembers what it has written ("realized", checked against the pinned maps
at start and at every full resync and relearned from them where they differ, so it is the
kernel's truth and not a belief), diffs the desired state against it, and writes the
difference in an order the datapath can run through at any moment:

1. new backends, before any slot names them;
2. the Maglev slots (only the changed ones when the table keeps its size and place; a
   table that changes size is written to a fresh range first);
3. the service metadata, then the service entry, which switches readers to the new table
   in one atomic map update;
4. backends no table names any more, and (one sync later) the old slot ranges.

One apply takes every frontend it changes through these steps together: all backends in
one batch, then all slots, all metadata, all service entries, so that a start with 10,000
services costs a few syscalls rather than 50,000. Each frontend still succeeds or fails on
its own: a full map or slot pool, or an element the kernel refuses, fails only the
frontends that needed it, with an error naming them and the limit; their later steps are
not written, so the datapath keeps their previous state, and no other frontend is touched.

Tables are not kept in memory: the slot pool is the record (mapped into this process where
the kernel allows it), and a digest of each table tells a full resync which tables are
still exactly as written, so it neither rebuilds nor compares those.
"""

from __future__ import annotations

import hashlib
import logging
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Network

import numpy as np

from ebpflb import maglev
from ebpflb.alloc import IdAllocator, SlotAllocator
from ebpflb.datapath.maps import (
    SLOTS_PER_ELEMENT,
    BackendEntry,
    MapSet,
    ServiceEntry,
    SlotArray,
    SlotWrite,
    SourceRange,
)
from ebpflb.desired import DesiredFrontend, WeightedBackend
from ebpflb.errors import MapError, MapFullError
from ebpflb.metrics import Metrics
from ebpflb.model import Backend, Frontend, NamespacedName

log = logging.getLogger(__name__)

_EMPTY: SlotArray = np.zeros(0, dtype=np.uint32)
# An apply changing more frontends than this (a start, a resync after a long outage) logs
# one summary line, and each frontend at debug level: 100,000 lines help nobody.
LOG_EACH_MAX = 100
# Tables built and written per step of a big apply: bounds the memory they take at once.
TABLE_CHUNK = 2048


def table_digest(table: SlotArray) -> bytes:
    """What a table is compared by across resyncs (16 bytes instead of the whole table)."""
    data = np.ascontiguousarray(table, dtype=np.uint32).data
    return hashlib.blake2b(data, digest_size=16).digest()


BackendIds = tuple[int, ...]  # sorted; a tuple takes a third of a frozenset's memory
_NO_RANGES: frozenset[IPv4Network] = frozenset()  # shared: almost no frontend has any


def table_ids(table: SlotArray) -> BackendIds:
    """Backend ids a table names (0 is "none")."""
    return tuple(i for i in np.unique(table).tolist() if i)


def maglev_name(backend: Backend) -> str:
    """str(backend), the name Maglev hashes, without ipaddress's slow formatting."""
    return f"{socket.inet_ntoa(backend.address.packed)}:{backend.port}"


def frontend_order(frontend: Frontend) -> tuple[int, int, int, int]:
    """A sort key giving Frontend's own order (address, port, protocol, scope), in ints:
    ordering 100,000 frontends through their dataclass comparisons costs a second."""
    return (int(frontend.address), frontend.port, frontend.protocol, frontend.scope)


@dataclass(slots=True)
class Realized:
    """One frontend as it is in the maps."""

    entry: ServiceEntry
    name: str  # "namespace/name:port" as stored in ebpflb_svcmeta
    owner: NamespacedName | None
    backend_ids: BackendIds  # what its table names
    digest: bytes  # of its table (table_digest), b"" when it has none
    owns_range: bool = True  # False: the table overlaps another; the next apply moves it
    # What it was written for; None when unknown (restored, and not as last written).
    desired: DesiredFrontend | None = None
    ranges: frozenset[IPv4Network] = _NO_RANGES  # loadBalancerSourceRanges written


@dataclass(slots=True)
class _MapContents:
    """What the maps the reconciler writes hold, read back in one go."""

    backends: dict[int, BackendEntry]
    metas: dict[int, str]
    ranges: dict[int, frozenset[IPv4Network]]  # by service id
    services: list[tuple[Frontend, ServiceEntry]]


@dataclass(slots=True)
class _Change:
    """One frontend's update, from planning (allocations) to accounting (see apply)."""

    frontend: Frontend
    owner: NamespacedName
    want: DesiredFrontend
    current: Realized | None
    name: str  # of the service port, "namespace/name:port"
    usable: tuple[WeightedBackend, ...]
    ranges: frozenset[IPv4Network]
    svc_id: int = 0
    ids: tuple[int, ...] = ()  # backend id of each usable backend
    size: int = 0  # table size; 0: the frontend refuses
    offset: int = 0
    reuse: bool = False  # the table keeps its range: only changed slots are written
    new_range: bool = False  # `offset` was allocated by this change
    reserved_ranges: int = 0  # source ranges counted against the map's capacity
    ranges_written: list[IPv4Network] = field(default_factory=list)
    table_ids: BackendIds = ()
    digest: bytes = b""
    written: int = 0  # slots
    slots_stored: bool = False
    entry: ServiceEntry | None = None
    error: MapError | None = None
    error_map: str = "unknown"

    def label(self) -> str:
        return f"{self.name} {self.frontend}"

    def fail(self, error: MapError, map_name: str) -> None:
        self.error = error
        self.error_map = error.map_name if isinstance(error, MapFullError) else map_name


@dataclass(slots=True)
class ApplyResult:
    added: int = 0
    updated: int = 0
    removed: int = 0
    unchanged: int = 0
    slots_written: int = 0
    # Entries written or deleted, by map. In a full resync every write is a repair: the
    # realized state was just re-read from the kernel, so only drift differs.
    writes: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    failed: set[NamespacedName] = field(default_factory=set)

    @property
    def changed(self) -> int:
        return self.added + self.updated + self.removed

    def count_write(self, map_name: str, count: int = 1) -> None:
        if count:
            self.writes[map_name] = self.writes.get(map_name, 0) + count


def _ranges(networks: Iterable[IPv4Network]) -> frozenset[IPv4Network]:
    return frozenset(networks) or _NO_RANGES


def parse_owner(name: str) -> NamespacedName | None:
    """Service of a stored "namespace/name:port" string; None when it is not one."""
    service, sep, _port = name.rpartition(":")
    namespace, slash, svc = service.partition("/")
    if not sep or not slash or not namespace or not svc:
        return None
    return NamespacedName(namespace, svc)


class Reconciler:
    def __init__(
        self,
        maps: MapSet,
        *,
        hash_seed: str = maglev.DEFAULT_HASH_SEED,
        max_table_size: int = maglev.DEFAULT_MAX_TABLE_SIZE,
        metrics: Metrics | None = None,
    ) -> None:
        self.maps = maps
        self.hash_seed = hash_seed
        self.max_table_size = max_table_size
        self.metrics = metrics
        self.realized: dict[Frontend, Realized] = {}
        # Indexes that keep an incremental apply proportional to what changed.
        # Lists, not sets: most services have one frontend, and 100,000 sets take 20 MiB.
        self._by_owner: dict[NamespacedName | None, list[Frontend]] = {}
        self._maybe_unused: set[int] = set()  # backend ids whose references dropped
        self._svc_ids = IdAllocator(maps.services.name, maps.services.capacity)
        self._backend_ids = IdAllocator(maps.backends.name, maps.backends.capacity)
        self._slots = SlotAllocator(maps.slots.name, maps.slots.capacity, SLOTS_PER_ELEMENT)
        self._id_of: dict[Backend, int] = {}
        self._backend_of: dict[int, Backend] = {}  # every id in use, written or not
        self._backend_entry: dict[int, BackendEntry] = {}  # as in the map
        self._refs: dict[int, int] = {}
        self._quarantine: list[tuple[int, int]] = []  # slot ranges freed by the last apply
        self._orphan_meta: list[int] = []
        self._stray: list[Frontend] = []  # entries restore could not adopt (duplicate ids)
        self._orphan_ranges: list[SourceRange] = []
        self._range_count = 0

    # ---- restore -------------------------------------------------------------------------

    def restore(self) -> None:
        """Relearn the realized state and the allocators from what the maps hold.

        When the maps hold exactly what this reconciler wrote (the usual full resync),
        everything it knows still holds and is kept. Otherwise it is rebuilt from the
        maps; a frontend whose entry, name, source ranges, table and backends are still as
        last written keeps what it was written for, so that the full apply after passes
        over it; any other is compared with its desired state in full.
        """
        contents = self._read_maps()
        if not self._as_written(contents):
            self._rebuild(contents)

    def _read_maps(self) -> _MapContents:
        ranges: dict[int, set[IPv4Network]] = {}
        for source_range, _ in self.maps.source_ranges.items():
            ranges.setdefault(source_range.svc_id, set()).add(source_range.network)
        return _MapContents(
            backends=dict(self.maps.backends.items()),
            metas=dict(self.maps.service_meta.items()),
            ranges={svc_id: frozenset(networks) for svc_id, networks in ranges.items()},
            services=list(self.maps.services.items()),
        )

    def _as_written(self, contents: _MapContents) -> bool:
        """Whether the maps hold what was written, and nothing else: every frontend known
        (with what it was written for), with its entry, name, ranges and table."""
        if self._stray or self._orphan_meta or self._orphan_ranges:
            return False
        if not len(contents.services) == len(contents.metas) == len(self.realized):
            return False
        if sum(map(len, contents.ranges.values())) != self._range_count:
            return False
        if contents.backends != self._backend_entry:
            return False
        for frontend, entry in contents.services:
            known = self.realized.get(frontend)
            if (
                known is None
                or known.desired is None
                or not known.owns_range
                or known.entry != entry
                or contents.metas.get(entry.svc_id) != known.name
                or contents.ranges.get(entry.svc_id, _NO_RANGES) != known.ranges
            ):
                return False
            if entry.table_size:
                table = self.maps.slots.read(entry.table_off, entry.table_size)
                if table_digest(table) != known.digest:
                    return False
        return True

    def _rebuild(self, contents: _MapContents) -> None:
        previous, previous_backends = self.realized, self._backend_entry
        self.realized = {}
        self._by_owner = {}
        self._svc_ids = IdAllocator(self.maps.services.name, self.maps.services.capacity)
        self._backend_ids = IdAllocator(self.maps.backends.name, self.maps.backends.capacity)
        self._slots = SlotAllocator(
            self.maps.slots.name, self.maps.slots.capacity, SLOTS_PER_ELEMENT
        )
        self._id_of = {}
        self._backend_of = {}
        self._backend_entry = {}
        self._refs = {}
        self._stray = []

        for backend_id, backend_entry in contents.backends.items():
            # The same backend under two ids: the unreferenced one is collected.
            self._id_of.setdefault(backend_entry.backend, backend_id)
            self._backend_of[backend_id] = backend_entry.backend
            self._backend_entry[backend_id] = backend_entry
            self._backend_ids.reserve(backend_id)
            self._refs[backend_id] = 0
        drifted = {
            i for i, entry in previous_backends.items() if self._backend_entry.get(i) != entry
        }

        ranges = dict(contents.ranges)
        self._range_count = sum(map(len, ranges.values()))
        used_ids: set[int] = set()
        for frontend, entry in sorted(contents.services, key=lambda item: frontend_order(item[0])):
            if entry.svc_id in used_ids or entry.svc_id == 0:
                self._stray.append(frontend)  # a duplicate id: rewritten or removed by apply
                continue
            used_ids.add(entry.svc_id)
            self._svc_ids.reserve(entry.svc_id)
            name = contents.metas.get(entry.svc_id, "")
            realized = self._restored(
                entry, name, ranges.pop(entry.svc_id, _NO_RANGES), previous.get(frontend)
            )
            if realized.desired is not None and not drifted.isdisjoint(realized.backend_ids):
                realized.desired = None  # a backend it names was changed behind our back
            self._set_realized(frontend, realized)
            for backend_id in realized.backend_ids:
                self._refs[backend_id] = self._refs.get(backend_id, 0) + 1
        for start, size in self._quarantine:
            self._slots.reserve(start, size)
        self._maybe_unused = {i for i, refs in self._refs.items() if refs == 0}
        self._orphan_meta = sorted(set(contents.metas) - used_ids)
        self._orphan_ranges = [SourceRange(i, n) for i, nets in ranges.items() for n in nets]

    def _restored(
        self,
        entry: ServiceEntry,
        name: str,
        ranges: frozenset[IPv4Network],
        before: Realized | None,
    ) -> Realized:
        """One frontend read back from the maps (its range reserved if it is free)."""
        table: SlotArray = _EMPTY
        owns_range = True
        if entry.table_size:
            try:
                self._slots.reserve(entry.table_off, entry.table_size)
                table = self.maps.slots.read(entry.table_off, entry.table_size)
            except (ValueError, MapError):
                owns_range = False  # overlaps another table: the next apply moves it
        digest = table_digest(table) if owns_range and entry.table_size else b""
        realized = Realized(entry, name, parse_owner(name), (), digest, owns_range)
        realized.ranges = ranges
        if (
            before is not None
            and before.owns_range
            and owns_range
            and (before.entry, before.name, before.ranges, before.digest)
            == (entry, name, ranges, digest)
        ):
            realized.backend_ids = before.backend_ids  # the same table: no need to scan it
            realized.desired = before.desired
        elif owns_range:
            realized.backend_ids = table_ids(table)
        return realized

    # ---- apply ---------------------------------------------------------------------------

    def apply(
        self,
        desired: Mapping[NamespacedName, Mapping[Frontend, DesiredFrontend]],
        *,
        full: bool = False,
    ) -> ApplyResult:
        """Make the maps hold `desired`.

        Incremental (full=False): only the services listed are touched; a service mapped to
        no frontends is removed. Full: `desired` is everything, any other frontend in the
        maps goes, and every table not known to be as written is compared slot by slot
        (drift repair).
        """
        result = ApplyResult()
        for start, size in self._quarantine:
            self._slots.release(start, size)
        self._quarantine = []
        wanted = self._claims(desired, result)

        # Removals first: they free capacity the additions may need.
        if full:
            for frontend in self._stray:
                if frontend not in wanted:
                    self.maps.services.delete(frontend)
                    result.count_write(self.maps.services.name)
            self._stray = []
        candidates = (
            list(self.realized)
            if full
            else [f for owner in desired for f in self._by_owner.get(owner, ())]
        )
        gone = [f for f in candidates if f not in wanted]
        for frontend in gone:
            self._remove(
                frontend, self.realized[frontend], result, verbose=len(gone) <= LOG_EACH_MAX
            )

        changes = self._plan_all(wanted, desired, result)
        self._write_all(changes, result)
        verbose = len(changes) <= LOG_EACH_MAX
        for change in changes:
            if change.error is None:
                self._account(change, result, verbose=verbose)
            else:
                self._give_up(change, result)
        if not verbose or len(gone) > LOG_EACH_MAX:
            log.info(
                "applied %d frontends: %d added, %d updated, %d removed, %d unchanged, %d"
                " failed, %d slots written",
                len(changes) + len(gone),
                result.added,
                result.updated,
                result.removed,
                result.unchanged,
                sum(1 for c in changes if c.error is not None),
                result.slots_written,
            )

        if full:
            self._remove_orphans(result)
        self._collect_backends(result)
        self._update_gauges(result)
        return result

    def _claims(
        self,
        desired: Mapping[NamespacedName, Mapping[Frontend, DesiredFrontend]],
        result: ApplyResult,
    ) -> dict[Frontend, tuple[NamespacedName, DesiredFrontend]]:
        """Who gets each frontend; when two services claim one, the one holding it keeps it."""
        wanted: dict[Frontend, tuple[NamespacedName, DesiredFrontend]] = {}
        for owner in sorted(desired, key=lambda ref: (ref.namespace, ref.name)):
            for frontend, want in desired[owner].items():
                first = wanted.get(frontend)
                if first is None:
                    wanted[frontend] = (owner, want)
                    continue
                realized = self.realized.get(frontend)
                if realized is not None and realized.owner == owner:
                    self._conflict(result, frontend, first[0], owner)
                    wanted[frontend] = (owner, want)
                else:
                    self._conflict(result, frontend, owner, first[0])
        return wanted

    def _conflict(
        self, result: ApplyResult, frontend: Frontend, owner: NamespacedName, holder: object
    ) -> None:
        message = f"frontend {frontend} of {owner} is already used by {holder}: skipped"
        log.error(message)
        result.errors.append(message)
        if self.metrics:
            self.metrics.frontend_conflicts.inc()

    # ---- planning: everything that can run out of room, before any write -----------------

    def _plan_all(
        self,
        wanted: Mapping[Frontend, tuple[NamespacedName, DesiredFrontend]],
        desired: Mapping[NamespacedName, object],
        result: ApplyResult,
    ) -> list[_Change]:
        changes = []
        for frontend, (owner, want) in sorted(
            wanted.items(), key=lambda item: frontend_order(item[0])
        ):
            current = self.realized.get(frontend)
            if (
                current is not None
                and current.owner not in (None, owner)
                and current.owner not in desired
            ):
                self._conflict(result, frontend, owner, current.owner)
                continue
            if current is not None and current.desired == want and current.owns_range:
                result.unchanged += 1
                continue
            change = _Change(
                frontend,
                owner,
                want,
                current,
                name=str(want.service),
                usable=tuple(b for b in want.backends if b.weight > 0),
                ranges=_ranges(want.source_ranges),
            )
            try:
                self._plan(change)
            except MapFullError as exc:
                change.fail(exc, exc.map_name)
                self._abandon(change)
                self._report(change, result)
                continue
            changes.append(change)
        return changes

    def _plan(self, change: _Change) -> None:
        """Allocate the change's service id, backend ids, source ranges and slot range."""
        current = change.current
        if current is None:
            change.svc_id = self._svc_ids.allocate(change.label)
        else:
            change.svc_id = current.entry.svc_id
        change.ids = tuple(self._backend_id(b.backend, change.name) for b in change.usable)
        added = change.ranges - (current.ranges if current is not None else _NO_RANGES)
        if self._range_count + len(added) > self.maps.source_ranges.capacity:
            raise MapFullError(
                self.maps.source_ranges.name,
                self.maps.source_ranges.capacity,
                f"{len(added)} source ranges of {change.label()}",
            )
        self._range_count += len(added)
        change.reserved_ranges = len(added)
        if change.usable:
            current_size = (
                current.entry.table_size if current and current.entry.table_size else None
            )
            change.size = maglev.table_size_for(
                len(change.usable), max_size=self.max_table_size, current=current_size
            )
        change.reuse = bool(
            current is not None
            and current.owns_range
            and change.size
            and current.entry.table_size == change.size
        )
        if change.reuse and current is not None:
            change.offset = current.entry.table_off
        elif change.size:
            change.offset = self._slots.allocate(change.size, change.label)
            change.new_range = True

    def _backend_id(self, backend: Backend, service: str) -> int:
        """The backend's id, allocated if it has none. A new id is collected at the end of
        the apply unless a table written by it names the backend."""
        backend_id = self._id_of.get(backend)
        if backend_id is None:
            backend_id = self._backend_ids.allocate(lambda: f"backend {backend} of {service}")
            self._id_of[backend] = backend_id
            self._backend_of[backend_id] = backend
            self._refs[backend_id] = 0
            self._maybe_unused.add(backend_id)
        return backend_id

    # ---- writing: one step for every change at a time ------------------------------------

    def _write_all(self, changes: Sequence[_Change], result: ApplyResult) -> None:
        self._write_backends(changes, result)
        for start in range(0, len(changes), TABLE_CHUNK):
            self._write_tables(changes[start : start + TABLE_CHUNK], result)
        self._write_added_ranges(changes, result)
        self._write_meta(changes, result)
        self._write_entries(changes, result)
        self._delete_dropped_ranges(changes, result)

    def _write_backends(self, changes: Sequence[_Change], result: ApplyResult) -> None:
        wanted: dict[int, BackendEntry] = {}
        for change in changes:
            for backend_id, wb in zip(change.ids, change.usable, strict=True):
                entry = BackendEntry(wb.backend, wb.flags)
                if self._backend_entry.get(backend_id) != entry:
                    wanted[backend_id] = entry  # the last change naming it decides its flags
        items = sorted(wanted.items())
        failures = self.maps.backends.put_many(items)
        for index, (backend_id, entry) in enumerate(items):
            if index not in failures:
                self._backend_entry[backend_id] = entry
        failed = {items[index][0]: error for index, error in failures.items()}
        for change in changes if failed else ():
            error = next((failed[i] for i in change.ids if i in failed), None)
            if error is not None:
                change.fail(error, self.maps.backends.name)  # it needs a backend not written
        result.count_write(self.maps.backends.name, len(items) - len(failures))

    def _write_tables(self, changes: Sequence[_Change], result: ApplyResult) -> None:
        """Build the Maglev tables of `changes` and write what differs from the pool."""
        live = [c for c in changes if c.error is None and c.size]
        tables = self._build_tables(live)
        writes: list[SlotWrite] = []
        writers: list[_Change] = []
        for change, table in zip(live, tables, strict=True):
            change.digest = table_digest(table)
            change.table_ids = self._ids_in(change, table)
            if change.reuse:
                # Against the pool itself, not a memory of it: drift is repaired as well.
                old = self.maps.slots.read(change.offset, change.size)
                changed = maglev.changed_slots(old, table)
                if not len(changed):
                    continue
                writes.append(SlotWrite(change.offset, table, changed))
                change.written = len(changed)
            else:
                writes.append(SlotWrite(change.offset, table))
                change.written = change.size
            writers.append(change)
        failures = self.maps.slots.write_many(writes)
        for index, change in enumerate(writers):
            error = failures.get(index)
            if error is None:
                change.slots_stored = True
                result.count_write(self.maps.slots.name, change.written)
            else:
                change.written = 0
                change.fail(error, self.maps.slots.name)

    def _build_tables(self, changes: Sequence[_Change]) -> list[SlotArray]:
        """Each change's table in backend ids, from one compiled call for all of them.
        Frontends with the same backends and size (a port's ClusterIP and NodePorts) share
        one table."""
        unique: dict[tuple[int, tuple[int, ...], tuple[int, ...]], int] = {}
        specs: list[_Change] = []
        which = []
        for change in changes:
            key = (change.size, change.ids, tuple(b.weight for b in change.usable))
            if key not in unique:
                unique[key] = len(specs)
                specs.append(change)
            which.append(unique[key])
        names = [[maglev_name(b.backend) for b in spec.usable] for spec in specs]
        built = maglev.build_tables(
            [
                dict(zip(spec_names, (b.weight for b in spec.usable), strict=True))
                for spec, spec_names in zip(specs, names, strict=True)
            ],
            [c.size for c in specs],
            seed=self.hash_seed,
        )
        in_ids = []
        for spec, spec_names, table in zip(specs, names, built, strict=True):
            by_name = dict(zip(spec_names, spec.ids, strict=True))
            id_of_index = np.array([by_name[n] for n in table.backends], dtype=np.uint32)
            in_ids.append(id_of_index[table.slots])
        return [in_ids[i] for i in which]

    @staticmethod
    def _ids_in(change: _Change, table: SlotArray) -> BackendIds:
        """The backend ids a change's table names. With equal weights every backend takes
        a slot each round, so all of them; with unequal ones a light backend may get none."""
        if len({b.weight for b in change.usable}) == 1:
            return tuple(sorted(change.ids))
        return table_ids(table)

    def _write_added_ranges(self, changes: Sequence[_Change], result: ApplyResult) -> None:
        """Allowed source ranges go in before an entry that checks them (LPM tries have no
        batch writes: one syscall each, and there are few)."""
        for change in changes:
            if change.error is not None:
                continue
            old = change.current.ranges if change.current is not None else _NO_RANGES
            for network in sorted(change.ranges - old):
                try:
                    self.maps.source_ranges.put(SourceRange(change.svc_id, network), 1)
                except MapError as exc:
                    change.fail(exc, self.maps.source_ranges.name)
                    break
                change.ranges_written.append(network)
                result.count_write(self.maps.source_ranges.name)

    def _write_meta(self, changes: Sequence[_Change], result: ApplyResult) -> None:
        named = [
            c
            for c in changes
            if c.error is None and (c.current is None or c.current.name != c.name)
        ]
        failures = self.maps.service_meta.put_many([(c.svc_id, c.name) for c in named])
        for index, error in failures.items():
            named[index].fail(error, self.maps.service_meta.name)
        result.count_write(self.maps.service_meta.name, len(named) - len(failures))

    def _write_entries(self, changes: Sequence[_Change], result: ApplyResult) -> None:
        """The switch: each entry makes its frontend use what the steps before wrote."""
        switched: list[_Change] = []
        items: list[tuple[Frontend, ServiceEntry]] = []
        for change in changes:
            if change.error is not None:
                continue
            entry = ServiceEntry(
                change.svc_id, change.offset, change.size, len(change.usable), change.want.flags
            )
            change.entry = entry
            if change.current is None or change.current.entry != entry:
                switched.append(change)
                items.append((change.frontend, entry))
        failures = self.maps.services.put_many(items)
        for index, error in failures.items():
            switched[index].fail(error, self.maps.services.name)
        result.count_write(self.maps.services.name, len(items) - len(failures))

    def _delete_dropped_ranges(self, changes: Sequence[_Change], result: ApplyResult) -> None:
        """Source ranges no longer allowed go after the entry stopped needing them."""
        for change in changes:
            if change.error is not None or change.current is None:
                continue
            for network in sorted(change.current.ranges - change.ranges):
                self.maps.source_ranges.delete(SourceRange(change.svc_id, network))
                self._range_count -= 1
                result.count_write(self.maps.source_ranges.name)

    # ---- after writing -------------------------------------------------------------------

    def _account(self, change: _Change, result: ApplyResult, *, verbose: bool) -> None:
        """Update references, quarantine a replaced range, record and log the change."""
        current, entry = change.current, change.entry
        assert entry is not None
        moved = current is not None and current.entry.table_size and not change.reuse
        if moved and current is not None and current.owns_range:
            self._quarantine.append((current.entry.table_off, current.entry.table_size))
            if change.size and self.metrics:
                self.metrics.table_resizes.inc()
        old_ids = current.backend_ids if current is not None else ()
        self._reference(change.table_ids, old_ids)
        self._set_realized(
            change.frontend,
            Realized(
                entry,
                change.name,
                change.owner,
                change.table_ids,
                change.digest,
                True,
                change.want,
                change.ranges,
            ),
        )
        result.slots_written += change.written
        if self.metrics and change.written:
            self.metrics.slots_written.inc(change.written)
        if current is None:
            result.added += 1
        elif current.entry != entry or change.written or current.ranges != change.ranges:
            result.updated += 1
        else:
            result.unchanged += 1
            return
        level = logging.INFO if verbose else logging.DEBUG
        if log.isEnabledFor(level):
            log.log(level, "%s", self._describe(change, old_ids))

    def _describe(self, change: _Change, old_ids: BackendIds) -> str:
        current, entry = change.current, change.entry
        assert entry is not None
        if current is None:
            table = (
                f"{change.size} slots at {entry.table_off}"
                if change.size
                else "no usable endpoint (refusing)"
            )
            return f"service {change.label()} added: {len(change.usable)} backends, {table}"
        added = self._addresses(set(change.table_ids) - set(old_ids))
        gone = self._addresses(set(old_ids) - set(change.table_ids))
        resized = current.entry.table_size != change.size
        return (
            f"service {change.label()} updated: backends {current.entry.backend_count} ->"
            f" {len(change.usable)}{' +' + ','.join(added) if added else ''}"
            f"{' -' + ','.join(gone) if gone else ''}, {change.written} slots written"
            f"{f' (table {current.entry.table_size} -> {change.size})' if resized else ''}"
        )

    def _addresses(self, ids: Iterable[int]) -> list[str]:
        return sorted(str(self._backend_entry[i].backend) for i in ids if i in self._backend_entry)

    def _give_up(self, change: _Change, result: ApplyResult) -> None:
        """A change that failed part-way: undo its allocations and report it."""
        if change.reuse and change.slots_stored and change.current is not None:
            # Its table was rewritten in place before a later step failed: record the
            # table the pool now holds, and leave the rest to be retried.
            current = change.current
            self._reference(change.table_ids, current.backend_ids)
            current.backend_ids = change.table_ids
            current.digest = change.digest
            current.desired = None
        self._abandon(change)
        self._report(change, result)

    def _abandon(self, change: _Change) -> None:
        """Give back what a failed change allocated; nothing refers to it. New backend ids
        are left to _collect_backends (another change may have come to use them)."""
        for network in change.ranges_written:  # allowed for an entry that was not written
            self.maps.source_ranges.delete(SourceRange(change.svc_id, network))
        if change.new_range:
            self._slots.release(change.offset, change.size)
        if change.current is None and change.svc_id:
            self._svc_ids.release(change.svc_id)
        self._range_count -= change.reserved_ranges

    def _report(self, change: _Change, result: ApplyResult) -> None:
        error = change.error
        reason = "full" if isinstance(error, MapFullError) else "error"
        message = f"service {change.want.service} {change.frontend} not programmed: {error}"
        log.error(message)
        result.errors.append(message)
        result.failed.add(change.owner)
        if self.metrics:
            self.metrics.map_errors.labels(change.error_map, reason).inc()

    def _reference(self, new_ids: BackendIds, old_ids: BackendIds) -> None:
        if new_ids == old_ids:
            return
        for backend_id in set(new_ids).difference(old_ids):
            self._refs[backend_id] = self._refs.get(backend_id, 0) + 1
        for backend_id in set(old_ids).difference(new_ids):
            self._unref(backend_id)

    def _remove(
        self, frontend: Frontend, realized: Realized, result: ApplyResult, *, verbose: bool
    ) -> None:
        self.maps.services.delete(frontend)
        self.maps.service_meta.delete(realized.entry.svc_id)
        result.count_write(self.maps.services.name)
        result.count_write(self.maps.service_meta.name)
        for network in realized.ranges:
            self.maps.source_ranges.delete(SourceRange(realized.entry.svc_id, network))
            self._range_count -= 1
            result.count_write(self.maps.source_ranges.name)
        self._svc_ids.release(realized.entry.svc_id)
        if realized.entry.table_size and realized.owns_range:
            self._quarantine.append((realized.entry.table_off, realized.entry.table_size))
        for backend_id in realized.backend_ids:
            self._unref(backend_id)
        self._drop_realized(frontend)
        result.removed += 1
        log.log(
            logging.INFO if verbose else logging.DEBUG,
            "service %s %s removed",
            realized.name or "(unnamed)",
            frontend,
        )

    def _remove_orphans(self, result: ApplyResult) -> None:
        """Metadata and source ranges of service ids no entry uses (found by restore)."""
        for svc_id in self._orphan_meta:
            if svc_id not in self._svc_ids:  # not taken again by this apply
                self.maps.service_meta.delete(svc_id)
                result.count_write(self.maps.service_meta.name)
        self._orphan_meta = []
        for source_range in self._orphan_ranges:
            if source_range.svc_id not in self._svc_ids:
                self.maps.source_ranges.delete(source_range)
                self._range_count -= 1
                result.count_write(self.maps.source_ranges.name)
        self._orphan_ranges = []

    def _set_realized(self, frontend: Frontend, realized: Realized) -> None:
        previous = self.realized.get(frontend)
        if previous is not None and previous.owner != realized.owner:
            self._by_owner[previous.owner].remove(frontend)
        self.realized[frontend] = realized
        owned = self._by_owner.setdefault(realized.owner, [])
        if frontend not in owned:
            owned.append(frontend)

    def _drop_realized(self, frontend: Frontend) -> None:
        realized = self.realized.pop(frontend)
        owned = self._by_owner[realized.owner]
        owned.remove(frontend)
        if not owned:
            del self._by_owner[realized.owner]

    def _unref(self, backend_id: int) -> None:
        self._refs[backend_id] = self._refs.get(backend_id, 1) - 1
        if self._refs[backend_id] <= 0:
            self._maybe_unused.add(backend_id)

    def _collect_backends(self, result: ApplyResult) -> None:
        """Delete backends no table names any more (after every slot stopped naming them),
        and give back the ids of new backends whose frontends failed."""
        candidates, self._maybe_unused = self._maybe_unused, set()
        for backend_id in sorted(candidates):
            if self._refs.get(backend_id, 0) > 0 or backend_id not in self._refs:
                continue
            entry = self._backend_entry.pop(backend_id, None)
            if entry is not None:  # else it never reached the map
                self.maps.backends.delete(backend_id)
                result.count_write(self.maps.backends.name)
            self._backend_ids.release(backend_id)
            del self._refs[backend_id]
            backend = self._backend_of.pop(backend_id, None)
            if backend is not None and self._id_of.get(backend) == backend_id:
                del self._id_of[backend]

    def _update_gauges(self, result: ApplyResult) -> None:
        if not self.metrics:
            return
        self.metrics.frontends.set(len(self.realized))
        self.metrics.backends.set(len(self._backend_entry))
        self.metrics.slots_used.set(self._slots.used)
