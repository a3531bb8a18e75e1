"""The agent's sync loop, told to kube-proxy's metrics as kube-proxy would tell them.

The agent calls one method per event (an object event, a queued change, a sync taking the
changes, a service refreshed, the map writes done, the sync's end); this keeps the
bookkeeping, the network programming latencies in particular, out of the agent:

- a slice update's trigger time (EndpointSliceTracker) is taken by the sync that takes its
  change, and observed when that sync's map writes are done, unless its service failed to
  be written: then it waits for the retry that programs it;
- no_local_endpoints is counted per service port when a service is refreshed, and summed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from ebpflb.clock import Clock
from ebpflb.k8s.trackers import EndpointSliceTracker, ServiceState, ServiceTracker
from ebpflb.model import Endpoint, NamespacedName, TrafficPolicy
from ebpflb.observe.kubeproxy_metrics import KubeProxyMetrics


class ProxySyncRecorder:
    def __init__(
        self,
        metrics: KubeProxyMetrics,
        services: ServiceTracker,
        slices: EndpointSliceTracker,
        clock: Clock,
        node_name: str | None,
    ) -> None:
        self.metrics = metrics
        self._services = services
        self._slices = slices
        self._clock = clock
        self._node_name = node_name
        # Trigger times taken by a sync whose service is not programmed yet.
        self._unobserved: dict[NamespacedName, list[float]] = {}
        self._no_local: dict[NamespacedName, tuple[int, int]] = {}
        self._no_local_total = (0, 0)

    # ---- object events (source threads) --------------------------------------------------

    def service_event(self) -> None:
        """A Service was added, updated or deleted (kube-proxy's ServiceChangeTracker.Update)."""
        self.metrics.service_changes.inc()
        self.metrics.service_changes_pending.set(self._services.pending())

    def slice_event(self) -> None:
        """An EndpointSlice was added, updated or deleted (EndpointSliceUpdate)."""
        self.metrics.endpoint_changes.inc()
        self.metrics.endpoint_changes_pending.set(self._slices.pending_updates())

    def queued(self) -> None:
        """A change was queued for the datapath after the initial lists (kube-proxy's Sync)."""
        self.metrics.queued(self._clock.wall())

    # ---- the sync (the sync thread) ------------------------------------------------------

    def taking_changes(self) -> None:
        """Call just before the sync takes the trackers' changes."""
        for service, times in self._slices.take_trigger_times().items():
            self._unobserved.setdefault(service, []).extend(times)

    def changes_taken(self) -> None:
        self.metrics.endpoint_changes_pending.set(0)
        self.metrics.service_changes_pending.set(0)

    def written(self, failed: Collection[NamespacedName]) -> None:
        """The sync's map writes are done; the services in `failed` were not programmed."""
        now = self._clock.wall()
        done = [service for service in self._unobserved if service not in failed]
        latencies = [now - t for service in done for t in self._unobserved.pop(service)]
        self.metrics.programmed(latencies)

    def sync_done(self, seconds: float, *, full: bool, ok: bool) -> None:
        self.metrics.sync_done(seconds, full=full, ok=ok, wall=self._clock.wall())

    def refreshed(self, service: NamespacedName, state: ServiceState | None) -> None:
        """`service` was recomputed from the trackers (None: it is not programmed)."""
        counts = (0, 0) if state is None else no_local_endpoints(state, self._node_name)
        old = self._no_local.pop(service, (0, 0))
        if counts != (0, 0):
            self._no_local[service] = counts
        if counts != old:
            internal, external = self._no_local_total
            self._no_local_total = (
                internal + counts[0] - old[0],
                external + counts[1] - old[1],
            )
            self.metrics.set_no_local_endpoints(*self._no_local_total)


def no_local_endpoints(state: ServiceState, node_name: str | None) -> tuple[int, int]:
    """(internal, external): the service's ports whose Local policy finds no usable endpoint
    on this node while the service has usable endpoints elsewhere, as kube-proxy's proxiers
    count them (a port with no endpoint at all is a rejection, not counted)."""
    internal = external = 0
    for name, port in state.ports.items():
        endpoints = state.endpoints.get(name, ())
        if not _usable(endpoints):
            continue
        has_local = bool(_usable([e for e in endpoints if node_name and e.node_name == node_name]))
        if port.internal_traffic_policy is TrafficPolicy.LOCAL and not has_local:
            internal += 1
        externally_accessible = bool(port.node_port or port.external_ips or port.load_balancer_ips)
        if (
            externally_accessible
            and port.external_traffic_policy is TrafficPolicy.LOCAL
            and not has_local
        ):
            external += 1
    return internal, external


def _usable(endpoints: Iterable[Endpoint]) -> list[Endpoint]:
    """kube-proxy's CategorizeEndpoints: the ready ones, else the serving terminating ones."""
    endpoints = list(endpoints)
    ready = [e for e in endpoints if e.ready]
    return ready or [e for e in endpoints if e.serving and e.terminating]
