"""Desired frontends -> BPF maps, writing only what differs.

The reconciler remembers what it has written ("realized", rebuilt from the pinned maps at
start and at every full resync, so it is the kernel's truth and not a belief), diffs the
desired state against it, and writes the difference in an order the datapath can run
through at any moment:

1. new backends, before any slot names them;
2. the Maglev slots (only the changed ones when the table keeps its size and place; a
   table that changes size is written to a fresh range first);
3. the service metadata, then the service entry, which switches readers to the new table
   in one atomic map update;
4. backends no table names any more, and (one sync later) the old slot ranges.

Each frontend is applied on its own: a full map or slot pool fails that frontend with an
error naming it and the limit, leaves its previous state in place, and does not touch the
others.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
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
    SourceRange,
)
from ebpflb.desired import DesiredFrontend, WeightedBackend
from ebpflb.errors import MapError, MapFullError
from ebpflb.metrics import Metrics
from ebpflb.model import Backend, Frontend, NamespacedName

log = logging.getLogger(__name__)

_EMPTY: SlotArray = np.zeros(0, dtype=np.uint32)


@dataclass(slots=True)
class Realized:
    """One frontend as it is in the maps."""

    entry: ServiceEntry
    name: str  # "namespace/name:port" as stored in ebpflb_svcmeta
    owner: NamespacedName | None
    table: SlotArray | None  # backend id per slot; None: the range is unusable (overlap)
    desired: DesiredFrontend | None = None  # None after a restore: weights unknown
    ranges: frozenset[IPv4Network] = frozenset()  # loadBalancerSourceRanges written

    @property
    def backend_ids(self) -> set[int]:
        return set() if self.table is None else set(np.unique(self.table).tolist()) - {0}


@dataclass(slots=True)
class _Plan:
    """What one frontend's update allocated before writing (see Reconciler._plan)."""

    svc_id: int
    usable: tuple[WeightedBackend, ...]
    ranges: frozenset[IPv4Network]
    new_backends: dict[Backend, int]
    table: SlotArray = field(default_factory=lambda: _EMPTY)
    size: int = 0
    reuse: bool = False
    new_range: tuple[int, int] | None = None


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
        self.writes[map_name] = self.writes.get(map_name, 0) + count


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
        self._by_owner: dict[NamespacedName | None, set[Frontend]] = {}
        self._maybe_unused: set[int] = set()  # backend ids whose references dropped
        self._svc_ids = IdAllocator(maps.services.name, maps.services.capacity)
        self._backend_ids = IdAllocator(maps.backends.name, maps.backends.capacity)
        self._slots = SlotAllocator(maps.slots.name, maps.slots.capacity, SLOTS_PER_ELEMENT)
        self._id_of: dict[Backend, int] = {}
        self._backend_entry: dict[int, BackendEntry] = {}
        self._refs: dict[int, int] = {}
        self._quarantine: list[tuple[int, int]] = []  # slot ranges freed by the last apply
        self._orphan_meta: list[int] = []
        self._stray: list[Frontend] = []  # entries restore could not adopt (duplicate ids)
        self._orphan_ranges: list[SourceRange] = []
        self._range_count = 0

    # ---- restore -------------------------------------------------------------------------

    def restore(self) -> None:
        """Rebuild the realized state and the allocators from what the maps hold."""
        self.realized.clear()
        self._by_owner.clear()
        self._svc_ids = IdAllocator(self.maps.services.name, self.maps.services.capacity)
        self._backend_ids = IdAllocator(self.maps.backends.name, self.maps.backends.capacity)
        self._slots = SlotAllocator(
            self.maps.slots.name, self.maps.slots.capacity, SLOTS_PER_ELEMENT
        )
        self._id_of.clear()
        self._backend_entry.clear()
        self._refs.clear()
        self._stray = []

        for backend_id, backend_entry in self.maps.backends.items():
            # The same backend under two ids: the unreferenced one is collected.
            if backend_entry.backend not in self._id_of:
                self._id_of[backend_entry.backend] = backend_id
            self._backend_entry[backend_id] = backend_entry
            self._backend_ids.reserve(backend_id)
            self._refs.setdefault(backend_id, 0)

        metas = dict(self.maps.service_meta.items())
        ranges: dict[int, set[IPv4Network]] = {}
        self._range_count = 0
        for source_range, _ in self.maps.source_ranges.items():
            ranges.setdefault(source_range.svc_id, set()).add(source_range.network)
            self._range_count += 1
        used_ids: set[int] = set()
        for frontend, entry in sorted(self.maps.services.items()):
            if entry.svc_id in used_ids or entry.svc_id == 0:
                self._stray.append(frontend)  # a duplicate id: rewritten or removed by apply
                continue
            used_ids.add(entry.svc_id)
            self._svc_ids.reserve(entry.svc_id)
            table: SlotArray | None = _EMPTY
            if entry.table_size:
                try:
                    self._slots.reserve(entry.table_off, entry.table_size)
                    table = self.maps.slots.read(entry.table_off, entry.table_size)
                except (ValueError, MapError):
                    table = None  # overlaps another table: the next apply moves it
            name = metas.get(entry.svc_id, "")
            realized = Realized(
                entry,
                name,
                parse_owner(name),
                table,
                ranges=frozenset(ranges.pop(entry.svc_id, ())),
            )
            self._set_realized(frontend, realized)
            for backend_id in realized.backend_ids:
                self._refs[backend_id] = self._refs.get(backend_id, 0) + 1
        for start, size in self._quarantine:
            self._slots.reserve(start, size)
        self._maybe_unused = {i for i, refs in self._refs.items() if refs == 0}
        self._orphan_meta = sorted(set(metas) - used_ids)
        self._orphan_ranges = [SourceRange(i, n) for i, nets in ranges.items() for n in nets]

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
        maps goes, and every table is compared slot by slot (drift repair).
        """
        result = ApplyResult()
        for start, size in self._quarantine:
            self._slots.release(start, size)
        self._quarantine = []

        wanted: dict[Frontend, tuple[NamespacedName, DesiredFrontend]] = {}
        for owner in sorted(desired):
            for frontend, want in desired[owner].items():
                first = wanted.get(frontend)
                if first is None:
                    wanted[frontend] = (owner, want)
                    continue
                # Two services claim one frontend: the one holding it keeps it.
                realized = self.realized.get(frontend)
                if realized is not None and realized.owner == owner:
                    self._conflict(result, frontend, first[0], owner)
                    wanted[frontend] = (owner, want)
                else:
                    self._conflict(result, frontend, owner, first[0])

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
        for frontend in candidates:
            if frontend not in wanted:
                self._remove(frontend, self.realized[frontend], result)

        for frontend, (owner, want) in sorted(wanted.items()):
            current = self.realized.get(frontend)
            if (
                current is not None
                and current.owner not in (None, owner)
                and current.owner not in desired
            ):
                self._conflict(result, frontend, owner, current.owner)
                continue
            try:
                self._upsert(frontend, owner, want, current, result, full=full)
            except (MapFullError, MapError) as exc:
                reason = "full" if isinstance(exc, MapFullError) else "error"
                map_name = exc.map_name if isinstance(exc, MapFullError) else "unknown"
                message = f"service {want.service} {frontend} not programmed: {exc}"
                log.error(message)
                result.errors.append(message)
                result.failed.add(owner)
                if self.metrics:
                    self.metrics.map_errors.labels(map_name, reason).inc()

        if full:
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
        self._collect_backends(result)
        self._update_gauges(result)
        return result

    def _conflict(
        self, result: ApplyResult, frontend: Frontend, owner: NamespacedName, holder: object
    ) -> None:
        message = f"frontend {frontend} of {owner} is already used by {holder}: skipped"
        log.error(message)
        result.errors.append(message)
        if self.metrics:
            self.metrics.frontend_conflicts.inc()

    def _upsert(
        self,
        frontend: Frontend,
        owner: NamespacedName,
        want: DesiredFrontend,
        current: Realized | None,
        result: ApplyResult,
        *,
        full: bool,
    ) -> None:
        if (
            current is not None
            and current.desired == want
            and not full
            and current.table is not None
        ):
            result.unchanged += 1
            return
        plan = self._plan(frontend, want, current)
        try:
            entry, written = self._write(frontend, want, current, plan, result)
        except MapError:
            self._abandon(plan, current)
            raise
        self._account(frontend, owner, want, current, plan, entry, written, result)

    def _plan(self, frontend: Frontend, want: DesiredFrontend, current: Realized | None) -> _Plan:
        """Everything that can run out of room, allocated in memory before any write."""
        name = str(want.service)
        usable = tuple(b for b in want.backends if b.weight > 0)
        new_backends = [b.backend for b in usable if b.backend not in self._id_of]
        ranges = frozenset(want.source_ranges)
        added_ranges = ranges - (current.ranges if current is not None else frozenset())
        plan = _Plan(
            svc_id=current.entry.svc_id if current else 0,
            usable=usable,
            ranges=ranges,
            new_backends={},
        )
        try:
            if current is None:
                plan.svc_id = self._svc_ids.allocate(f"{name} {frontend}")
            for backend in new_backends:
                plan.new_backends[backend] = self._backend_ids.allocate(
                    f"backend {backend} of {name}"
                )
            if self._range_count + len(added_ranges) > self.maps.source_ranges.capacity:
                raise MapFullError(
                    self.maps.source_ranges.name,
                    self.maps.source_ranges.capacity,
                    f"{len(added_ranges)} source ranges of {name} {frontend}",
                )
            ids = {
                **{b.backend: self._id_of.get(b.backend, 0) for b in usable},
                **plan.new_backends,
            }
            plan.table, plan.size = self._table_for(usable, ids, current)
            plan.reuse = bool(
                current is not None
                and current.table is not None
                and plan.size
                and current.entry.table_size == plan.size
            )
            if plan.size and not plan.reuse:
                plan.new_range = (self._slots.allocate(plan.size, f"{name} {frontend}"), plan.size)
        except MapFullError:
            self._abandon(plan, current)
            raise
        return plan

    def _abandon(self, plan: _Plan, current: Realized | None) -> None:
        """Give back what a failed frontend allocated; nothing refers to it yet."""
        for backend, backend_id in plan.new_backends.items():
            if self._id_of.get(backend) == backend_id and self._refs.get(backend_id, 0) == 0:
                continue  # already written: collected as unreferenced at the end of apply
            self._backend_ids.release(backend_id)
        if plan.new_range is not None:
            self._slots.release(*plan.new_range)
        if current is None and plan.svc_id:
            self._svc_ids.release(plan.svc_id)

    def _write(
        self,
        frontend: Frontend,
        want: DesiredFrontend,
        current: Realized | None,
        plan: _Plan,
        result: ApplyResult,
    ) -> tuple[ServiceEntry, int]:
        """The map writes of one frontend, in an order the datapath can run through."""
        for backend, backend_id in plan.new_backends.items():
            self._id_of[backend] = backend_id
            self._refs[backend_id] = 0
            self._maybe_unused.add(backend_id)  # until a table names it
        for wb in plan.usable:
            self._write_backend(self._id_of[wb.backend], wb, result)

        written, offset = 0, 0
        if plan.reuse and current is not None and current.table is not None:
            offset = current.entry.table_off
            changed = maglev.changed_slots(current.table, plan.table)
            if len(changed):
                self.maps.slots.write(offset, plan.table, changed)
                written = len(changed)
        elif plan.new_range is not None:
            offset = plan.new_range[0]
            self.maps.slots.write(offset, plan.table)
            written = plan.size
        if written:
            result.count_write(self.maps.slots.name, written)

        # Allowed ranges go in before an entry that checks them, and out after it.
        old_ranges = current.ranges if current is not None else frozenset()
        for network in sorted(plan.ranges - old_ranges):
            self.maps.source_ranges.put(SourceRange(plan.svc_id, network), 1)
            self._range_count += 1
            result.count_write(self.maps.source_ranges.name)
        name = str(want.service)
        if current is None or current.name != name:
            self.maps.service_meta.put(plan.svc_id, name)
            result.count_write(self.maps.service_meta.name)
        entry = ServiceEntry(plan.svc_id, offset, plan.size, len(plan.usable), want.flags)
        if current is None or current.entry != entry:
            self.maps.services.put(frontend, entry)
            result.count_write(self.maps.services.name)
        for network in sorted(old_ranges - plan.ranges):
            self.maps.source_ranges.delete(SourceRange(plan.svc_id, network))
            self._range_count -= 1
            result.count_write(self.maps.source_ranges.name)
        return entry, written

    def _account(
        self,
        frontend: Frontend,
        owner: NamespacedName,
        want: DesiredFrontend,
        current: Realized | None,
        plan: _Plan,
        entry: ServiceEntry,
        written: int,
        result: ApplyResult,
    ) -> None:
        """Update references, quarantine a replaced range, record and log the change."""
        replaced = current is not None and current.entry.table_size and current.table is not None
        if replaced and current is not None and not plan.reuse:
            self._quarantine.append((current.entry.table_off, current.entry.table_size))
            if plan.size and self.metrics:
                self.metrics.table_resizes.inc()
        old_ids = current.backend_ids if current is not None else set()
        new_ids = set(np.unique(plan.table).tolist()) if plan.size else set()
        for backend_id in new_ids - old_ids:
            self._refs[backend_id] = self._refs.get(backend_id, 0) + 1
        for backend_id in old_ids - new_ids:
            self._unref(backend_id)
        name = str(want.service)
        self._set_realized(frontend, Realized(entry, name, owner, plan.table, want, plan.ranges))
        result.slots_written += written
        if self.metrics and written:
            self.metrics.slots_written.inc(written)
        if current is None:
            result.added += 1
            log.info(
                "service %s %s added: %d backends, %s",
                name,
                frontend,
                len(plan.usable),
                f"{plan.size} slots at {entry.table_off}"
                if plan.size
                else "no usable endpoint (refusing)",
            )
        elif current.entry != entry or written or current.ranges != plan.ranges:
            result.updated += 1
            added = sorted(str(self._backend_entry[i].backend) for i in new_ids - old_ids)
            gone = sorted(
                str(self._backend_entry[i].backend)
                for i in old_ids - new_ids
                if i in self._backend_entry
            )
            log.info(
                "service %s %s updated: backends %d -> %d%s%s, %d slots written%s",
                name,
                frontend,
                current.entry.backend_count,
                len(plan.usable),
                f" +{','.join(added)}" if added else "",
                f" -{','.join(gone)}" if gone else "",
                written,
                f" (table {current.entry.table_size} -> {plan.size})"
                if current.entry.table_size != plan.size
                else "",
            )
        else:
            result.unchanged += 1

    def _table_for(
        self,
        usable: tuple[WeightedBackend, ...],
        ids: Mapping[Backend, int],
        current: Realized | None,
    ) -> tuple[SlotArray, int]:
        if not usable:
            return _EMPTY, 0
        current_size = current.entry.table_size if current and current.entry.table_size else None
        size = maglev.table_size_for(
            len(usable), max_size=self.max_table_size, current=current_size
        )
        table = maglev.build_table(
            {str(b.backend): b.weight for b in usable}, size, seed=self.hash_seed
        )
        by_name = {str(b.backend): ids[b.backend] for b in usable}
        id_of_index = np.array([by_name[n] for n in table.backends], dtype=np.uint32)
        return id_of_index[table.slots], size

    def _write_backend(self, backend_id: int, wb: WeightedBackend, result: ApplyResult) -> None:
        entry = BackendEntry(wb.backend, wb.flags)
        if self._backend_entry.get(backend_id) == entry:
            return
        self.maps.backends.put(backend_id, entry)
        self._backend_entry[backend_id] = entry
        result.count_write(self.maps.backends.name)

    def _remove(self, frontend: Frontend, realized: Realized, result: ApplyResult) -> None:
        self.maps.services.delete(frontend)
        self.maps.service_meta.delete(realized.entry.svc_id)
        result.count_write(self.maps.services.name)
        result.count_write(self.maps.service_meta.name)
        for network in realized.ranges:
            self.maps.source_ranges.delete(SourceRange(realized.entry.svc_id, network))
            self._range_count -= 1
            result.count_write(self.maps.source_ranges.name)
        self._svc_ids.release(realized.entry.svc_id)
        if realized.entry.table_size and realized.table is not None:
            self._quarantine.append((realized.entry.table_off, realized.entry.table_size))
        for backend_id in realized.backend_ids:
            self._unref(backend_id)
        self._drop_realized(frontend)
        result.removed += 1
        log.info("service %s %s removed", realized.name or "(unnamed)", frontend)

    def _set_realized(self, frontend: Frontend, realized: Realized) -> None:
        previous = self.realized.get(frontend)
        if previous is not None and previous.owner != realized.owner:
            self._by_owner[previous.owner].discard(frontend)
        self.realized[frontend] = realized
        self._by_owner.setdefault(realized.owner, set()).add(frontend)

    def _drop_realized(self, frontend: Frontend) -> None:
        realized = self.realized.pop(frontend)
        owned = self._by_owner[realized.owner]
        owned.discard(frontend)
        if not owned:
            del self._by_owner[realized.owner]

    def _unref(self, backend_id: int) -> None:
        self._refs[backend_id] = self._refs.get(backend_id, 1) - 1
        if self._refs[backend_id] <= 0:
            self._maybe_unused.add(backend_id)

    def _collect_backends(self, result: ApplyResult) -> None:
        """Delete backends no table names any more (after every slot stopped naming them)."""
        candidates, self._maybe_unused = self._maybe_unused, set()
        for backend_id in sorted(candidates):
            if self._refs.get(backend_id, 0) > 0 or backend_id not in self._refs:
                continue
            entry = self._backend_entry.pop(backend_id, None)
            self.maps.backends.delete(backend_id)
            result.count_write(self.maps.backends.name)
            self._backend_ids.release(backend_id)
            del self._refs[backend_id]
            if entry is not None and self._id_of.get(entry.backend) == backend_id:
                del self._id_of[entry.backend]

    def _update_gauges(self, result: ApplyResult) -> None:
        if not self.metrics:
            return
        self.metrics.frontends.set(len(self.realized))
        self.metrics.backends.set(len(self._backend_entry))
        self.metrics.slots_used.set(self._slots.used)
