"""The ordered write steps, each taking every planned frontend at once (one batch per map,
so a start with 10,000 services costs a few syscalls rather than 50,000):

1. backends, before any slot names them;
2. the Maglev slots (only the changed ones when a table keeps its range; a table that
   changes size is written to a fresh range), TABLE_CHUNK tables at a time;
3. source ranges now allowed, before the entry that checks them;
4. the service metadata, the zeroed counters of a new frontend's service id (an id is
   reused after its frontend went, and its counts must not carry over), then the service
   entries, each switching its frontend to what the steps before wrote in one atomic map
   update;
5. source ranges no longer allowed, after the entry stopped needing them.

A frontend whose step fails is marked failed and skipped by the later steps, so the
datapath keeps its previous state; no other frontend is touched.
"""

from __future__ import annotations

from collections.abc import Sequence

from ebpflb import maglev
from ebpflb.datapath.maps import (
    BackendEntry,
    MapSet,
    ServiceEntry,
    SlotWrite,
    SourceRange,
    network_order,
)
from ebpflb.errors import MapError
from ebpflb.model import Frontend
from ebpflb.reconcile.backends import Backends
from ebpflb.reconcile.records import Outcome, StoredTable
from ebpflb.reconcile.result import ApplyResult
from ebpflb.reconcile.space import Space
from ebpflb.reconcile.state import NO_RANGES, table_digest
from ebpflb.reconcile.tables import build_tables, ids_in

# Tables built and written per step of a big apply: bounds the memory they take at once.
TABLE_CHUNK = 2048


