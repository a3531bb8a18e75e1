"""The agent's sync path: objects -> trackers -> desired state -> reconciler -> maps.

One loop, one tracker per kind, one reconciler, whatever the source. Sources call the
ObjectSink methods from their threads; the runner's thread does every map write. Nothing
is written until every kind's initial list is in, as in kube-proxy, so a start-up never
removes services that simply have not been listed yet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ebpflb.clock import Clock, RealClock
from ebpflb.config import Config
from ebpflb.datapath.maps import MapSet
from ebpflb.desired import DesiredFrontend, NodeView, frontends_for_service
from ebpflb.errors import InvalidObjectError
from ebpflb.healthcheck import HealthCheckServers, HealthTarget
from ebpflb.metrics import Metrics
from ebpflb.model import Frontend, NamespacedName, TrafficPolicy
from ebpflb.reconcile import ApplyResult, Reconciler
from ebpflb.runner import BoundedFrequencyRunner, SyncKind
from ebpflb.sources.base import Kind
from ebpflb.tracker import EndpointSliceTracker, ServiceTracker, service_state
from ebpflb.translate import translate_service, translate_slice

log = logging.getLogger(__name__)


class Agent:
    """Implements ObjectSink; `run()` drives the sync loop until stopped."""

    def __init__(
        self,
        config: Config,
        maps: MapSet,
        metrics: Metrics,
        *,
        clock: Clock | None = None,
        node: NodeView | None = None,
        health: HealthCheckServers | None = None,
        housekeeping: Callable[[], object] | None = None,
    ) -> None:
        """`health` serves healthCheckNodePorts; `housekeeping` runs at every full resync
        (expiring idle flows)."""
        self.config = config
        self.health = health
        self.housekeeping = housekeeping
        self._health_targets: dict[NamespacedName, tuple[int, HealthTarget]] = {}
        self.node = node or NodeView(config.node_name)
        self.metrics = metrics
        self.services = ServiceTracker()
        self.slices = EndpointSliceTracker()
        self.reconciler = Reconciler(
            maps,
            hash_seed=config.hash_seed,
            max_table_size=config.maglev_max_table_size,
            metrics=metrics,
        )
        self.runner = BoundedFrequencyRunner(
            self._sync,
            min_interval=config.min_sync_period,
            max_interval=config.max_sync_period,
            retry_interval=config.retry_period,
            clock=clock or RealClock(),
        )
        self._listed: set[Kind] = set()
        self._retry: set[NamespacedName] = set()
        self._warned_orphans: set[NamespacedName] = set()
        self._restored = False
        self.synced = threading.Event()  # set after the first successful sync
        self.last_result: ApplyResult | None = None

    # ---- ObjectSink ----------------------------------------------------------------------

    def object_updated(self, kind: Kind, obj: Mapping[str, Any]) -> None:
        try:
            if kind is Kind.SERVICE:
                translation = translate_service(obj)
                if translation.ipv6_skipped:
                    self.metrics.ipv6_skipped.inc(translation.ipv6_skipped)
                previous = self.services.get(translation.ref)
                if translation.skipped and (
                    previous is None or previous.skipped != translation.skipped
                ):
                    log.info("skipping service %s: %s", translation.ref, translation.skipped)
                pending = self.services.update(translation)
            else:
                slice_ = translate_slice(obj)
                if slice_.skipped == "addressType IPv6":
                    self.metrics.ipv6_skipped.inc()
                pending = self.slices.update(slice_)
        except InvalidObjectError as exc:
            # The object's last good version (if any) stays programmed.
            log.error("invalid %s, skipped: %s", exc.kind, exc)
            self.metrics.invalid_objects.labels(exc.kind).inc()
            return
        if pending:
            self._changed()

    def object_deleted(self, kind: Kind, ref: NamespacedName) -> None:
        tracker = self.services if kind is Kind.SERVICE else self.slices
        if tracker.delete(ref):
            self._changed()

    def initial_list_done(self, kind: Kind) -> None:
        self._listed.add(kind)
        if self._listed == set(Kind):
            self.runner.enable()

    def _changed(self) -> None:
        self.metrics.pending_changes.set(self.services.pending() + self.slices.pending())
        self.runner.request()

    # ---- sync ----------------------------------------------------------------------------

    def desired_for(self, ref: NamespacedName) -> dict[Frontend, DesiredFrontend]:
        state = service_state(self.services, self.slices, ref)
        if state is None:
            return {}
        return frontends_for_service(state, self.node)

    def _sync(self, kind: SyncKind) -> bool:
        started = time.monotonic()
        changed = self.services.take_changes() | self.slices.take_changes() | self._retry
        self._retry = set()
        self.metrics.pending_changes.set(0)
        self._warn_orphan_slices(changed)
        result: ApplyResult | None = None
        if not self._restored:
            # First sync: learn what a previous agent left in the maps, then make every
            # service right; unchanged entries are not rewritten.
            self.reconciler.restore()
            self._restored = True
            result = self.reconciler.apply(self._all_desired(), full=True)
            changed = self.services.refs()
        else:
            if changed:
                result = self.reconciler.apply({ref: self.desired_for(ref) for ref in changed})
            if kind is SyncKind.FULL:
                repair = self._full_resync()
                result = repair if result is None else result
                if self.housekeeping is not None:
                    self.housekeeping()
        self._sync_health(changed)
        elapsed = time.monotonic() - started
        if result is not None:
            self._retry |= result.failed
            self.last_result = result
        ok = not self._retry
        self.metrics.sync_duration.labels(kind.value).observe(elapsed)
        self.metrics.syncs.labels(kind.value, "ok" if ok else "error").inc()
        if not self.synced.is_set():
            log.info(
                "initial sync complete in %.3fs: %d frontends, %d errors",
                elapsed,
                len(self.reconciler.realized),
                len(result.errors) if result else 0,
            )
            self.synced.set()
        return ok

    def _full_resync(self) -> ApplyResult:
        """Re-read the maps and repair anything that differs from the desired state."""
        self.reconciler.restore()
        result = self.reconciler.apply(self._all_desired(), full=True)
        for map_name, count in result.writes.items():
            self.metrics.drift_repaired.labels(map_name).inc(count)
        if result.writes:
            log.warning("full resync repaired drift: %s", result.writes)
        return result

    def _sync_health(self, changed: set[NamespacedName]) -> None:
        """Keep one health check port per externalTrafficPolicy=Local service answering
        with its count of ready endpoints on this node (kube-proxy's LocalReadyEndpoints)."""
        if self.health is None:
            return
        for ref in changed:
            self._health_targets.pop(ref, None)
            state = service_state(self.services, self.slices, ref)
            if state is None:
                continue
            local = {
                ep.address
                for eps in state.endpoints.values()
                for ep in eps
                if ep.ready and self.node.name and ep.node_name == self.node.name
            }
            for port in state.ports.values():
                if (
                    port.external_traffic_policy is TrafficPolicy.LOCAL
                    and port.health_check_node_port
                ):
                    target = HealthTarget(ref, len(local))
                    self._health_targets[ref] = (port.health_check_node_port, target)
                    break
        self.health.sync(dict(self._health_targets.values()))

    def _all_desired(self) -> dict[NamespacedName, dict[Frontend, DesiredFrontend]]:
        return {ref: self.desired_for(ref) for ref in self.services.refs()}

    def _warn_orphan_slices(self, changed: set[NamespacedName]) -> None:
        """Warn once per service whose slices name no known Service. Only services changed
        since the last sync can have become (or stopped being) orphans, so only they are
        looked at: an incremental sync stays O(changes) with 10,000 services."""
        for service in sorted(changed):
            slices = self.slices.slices_for(service)
            if not slices or self.services.get(service) is not None:
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
