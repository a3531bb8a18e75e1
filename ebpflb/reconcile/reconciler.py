"""The Reconciler strings the parts together: restore, claims, removals, plan, write
steps, accounting, collection of unused backends.

It remembers what it has written (checked against the pinned maps at start and at every
full resync, and relearned from them where they differ, so it is the kernel's truth and
not a belief), diffs the desired state against it, and writes only the difference.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ebpflb import maglev
from ebpflb.datapath.maps import AddrPort, MapName, MapSet, SourceRange
from ebpflb.desired import DesiredFrontend
from ebpflb.model import Frontend, NamespacedName, Proto, Scope, SvcFlags
from ebpflb.observe.metrics import Metrics
from ebpflb.reconcile import restore
from ebpflb.reconcile.affinity import AffinityMatches
from ebpflb.reconcile.backends import Backends
from ebpflb.reconcile.plan import Planner, claims
from ebpflb.reconcile.records import Outcome
from ebpflb.reconcile.report import LOG_EACH_MAX, Reporter
from ebpflb.reconcile.result import ApplyResult, Failure
from ebpflb.reconcile.space import Space
from ebpflb.reconcile.stale import purge_udp_flows
from ebpflb.reconcile.state import Leftovers, MapContents, Realized, RealizedState
from ebpflb.reconcile.write import Writer

log = logging.getLogger(__name__)


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
        self.state = RealizedState()
        self.backends = Backends(maps.backends.name, maps.backends.capacity)
        self.space = Space(maps)
        self.leftovers = Leftovers()
        self.affinity = AffinityMatches()
        # Frontends that failed at their last attempt: owner and message (report.Reporter).
        self._last_errors: dict[Frontend, tuple[NamespacedName, str]] = {}
        # An apply raised part-way (a bug, or an error no step expects): what is known may
        # no longer be what the maps hold, so it is relearned before the next apply.
        self._suspect = False
        # A restore read every table's digest from the pool: the next apply may trust them.
        self._digests_read = False

    @property
    def realized(self) -> dict[Frontend, Realized]:
        """Every frontend as it is in the maps."""
        return self.state.frontends

    def map_entries(self) -> dict[MapName, int]:
        """Entries of the maps only the control plane writes, as the reconciler knows them
        (no syscall): what `ebpflb_map_entries` reports for those maps."""
        known = {
            MapName.SERVICES: len(self.state) - self.state.ipv6,
            MapName.SERVICES6: self.state.ipv6,
            MapName.SERVICE_META: len(self.space.svc_ids),
            MapName.BACKENDS: len(self.backends),
            MapName.SLOTS: self.space.slots.used,
            MapName.SOURCE_RANGES: self.space.range_counts[4],
            MapName.SOURCE_RANGES6: self.space.range_counts[6],
        }
        if self.affinity.entries is not None:
            known[MapName.AFFINITY_MATCH] = self.affinity.entries
        return known

    def restore(self) -> None:
        """Relearn the realized state and the allocators from what the maps hold (see
        ebpflb.reconcile.restore)."""
        contents = MapContents.read(self.maps)
        if not self._suspect and restore.as_written(
            contents, self.maps, self.state, self.backends, self.space, self.leftovers
        ):
            self._digests_read = True
            return
        self.state, self.backends, self.space, self.leftovers = restore.rebuild(
            contents, self.maps, self.state, self.backends.entries, self.space.quarantined
        )
        self.affinity = AffinityMatches()  # re-read at the next apply
        self._suspect = False
        self._digests_read = True

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
        (drift repair). A frontend that cannot be programmed fails alone: it is in
        `result.failed` and `result.errors`, and the next apply that lists it retries it.
        """
        if self._suspect:
            self.restore()
        self._suspect = True  # until this apply has finished
        try:
            result = self._apply(desired, full=full)
        finally:
            self._digests_read = False
            self.maps.slots.release()  # the pool's pages are not held between syncs
        self._suspect = False
        return result

    def _apply(
        self,
        desired: Mapping[NamespacedName, Mapping[Frontend, DesiredFrontend]],
        *,
        full: bool,
    ) -> ApplyResult:
        result = ApplyResult()
        report = Reporter(self.metrics, result, self._last_errors)
        self.space.start_apply()
        wanted = claims(desired, self.state, report)

        # Removals first: they free capacity the additions may need.
        if full:
            for frontend in self.leftovers.stray:
                if frontend not in wanted:
                    self.maps.services.delete(frontend)
                    result.count_write(self.maps.services.name)
            self.leftovers.stray = []
            self._remove_leftovers(result)
        candidates = (
            list(self.state.frontends)
            if full
            else [f for owner in desired for f in self.state.owned_by(owner)]
        )
        gone = [f for f in candidates if f not in wanted]
        report.verbose_removals = len(gone) <= LOG_EACH_MAX
        released = [self.state.frontends[f].entry.svc_id for f in gone]
        flows_gone = self._udp_flows_of(gone)
        for frontend in gone:
            self._remove(frontend, result, report)

        planner = Planner(
            self.state,
            self.backends,
            self.space,
            report,
            max_table_size=self.max_table_size,
            slots_map=self.maps.slots.name,
        )
        outcomes = [Outcome(plan) for plan in planner.plan_all(wanted, desired, result)]
        writer = Writer(
            self.maps, self.backends, self.space, self.hash_seed, verified=self._digests_read
        )
        writer.write_all(outcomes, result)
        report.set_verbose(len(outcomes) <= LOG_EACH_MAX)
        failed = 0
        for outcome in outcomes:
            if outcome.failure is None:
                self._account(outcome, result, report)
            else:
                failed += 1
                self._give_up(outcome, planner, writer, report)
        flows_left, sockets_left = self._udp_backends_left(outcomes)
        for table, deleted in purge_udp_flows(self.maps, {**flows_gone, **flows_left}).items():
            result.count_write(table, deleted)
        if sockets_left:
            self.maps.destroy_udp_sockets(sockets_left)
        report.unlogged_failures()
        if not report.verbose or not report.verbose_removals:
            report.summary(len(outcomes) + len(gone), failed)

        affinity_failed = self.affinity.sync(
            self.maps,
            self.state,
            [o.plan.frontend for o in outcomes],
            released,
            result,
            full=full,
        )
        for frontend, realized in self.state.frontends.items() if affinity_failed else ():
            error = affinity_failed.get(realized.entry.svc_id)
            if error is not None and realized.owner is not None:
                failure = Failure.of(error, self.maps.affinity_match.name)
                report.failed(realized.name, frontend, realized.owner, failure)
        self.backends.collect(self.maps.backends, result)
        self._note_failures(report, desired, full=full)
        self._update_gauges()
        return result

    # ---- after writing -------------------------------------------------------------------

    def _account(self, outcome: Outcome, result: ApplyResult, report: Reporter) -> None:
        """Update references, quarantine a replaced range, record and log the change."""
        plan, entry = outcome.plan, outcome.entry
        current = plan.current
        assert entry is not None
        moved = current is not None and current.entry.table_size and not plan.reuse
        if moved and current is not None and current.owns_range:
            self.space.retire(current.entry.table_off, current.entry.table_size)
            if plan.size and self.metrics:
                self.metrics.table_resizes.inc()
        old_ids = current.backend_ids if current is not None else ()
        stored = outcome.table
        table_ids, digest, written = stored if stored is not None else ((), b"", 0)
        self.backends.reference(table_ids, old_ids)
        self.state.set(
            plan.frontend,
            Realized(entry, plan.name, plan.owner, table_ids, digest, True, plan.want, plan.ranges),
        )
        result.slots_written += written
        if self.metrics and written:
            self.metrics.slots_written.inc(written)
        if current is None:
            result.added += 1
        elif current.entry != entry or written or current.ranges != plan.ranges:
            result.updated += 1
        else:
            result.unchanged += 1
            return
        if report.log_changes:
            report.changed(outcome, old_ids, self.backends)

    def _udp_flows_of(self, frontends: list[Frontend]) -> dict[int, set[AddrPort]]:
        """Every backend of the removed UDP frontends, by service id (stale.py): their
        flows go with them. Left behind, a flow's reply translation would turn the next
        flow of the same addresses and ports (a ClusterIP's, say) into the deleted
        frontend's for up to the UDP timeout, refreshed by every reply."""
        by_svc: dict[int, set[AddrPort]] = {}
        entries = self.backends.entries
        for frontend in frontends:
            current = self.state.frontends[frontend]
            if frontend.protocol is not Proto.UDP:
                continue
            addresses = {
                AddrPort(entries[i].backend.address, entries[i].backend.port)
                for i in current.backend_ids
                if i in entries
            }
            if addresses:
                by_svc[current.entry.svc_id] = addresses
        return by_svc

    def _udp_backends_left(
        self, outcomes: list[Outcome]
    ) -> tuple[dict[int, set[AddrPort]], dict[AddrPort, set[AddrPort]]]:
        """Backends that left UDP frontends (stale.py): by service id for every frontend
        (the conntrack entries tc/XDP keep: NodePort's on the nodes' interfaces, and on
        pods' interfaces every frontend's, ClusterIPs included, as the per-packet path
        looks them up), by frontend address for the entries in-node clients use (their
        connected sockets)."""
        by_svc: dict[int, set[AddrPort]] = {}
        by_frontend: dict[AddrPort, set[AddrPort]] = {}
        entries = self.backends.entries  # before collect(): the leavers are still there
        for outcome in outcomes:
            plan, current = outcome.plan, outcome.plan.current
            frontend = plan.frontend
            if outcome.failure is not None or current is None or frontend.protocol is not Proto.UDP:
                continue
            gone = set(current.backend_ids) - set(outcome.table_ids)
            addresses = {
                AddrPort(entries[i].backend.address, entries[i].backend.port)
                for i in gone
                if i in entries
            }
            if not addresses:
                continue
            flags = current.entry.flags
            # Any frontend may hold flows: the per-packet path's (--pod-interfaces) are
            # keyed by the in-node entry's id. A frontend without flows costs a lookup.
            by_svc[plan.svc_id] = addresses
            if frontend.scope is Scope.INTERNAL or not flags & SvcFlags.INTERNAL_SCOPE:
                key = AddrPort(frontend.address, frontend.port)
                by_frontend.setdefault(key, set()).update(addresses)
        return by_svc, by_frontend

    def _give_up(
        self, outcome: Outcome, planner: Planner, writer: Writer, report: Reporter
    ) -> None:
        """A frontend that failed part-way: undo what it took, and report it."""
        plan, stored = outcome.plan, outcome.table
        current = plan.current
        if plan.reuse and stored is not None and stored.written and current is not None:
            # Its table was rewritten in place before a later step failed: record the
            # table the pool now holds, and leave the rest to be retried.
            self.backends.reference(stored.ids, current.backend_ids)
            self.state.set(
                plan.frontend,
                Realized(
                    current.entry,
                    current.name,
                    current.owner,
                    stored.ids,
                    stored.digest,
                    current.owns_range,
                    None,
                    current.ranges,
                ),
            )
        writer.take_back_ranges(outcome)
        planner.give_back(plan)
        assert outcome.failure is not None
        report.failed(plan.name, plan.frontend, plan.owner, outcome.failure)

    def _remove(self, frontend: Frontend, result: ApplyResult, report: Reporter) -> None:
        realized = self.state.frontends[frontend]
        svc_id = realized.entry.svc_id
        self.maps.services.delete(frontend)
        self.maps.service_meta.delete(svc_id)
        result.count_write(self.maps.services.name)
        result.count_write(self.maps.service_meta.name)
        for network in realized.ranges:
            self.maps.source_ranges.delete(SourceRange(svc_id, network))
            self.space.release_ranges((network,))
            result.count_write(self.maps.source_ranges.twin(network.version).name)
        self.space.svc_ids.release(svc_id)
        if realized.entry.table_size and realized.owns_range:
            self.space.retire(realized.entry.table_off, realized.entry.table_size)
        for backend_id in realized.backend_ids:
            self.backends.unref(backend_id)
        self.state.drop(frontend)
        result.removed += 1
        report.removed(realized.name, frontend)

    def _remove_leftovers(self, result: ApplyResult) -> None:
        """Metadata and source ranges of service ids no entry uses (found by restore: a
        removal cut short by a crash leaves them). Before planning, while no entry uses
        the ids: a frontend given one of them must not inherit the dead one's ranges."""
        for svc_id in self.leftovers.metas:
            self.maps.service_meta.delete(svc_id)
            result.count_write(self.maps.service_meta.name)
        self.leftovers.metas = []
        for source_range in self.leftovers.ranges:
            self.maps.source_ranges.delete(source_range)
            self.space.release_ranges((source_range.network,))
            result.count_write(self.maps.source_ranges.twin(source_range.family).name)
        self.leftovers.ranges = []

    def _note_failures(
        self,
        report: Reporter,
        desired: Mapping[NamespacedName, object],
        *,
        full: bool,
    ) -> None:
        """The frontends failing now: this apply's failures, and earlier ones it did not
        look at (of services it was not given)."""
        for frontend, (owner, _) in list(self._last_errors.items()):
            if full or owner in desired:
                del self._last_errors[frontend]
        self._last_errors.update(report.failures)

    def _update_gauges(self) -> None:
        for grow in self.space.grown:
            log.info(
                "%s grew from %d to %d slots (limit %d)",
                grow.map,
                grow.before,
                grow.after,
                grow.limit,
            )
            if self.metrics:
                self.metrics.map_grows.labels(grow.map).inc()
        self.space.grown.clear()
        if not self.metrics:
            return
        self.metrics.frontends.set(len(self.state))
        self.metrics.backends.set(len(self.backends))
        self.metrics.slots_used.set(self.space.slots.used)
        self.metrics.undersized_tables.set(self.state.undersized)
        self.metrics.frontends_failed.set(len(self._last_errors))