class Writer:
    def __init__(
        self, maps: MapSet, backends: Backends, space: Space, seed: str, *, verified: bool = False
    ) -> None:
        """`verified`: the realized digests were read from the pool in this sync (a
        restore just ran), so a table whose new digest equals its current one is
        unchanged without being read again."""
        self.maps = maps
        self.backends = backends
        self.space = space
        self.seed = seed
        self.verified = verified

    def write_all(self, outcomes: Sequence[Outcome], result: ApplyResult) -> None:
        self.write_backends(outcomes, result)
        for start in range(0, len(outcomes), TABLE_CHUNK):
            self.write_tables(outcomes[start : start + TABLE_CHUNK], result)
        self.write_added_ranges(outcomes, result)
        self.write_meta(outcomes, result)
        self.reset_counters(outcomes, result)
        self.write_entries(outcomes, result)
        self.delete_dropped_ranges(outcomes, result)

    def write_backends(self, outcomes: Sequence[Outcome], result: ApplyResult) -> None:
        written = self.backends.entries
        wanted: dict[int, BackendEntry] = {}
        for outcome in outcomes:
            plan = outcome.plan
            for backend_id, wb in zip(plan.ids, plan.usable, strict=True):
                entry = BackendEntry(wb.backend, wb.flags)
                if written.get(backend_id) != entry:
                    wanted[backend_id] = entry  # the last plan naming it decides its flags
        items = sorted(wanted.items())
        backends = self.maps.backends
        failures = backends.put_many(items)
        for index, (backend_id, entry) in enumerate(items):
            if index not in failures:
                written[backend_id] = entry
        failed = {items[index][0]: error for index, error in failures.items()}
        for outcome in outcomes if failed else ():
            error = next((failed[i] for i in outcome.plan.ids if i in failed), None)
            if error is not None:
                outcome.fail(error, backends.name)  # it needs a backend not written
        result.count_write(backends.name, len(items) - len(failures))

    def write_tables(self, outcomes: Sequence[Outcome], result: ApplyResult) -> None:
        """Build the Maglev tables of `outcomes` and write what differs from the pool."""
        pool = self.maps.slots
        live = [o for o in outcomes if o.failure is None and o.plan.size]
        tables, unbuilt = build_tables([o.plan for o in live], self.seed)
        writes: list[SlotWrite] = []
        writers: list[tuple[Outcome, StoredTable]] = []
        for index, (outcome, table) in enumerate(zip(live, tables, strict=True)):
            plan = outcome.plan
            if index in unbuilt:
                outcome.fail(unbuilt[index], pool.name)
                continue
            digest, ids = table_digest(table), ids_in(plan, table)
            if plan.reuse:
                current = plan.current
                if self.verified and current is not None and current.digest == digest:
                    outcome.table = StoredTable(ids, digest, 0)
                    continue
                # Against the pool itself, not a memory of it: drift is repaired as well.
                old = pool.read(plan.offset, plan.size)
                changed = maglev.changed_slots(old, table)
                if not len(changed):
                    outcome.table = StoredTable(ids, digest, 0)
                    continue
                writes.append(SlotWrite(plan.offset, table, changed))
                writers.append((outcome, StoredTable(ids, digest, len(changed))))
            else:
                writes.append(SlotWrite(plan.offset, table))
                writers.append((outcome, StoredTable(ids, digest, plan.size)))
        failures = pool.write_many(writes)
        for index, (outcome, stored) in enumerate(writers):
            error = failures.get(index)
            if error is None:
                outcome.table = stored
                result.count_write(pool.name, stored.written)
            else:
                outcome.fail(error, pool.name)

    def write_added_ranges(self, outcomes: Sequence[Outcome], result: ApplyResult) -> None:
        """Allowed source ranges go in before an entry that checks them (LPM tries have no
        batch writes: one syscall each, and there are few)."""
        source_ranges = self.maps.source_ranges
        for outcome in outcomes:
            plan = outcome.plan
            if outcome.failure is not None or not plan.ranges:
                continue
            old = plan.current.ranges if plan.current is not None else NO_RANGES
            for network in sorted(plan.ranges - old, key=network_order):
                twin = source_ranges.twin(network.version).name
                try:
                    source_ranges.put(SourceRange(plan.svc_id, network), 1)
                except MapError as exc:
                    outcome.fail(exc, twin)
                    break
                outcome.ranges_written += (network,)
                result.count_write(twin)

    def write_meta(self, outcomes: Sequence[Outcome], result: ApplyResult) -> None:
        named = [
            o
            for o in outcomes
            if o.failure is None and (o.plan.current is None or o.plan.current.name != o.plan.name)
        ]
        meta = self.maps.service_meta
        failures = meta.put_many([(o.plan.svc_id, o.plan.name) for o in named])
        for index, error in failures.items():
            named[index].fail(error, meta.name)
        result.count_write(meta.name, len(named) - len(failures))

    def reset_counters(self, outcomes: Sequence[Outcome], result: ApplyResult) -> None:
        """Zero the per-frontend counters of every newly allocated service id before its
        entry exists (the datapath counts only through an entry)."""
        new = [o for o in outcomes if o.failure is None and o.plan.current is None]
        counters = self.maps.service_counters
        failures = counters.reset([o.plan.svc_id for o in new])
        for index, error in failures.items():
            new[index].fail(error, counters.name)
        result.count_write(counters.name, len(new) - len(failures))

    def write_entries(self, outcomes: Sequence[Outcome], result: ApplyResult) -> None:
        """The switch: each entry makes its frontend use what the steps before wrote."""
        switched: list[Outcome] = []
        items: list[tuple[Frontend, ServiceEntry]] = []
        for outcome in outcomes:
            if outcome.failure is not None:
                continue
            plan = outcome.plan
            entry = ServiceEntry(
                plan.svc_id, plan.offset, plan.size, len(plan.usable), plan.want.flags
            )
            outcome.entry = entry
            if plan.current is None or plan.current.entry != entry:
                switched.append(outcome)
                items.append((plan.frontend, entry))
        services = self.maps.services
        failures = services.put_many(items)
        for index, error in failures.items():
            switched[index].fail(error, services.name)
        result.count_write(services.name, len(items) - len(failures))

    def delete_dropped_ranges(self, outcomes: Sequence[Outcome], result: ApplyResult) -> None:
        """Source ranges no longer allowed go after the entry stopped needing them."""
        source_ranges = self.maps.source_ranges
        for outcome in outcomes:
            plan = outcome.plan
            if outcome.failure is not None or plan.current is None or not plan.current.ranges:
                continue
            for network in sorted(plan.current.ranges - plan.ranges, key=network_order):
                source_range = SourceRange(plan.svc_id, network)
                source_ranges.delete(source_range)
                self.space.release_ranges((network,))
                result.count_write(source_ranges.twin(source_range.family).name)

    def take_back_ranges(self, outcome: Outcome) -> None:
        """Source ranges allowed for an entry that was then not written."""
        for network in outcome.ranges_written:
            self.maps.source_ranges.delete(SourceRange(outcome.plan.svc_id, network))
