"""The agent's sync path: objects -> trackers -> desired state -> reconciler -> maps.

One loop, one tracker per kind, one reconciler, whatever the source. Sources call the
ObjectSink methods from their threads; the runner's thread does every map write. Nothing
is written until every kind's initial list is in, as in kube-proxy, so a start-up never
removes services that simply have not been listed yet, and until the maps exist: a source
may start listing while the datapath is still being compiled (`use_maps` comes later).

The desired frontends of every service are kept, and recomputed only for the services
that changed, so a periodic full resync costs the reading back of the maps, not a pass
through translation and Maglev for 100,000 services.

Over 400 lines: the hub where the sink, the trackers, the sync loop and the reconciler meet.
The next split is the sink side (objects in) from the sync side (maps out).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ebpflb.clock import Clock, RealClock
from ebpflb.config import Config
from ebpflb.datapath.maps import MapSet
from ebpflb.desired import DesiredFrontend, NodeView, external_ips, frontends_for_service
from ebpflb.errors import Fault, InvalidObjectError
from ebpflb.k8s.sources.base import Kind
from ebpflb.k8s.sources.documents import MANIFEST
from ebpflb.k8s.trackers import EndpointSliceTracker, ServiceState, ServiceTracker, service_state
from ebpflb.k8s.translate import (
    ServiceTranslation,
    SliceTranslation,
    object_ref,
    translate_service,
    translate_slice,
)
from ebpflb.model import Frontend, IPAddress, NamespacedName, TrafficPolicy
from ebpflb.observe.metrics import Metrics
from ebpflb.observe.proxysync import ProxySyncRecorder
from ebpflb.observe.status import AgentStatus, SyncRecord, SyncRecordKind
from ebpflb.reconcile import ApplyResult, Reconciler
from ebpflb.sync.healthcheck import HealthCheckServers, HealthTarget
from ebpflb.sync.runner import BoundedFrequencyRunner, SyncKind

log = logging.getLogger(__name__)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC inside: a sync allocates in bulk (a full resync rebuilds the realized
    state of every frontend, a million objects at 100,000 services), and collections
    would walk the growing heap again and again, doubling its time. The GC catches up
    afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Agent:
    """Implements ObjectSink; `run()` drives the sync loop until stopped."""

    def __init__(
        self,
        config: Config,
        maps: MapSet | None,
        metrics: Metrics,
        *,
        clock: Clock | None = None,
        node: NodeView | None = None,
        health: HealthCheckServers | None = None,
        housekeeping: Callable[[], object] | None = None,
        on_synced: Callable[[], object] | None = None,
        status: AgentStatus | None = None,
    ) -> None:
        """`maps` None: given later with `use_maps`. `health` serves healthCheckNodePorts;
        `housekeeping` runs at every full resync (expiring idle flows); `on_synced` once,
        after the first sync. `status` is told of lists, queued changes, syncs and
        rejected objects (/status, /healthz)."""
        self.config = config
        self.status = status
        self.health = health
        self.housekeeping = housekeeping
        self._on_synced = on_synced
        self._health_targets: dict[NamespacedName, tuple[int, HealthTarget]] = {}
        self.node = node or NodeView.of(config)
        self._node_lock = threading.Lock()
        self._node_changed = False  # every service's frontends to be recomputed
        self.metrics = metrics
        self._clock = clock or RealClock()
        self.services = ServiceTracker()
        # Trigger times from before the agent started were programmed by someone else.
        self.slices = EndpointSliceTracker(start_time=self._clock.wall())
        self.proxy_sync = ProxySyncRecorder(
            metrics.kube_proxy, self.services, self.slices, self._clock, self.node.name
        )
        self._reconciler: Reconciler | None = None
        self._desired: dict[NamespacedName, dict[Frontend, DesiredFrontend]] = {}
        self._enable_lock = threading.Lock()
        self._ready = False  # lists in and maps given: syncs may run
        self.runner = BoundedFrequencyRunner(
            self._sync,
            min_interval=config.min_sync_period,
            max_interval=config.max_sync_period,
            retry_interval=config.retry_period,
            clock=self._clock,
        )
        self._listed: set[Kind] = set()
        self._retry: set[NamespacedName] = set()
        self._warned_orphans: set[NamespacedName] = set()
        self._restored = False
        self._resync_due = False  # a full resync raised: the next sync does it again
        self.synced = threading.Event()  # set after the first successful sync
        self.last_result: ApplyResult | None = None
        if maps is not None:
            self.use_maps(maps)

    @property
    def reconciler(self) -> Reconciler:
        if self._reconciler is None:
            raise RuntimeError("the agent has no maps yet (use_maps)")
        return self._reconciler

    def use_maps(self, maps: MapSet) -> None:
        """The maps to write, once they exist; syncing starts when the lists are in too."""
        with self._enable_lock:
            self._reconciler = Reconciler(
                maps,
                hash_seed=self.config.hash_seed,
                max_table_size=self.config.maglev_max_table_size,
                metrics=self.metrics,
            )
        self._enable_when_ready()

    # ---- ObjectSink ----------------------------------------------------------------------

    def object_updated(self, kind: Kind, obj: Mapping[str, Any]) -> None:
        """Translate and track one object. Whatever is wrong with it (or with translation)
        rejects this object only: its last good version stays programmed."""
        translation: ServiceTranslation | SliceTranslation
        try:
            translation = translate_service(obj) if kind is Kind.SERVICE else translate_slice(obj)
        except InvalidObjectError as exc:
            self.object_invalid(exc)
            return
        except Exception as exc:  # a bug in translation: still only this object's problem
            error = InvalidObjectError(
                kind.value,
                _name_of(obj),
                f"{type(exc).__name__}: {str(exc)[:200]}",
                fault=Fault.INTERNAL,
            )
            error.__cause__ = exc
            self.object_invalid(error)
            return
        if isinstance(translation, ServiceTranslation):
            pending = self._service_updated(translation)
        else:
            pending = self.slices.update(translation)
            # kube-proxy's IPv4 tracker sees IPv4 slices only
            if translation.skipped is None and translation.family == 4:
                self.proxy_sync.slice_event()
        if self.status is not None:
            self.status.object_accepted(kind.value, str(translation.ref))
        if pending:
            self._changed()

    def _service_updated(self, translation: ServiceTranslation) -> bool:
        previous = self.services.latest(translation.ref)
        if translation.skipped and (previous is None or previous.skipped != translation.skipped):
            log.info("skipping service %s: %s", translation.ref, translation.skipped)
        # What is left out of a Service is reported when it first is, not at every update.
        left_out = {(p.name, p.port, p.protocol): p for p in translation.skipped_ports}
        before = {(p.name, p.port, p.protocol) for p in previous.skipped_ports} if previous else ()
        new_ports = [str(port) for key, port in left_out.items() if key not in before]
        if new_ports:
            log.warning(
                "service %s: port %s not programmed (protocol not supported: ebpflb programs"
                " TCP and UDP); its other ports are",
                translation.ref,
                ", ".join(new_ports),
            )
            self.metrics.ports_skipped.labels("protocol").inc(len(new_ports))
        refused = self._refused_external_ips(translation)
        if previous is not None:
            refused -= self._refused_external_ips(previous)
        for address in sorted(refused, key=lambda a: (a.version, int(a))):
            log.warning(
                "service %s: externalIP %s not programmed: outside --external-ip-cidrs"
                " (CVE-2020-8554: an externalIP would capture that address's traffic)",
                translation.ref,
                address,
            )
        self.metrics.external_ips_refused.inc(len(refused))
        pending = self.services.update(translation)
        self.proxy_sync.service_event()
        return pending

    def _refused_external_ips(self, translation: ServiceTranslation) -> set[IPAddress]:
        """The externalIPs of a Service this node does not program (desired.external_ips)."""
        ports = translation.ports.values()
        return {ip for port in ports for ip in external_ips(port, self.node)[1]}

    def object_invalid(self, error: InvalidObjectError) -> None:
        """Log and count a rejected object (or manifest document); nothing else changes."""
        log.error(
            "invalid %s, skipped: %s",
            error.kind,
            error,
            exc_info=error if error.fault is Fault.INTERNAL else None,
        )
        self.metrics.invalid_objects.labels(error.kind, error.fault.value).inc()
        # A manifest document that does not parse is the source's problem (its progress
        # lists it while the file stays broken), not an object's.
        if self.status is not None and error.kind != MANIFEST:
            self.status.object_rejected(error.kind, error.ref, str(error))

    def object_deleted(self, kind: Kind, ref: NamespacedName) -> None:
        if self.status is not None:
            self.status.object_accepted(kind.value, str(ref))
        tracker = self.services if kind is Kind.SERVICE else self.slices
        pending = tracker.delete(ref)
        if kind is Kind.SERVICE:
            self.proxy_sync.service_event()
        else:
            self.proxy_sync.slice_event()
        if pending:
            self._changed()

    def initial_list_done(self, kind: Kind) -> None:
        if self.status is not None:
            self.status.list_done(kind)
        with self._enable_lock:
            self._listed.add(kind)
        self._enable_when_ready()

    def _enable_when_ready(self) -> None:
        with self._enable_lock:
            self._ready = self._listed == set(Kind) and self._reconciler is not None
        if self._ready:
            self.runner.enable()

    def _changed(self) -> None:
        if not self._ready:
            return  # the first sync takes every service anyway: spare the initial lists this
        self.metrics.pending_changes.set(self.services.pending() + self.slices.pending())
        if self.status is not None:
            self.status.change_queued()  # kube-proxy's QueuedUpdate
        self.proxy_sync.queued()
        self.runner.request()

    def set_node_addresses(
        self, addresses: tuple[IPAddress, ...], primary: tuple[IPAddress, ...] = ()
    ) -> bool:
        """The node's addresses changed (any thread): the next sync recomputes every
        service, so NodePort frontends follow them. Whether anything changed."""
        with self._node_lock:
            before = self.node
            after = before.with_addresses(addresses, primary)
            if after == before:
                return False
            self.node = after
            self._node_changed = True
        added = [a for a in after.addresses if a not in before.addresses]
        removed = [a for a in before.addresses if a not in after.addresses]
        self.metrics.node_address_changes.labels("added").inc(len(added))
        self.metrics.node_address_changes.labels("removed").inc(len(removed))
        log.info(
            "node addresses changed: added %s, removed %s; NodePorts now on %s",
            ", ".join(map(str, added)) or "none",
            ", ".join(map(str, removed)) or "none",
            ", ".join(map(str, after.nodeport_addresses())) or "no address",
        )
        self._changed()
        return True

    # ---- sync ----------------------------------------------------------------------------

    def _sync(self, kind: SyncKind) -> bool:
        with gc_paused():
            return self._sync_unpaused(kind)

    def _sync_unpaused(self, kind: SyncKind) -> bool:
        started = self._clock.now()
        first = not self.synced.is_set()  # the first sync to complete
        if self.status is not None:
            self.status.sync_started()
        self.proxy_sync.taking_changes()
        changed = self.services.take_changes() | self.slices.take_changes() | self._retry
        with self._node_lock:
            if self._node_changed:
                changed |= self.services.refs()
            self._node_changed = False
        self._retry = set()
        self.metrics.pending_changes.set(0)
        self.proxy_sync.changes_taken()
        try:
            result = self._apply(kind, changed)
            self.proxy_sync.written(result.failed if result is not None else ())
        except BaseException:
            # Nothing given to a sync that raised is lost: its services are retried (the
            # runner schedules the retry), and a full resync or first sync is done again.
            self._retry |= changed
            if kind is SyncKind.FULL:
                self._resync_due = True
            raise
        if self.health is not None:
            self.health.sync(dict(self._health_targets.values()))
        elapsed = self._clock.now() - started
        if result is not None:
            # A frontend that could not be programmed failed alone: its service is retried
            # at the next sync, and is "pending" until then.
            self._retry |= result.failed
            self.last_result = result
        ok = not self._retry
        self.metrics.sync_duration.labels(kind.value).observe(elapsed)
        self.metrics.syncs.labels(kind.value, "ok" if ok else "error").inc()
        self.proxy_sync.sync_done(elapsed, full=first or kind is SyncKind.FULL, ok=ok)
        if self.status is not None:
            self._record_sync(first, kind, elapsed, result, ok)
        if not self.synced.is_set():
            log.info(
                "initial sync complete in %.3fs: %d frontends, %d errors",
                elapsed,
                len(self.reconciler.realized),
                len(result.errors) if result else 0,
            )
            self.synced.set()
            if self._on_synced is not None:
                self._on_synced()
        return ok

    def _apply(self, kind: SyncKind, changed: set[NamespacedName]) -> ApplyResult | None:
        self._warn_orphan_slices(changed)
        result: ApplyResult | None = None
        if not self._restored:
            # First sync: learn what a previous agent left in the maps, then make every
            # service right; unchanged entries are not rewritten. Until one completes,
            # every sync is a first one.
            self.reconciler.restore()
            self._refresh(self.services.refs() | changed)
            result = self.reconciler.apply(self._desired, full=True)
            self._restored = True
            return result
        if changed:
            result = self.reconciler.apply(self._refresh(changed))
        if kind is SyncKind.FULL or self._resync_due:
            repair = self._full_resync()
            self._resync_due = False
            result = repair if result is None else _merged(result, repair)
            if self.housekeeping is not None:
                self.housekeeping()
        return result

    def _record_sync(
        self, first: bool, kind: SyncKind, elapsed: float, result: ApplyResult | None, ok: bool
    ) -> None:
        assert self.status is not None
        result = result or ApplyResult()
        self.status.orphan_slices(
            {
                service: tuple(s.ref for s in self.slices.slices_for(service))
                for service in self._warned_orphans
            }
        )
        self.status.sync_finished(
            SyncRecord(
                kind=SyncRecordKind.FIRST if first else SyncRecordKind(kind.value),
                finished=time.time(),
                duration_s=elapsed,
                frontends=len(self.reconciler.realized),
                ok=ok,
                added=result.added,
                updated=result.updated,
                removed=result.removed,
                unchanged=result.unchanged,
                failed=len(result.failed),
                errors=tuple(result.errors),
            )
        )

    def _refresh(
        self, refs: set[NamespacedName]
    ) -> dict[NamespacedName, dict[Frontend, DesiredFrontend]]:
        """Recompute the desired frontends and health target of each service in `refs` from
        the trackers (one service_state each); what they want now, for an apply."""
        wanted = {}
        for ref in refs:
            state = service_state(self.services, self.slices, ref)
            frontends = {} if state is None else frontends_for_service(state, self.node)
            if frontends:
                self._desired[ref] = frontends
            else:
                self._desired.pop(ref, None)
            wanted[ref] = frontends
            self._health_target(ref, state)
            self.proxy_sync.refreshed(ref, state)
        return wanted

    def _full_resync(self) -> ApplyResult:
        """Re-read the maps and repair anything that differs from the desired state."""
        self.reconciler.restore()
        result = self.reconciler.apply(self._desired, full=True)
        for map_name, count in result.writes.items():
            self.metrics.drift_repaired.labels(map_name).inc(count)
        if result.writes:
            log.warning("full resync repaired drift: %s", result.writes)
        return result

    def _health_target(self, ref: NamespacedName, state: ServiceState | None) -> None:
        """Keep one health check port per externalTrafficPolicy=Local service answering
        with its count of ready endpoints on this node (kube-proxy's LocalReadyEndpoints).
        Those of the Service's primary family (its first cluster IP's, ipFamilies[0]):
        kube-proxy's proxier of each family counts its own, so a dual-stack pod is one
        endpoint, not two."""
        self._health_targets.pop(ref, None)
        if self.health is None or state is None:
            return
        for port in state.ports.values():
            if port.external_traffic_policy is TrafficPolicy.LOCAL and port.health_check_node_port:
                primary = port.cluster_ips[0].version if port.cluster_ips else 4
                local = {
                    ep.address
                    for eps in state.endpoints.values()
                    for ep in eps
                    if ep.ready
                    and self.node.name
                    and ep.node_name == self.node.name
                    and ep.address.version == primary
                }
                target = HealthTarget(ref, len(local))
                self._health_targets[ref] = (port.health_check_node_port, target)
                return

    def _warn_orphan_slices(self, changed: set[NamespacedName]) -> None:
        """Warn once per service whose slices name no known Service. Only services changed
        since the last sync can have become (or stopped being) orphans, so only they are
        looked at: an incremental sync stays O(changes) with 10,000 services."""
        unknown = []
        for service in changed:
            if self.services.get(service) is not None:
                self._warned_orphans.discard(service)
            else:
                unknown.append(service)
        for service in sorted(unknown):  # few (sorting all 100,000 names is not free)
            slices = self.slices.slices_for(service)
            if not slices:
                self._warned_orphans.discard(service)
            elif service not in self._warned_orphans:
                names = ", ".join(str(s.ref) for s in slices)
                log.warning(
                    "EndpointSlice %s names unknown service %s: ignored until it exists",
                    names,
                    service,
                )
                self._warned_orphans.add(service)

    def run(self, stop: threading.Event) -> None:
        self.runner.loop(stop)


def _name_of(obj: Any) -> str:
    """namespace/name for a message about an object translation choked on, if it has one."""
    try:
        return str(object_ref(obj))
    except Exception:
        return "?"


def _merged(changes: ApplyResult, repair: ApplyResult) -> ApplyResult:
    """One sync's result from its incremental apply and the full resync after it: what
    either failed is retried."""
    changes.failed |= repair.failed
    seen = set(changes.errors)
    changes.errors += [e for e in repair.errors if e not in seen]
    return changes
