"""Prometheus metrics, registered into an injected registry (never the global one), so
tests and several agents in one process stay isolated.

Datapath counters live in a per-CPU BPF array; ``DatapathCollector`` sums them at scrape
time instead of copying them periodically.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ebpflb.observe.kubeproxy_metrics import KubeProxyMetrics

log = logging.getLogger(__name__)


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.kube_proxy = KubeProxyMetrics(registry)  # kube-proxy's names, for its dashboards
        self.sync_duration = Histogram(
            "ebpflb_sync_duration_seconds",
            "Time to apply one sync to the BPF maps.",
            ["kind"],
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.syncs = Counter(
            "ebpflb_syncs_total",
            "Syncs run, by kind and result.",
            ["kind", "result"],
            registry=registry,
        )
        self.pending_changes = Gauge(
            "ebpflb_pending_changes", "Services changed since the last sync.", registry=registry
        )
        self.frontends = Gauge(
            "ebpflb_frontends", "Frontends (VIP:port/proto) programmed.", registry=registry
        )
        self.backends = Gauge("ebpflb_backends", "Distinct backends programmed.", registry=registry)
        self.slots_used = Gauge(
            "ebpflb_maglev_slots_used",
            "Slots of the pool owned by Maglev tables.",
            registry=registry,
        )
        # ebpflb_map_capacity, _entries and _fill_ratio: observe.fill.MapFillCollector.
        self.map_errors = Counter(
            "ebpflb_map_errors_total",
            "Frontends not programmed, by the map or limit they hit and the reason: full (no"
            " room), table_size (more backends than the largest Maglev table allowed has"
            " slots), error (the kernel refused a write). Counted at every attempt.",
            ["map", "reason"],
            registry=registry,
        )
        self.invalid_objects = Counter(
            "ebpflb_invalid_objects_total",
            "Objects (and manifest documents, kind Manifest) rejected, by kind and reason"
            " (decode, parse, type, value, missing, internal); their last good version stays.",
            ["kind", "reason"],
            registry=registry,
        )
        self.sysctl_errors = Counter(
            "ebpflb_sysctl_errors_total",
            "Node sysctls kube-proxy sets that the agent could not set (read-only /proc/sys),"
            " by sysctl.",
            ["sysctl"],
            registry=registry,
        )
        self.external_ips_refused = Counter(
            "ebpflb_external_ips_refused_total",
            "Service externalIPs not programmed: outside --external-ip-cidrs (CVE-2020-8554).",
            registry=registry,
        )
        self.ports_skipped = Counter(
            "ebpflb_ports_skipped_total",
            "Service ports left out while the Service's other ports are programmed, by reason"
            " (protocol: SCTP).",
            ["reason"],
            registry=registry,
        )
        self.slots_written = Counter(
            "ebpflb_maglev_slots_written_total",
            "Maglev slots written to the pool.",
            registry=registry,
        )
        self.map_grows = Counter(
            "ebpflb_map_grows_total",
            "Maps swapped for a larger copy (they start small and grow up to their limit).",
            ["map"],
            registry=registry,
        )
        self.table_resizes = Counter(
            "ebpflb_maglev_table_resizes_total",
            "Maglev tables moved to a new size (the service crossed a size rung).",
            registry=registry,
        )
        self.frontends_failed = Gauge(
            "ebpflb_frontends_failed",
            "Frontends that could not be programmed at their last attempt (retried).",
            registry=registry,
        )
        self.undersized_tables = Gauge(
            "ebpflb_maglev_undersized_tables",
            "Frontends whose Maglev table gives its backends fewer than 100 slots each (the"
            " largest table allowed is too small for an even spread).",
            registry=registry,
        )
        self.drift_repaired = Counter(
            "ebpflb_drift_repaired_total",
            "Map entries found different from the desired state at a full resync and fixed.",
            ["map"],
            registry=registry,
        )
        self.node_address_changes = Counter(
            "ebpflb_node_address_changes_total",
            "IPv4 addresses added to and removed from the interfaces the agent is attached"
            " to while it runs (NodePort frontends follow them).",
            ["change"],
            registry=registry,
        )
        self.frontend_conflicts = Counter(
            "ebpflb_frontend_conflicts_total",
            "Frontends claimed by two services; the later claim is refused.",
            registry=registry,
        )


class DatapathCollector(Collector):
    """Exposes the per-CPU datapath counters (STAT_*) summed at scrape time."""

    def __init__(self, read: Callable[[], dict[str, int]]) -> None:
        self._read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "ebpflb_datapath_events",
            "Datapath events counted by the BPF programs.",
            labels=["event"],
        )
        try:
            counters = self._read()
        except Exception:  # a scrape must not take the agent down
            log.exception("reading datapath counters failed")
            counters = {}
        for event, value in sorted(counters.items()):
            family.add_metric([event], value)
        yield family


class SourceCollector(Collector):
    """Exposes what the source of Services and EndpointSlices counted (lists, relists,
    watch events, failures; manifest reloads and parse errors), read at scrape time."""

    def __init__(self, read: Callable[[], Mapping[str, Mapping[str, int]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "ebpflb_source_events",
            "Source activity: lists, relists, watches, events, failures, reloads, errors.",
            labels=["source", "event"],
        )
        for source, counters in sorted(self._read().items()):
            for event, value in sorted(counters.items()):
                family.add_metric([source, event], value)
        yield family


class StatusCollector(Collector):
    """Start-up phases and frontend changes from the agent's status record (the same
    figures /status shows), read at scrape time."""

    def __init__(
        self,
        phases: Callable[[], Mapping[str, float]],
        changes: Callable[[], Mapping[str, int]],
    ) -> None:
        self._phases = phases
        self._changes = changes

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        phases = GaugeMetricFamily(
            "ebpflb_startup_phase_seconds",
            "Seconds from the process start to the end of each start-up phase.",
            labels=["phase"],
        )
        for phase, seconds in self._phases().items():
            phases.add_metric([phase], seconds)
        yield phases
        changes = CounterMetricFamily(
            "ebpflb_frontend_changes",
            "Frontends (VIP:port/proto) added, updated and removed in the maps by syncs.",
            labels=["change"],
        )
        for change, count in sorted(self._changes().items()):
            changes.add_metric([change], count)
        yield changes
