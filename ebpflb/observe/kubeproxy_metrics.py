"""kube-proxy's own metrics, under kube-proxy's names, so dashboards and alerts written for
kube-proxy (`kubeproxy_*` on the metrics bind address, 10249, /metrics) keep working.

Definitions follow kubernetes/kubernetes pkg/proxy/metrics/metrics.go (names, types,
buckets) with the `ip_family` label the v1.36 metrics reference lists; ebpflb programs
IPv4 only, so every series has ip_family="IPv4". The children exist from the start (zero),
as kube-proxy's unlabelled metrics did, so a dashboard never sees a missing series.

What each one measures here (the agent feeds them; see ebpflb.sync.agent):

- sync_proxy_rules_duration_seconds: every sync (a map apply), full or partial;
  sync_full_... the first sync and the periodic resyncs (maps re-read and repaired),
  sync_partial_... the syncs of changed services only.
- sync_proxy_rules_last_timestamp_seconds: unix time of the last sync that left nothing
  to retry; ..._last_queued_timestamp_seconds: of the last change queued after the initial
  lists (kube-proxy's Sync()).
- network_programming_duration_seconds: from an EndpointSlice's
  endpoints.kubernetes.io/last-change-trigger-time to the end of the map writes of the sync
  that programmed its service, once per slice change, as kube-proxy's
  EndpointsChangeTracker records it (changes older than the agent's start are not).
- sync_proxy_rules_{service,endpoint}_changes_total: every Service / IPv4 EndpointSlice
  event (add, update, delete); ..._pending: services with a pending change / slice updates
  that changed something, since the last sync took them.
- sync_proxy_rules_no_local_endpoints_total{traffic_policy}: service ports whose internal
  (internalTrafficPolicy: Local) or external (externalTrafficPolicy: Local, NodePort or
  LoadBalancer or external IPs) traffic has no local endpoint on this node.
- proxy_healthz_total{code}, proxy_livez_total{code}: answers of the health server.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

IP_FAMILY = "IPv4"


def exponential_buckets(start: float, factor: float, count: int) -> tuple[float, ...]:
    """Prometheus's ExponentialBuckets."""
    return tuple(start * factor**i for i in range(count))


def linear_buckets(start: float, width: float, count: int) -> tuple[float, ...]:
    """Prometheus's LinearBuckets."""
    return tuple(start + width * i for i in range(count))


# metrics.ExponentialBuckets(0.001, 2, 15): 1 ms .. 16.384 s.
SYNC_BUCKETS = exponential_buckets(0.001, 2, 15)
# metrics.MergeBuckets(LinearBuckets(0.25, 0.25, 2), (1, 1, 59), (60, 5, 12), (120, 30, 7)):
# 0, then 0.25 s .. 5 min (MergeBuckets starts from a zero bucket: make([]float64, 1)).
PROGRAMMING_BUCKETS = (
    0.0,
    *linear_buckets(0.25, 0.25, 2),
    *linear_buckets(1, 1, 59),
    *linear_buckets(60, 5, 12),
    *linear_buckets(120, 30, 7),
)
TRAFFIC_POLICIES = ("internal", "external")


class KubeProxyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        family = ["ip_family"]

        def sync_histogram(name: str, text: str) -> Histogram:
            return Histogram(name, text, family, registry=registry, buckets=SYNC_BUCKETS)

        self.sync_duration = sync_histogram(
            "kubeproxy_sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds"
        )
        self.sync_full_duration = sync_histogram(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
        )
        self.sync_partial_duration = sync_histogram(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
        )
        self.last_timestamp = Gauge(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            family,
            registry=registry,
        )
        self.last_queued_timestamp = Gauge(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            family,
            registry=registry,
        )
        self.network_programming = Histogram(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            family,
            registry=registry,
            buckets=PROGRAMMING_BUCKETS,
        )
        self.endpoint_changes_pending = Gauge(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            registry=registry,
        )
        self.endpoint_changes = Counter(
            "kubeproxy_sync_proxy_rules_endpoint_changes_total",
            "Cumulative proxy rules Endpoint changes",
            registry=registry,
        )
        self.service_changes_pending = Gauge(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            registry=registry,
        )
        self.service_changes = Counter(
            "kubeproxy_sync_proxy_rules_service_changes_total",
            "Cumulative proxy rules Service changes",
            registry=registry,
        )
        self.no_local_endpoints = Gauge(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            ["ip_family", "traffic_policy"],
            registry=registry,
        )
        self.healthz = Counter(
            "kubeproxy_proxy_healthz_total",
            "Cumulative proxy healthz HTTP status",
            ["code"],
            registry=registry,
        )
        self.livez = Counter(
            "kubeproxy_proxy_livez_total",
            "Cumulative proxy livez HTTP status",
            ["code"],
            registry=registry,
        )
        for metric in (
            self.sync_duration,
            self.sync_full_duration,
            self.sync_partial_duration,
            self.last_timestamp,
            self.last_queued_timestamp,
            self.network_programming,
        ):
            metric.labels(IP_FAMILY)
        for policy in TRAFFIC_POLICIES:
            self.no_local_endpoints.labels(IP_FAMILY, policy)

    def sync_done(self, seconds: float, *, full: bool, ok: bool, wall: float) -> None:
        """One sync ran for `seconds`; `ok`: nothing left to retry; `wall`: unix time now."""
        self.sync_duration.labels(IP_FAMILY).observe(seconds)
        (self.sync_full_duration if full else self.sync_partial_duration).labels(IP_FAMILY).observe(
            seconds
        )
        if ok:
            self.last_timestamp.labels(IP_FAMILY).set(wall)

    def queued(self, wall: float) -> None:
        self.last_queued_timestamp.labels(IP_FAMILY).set(wall)

    def programmed(self, latencies: Iterable[float]) -> None:
        histogram = self.network_programming.labels(IP_FAMILY)
        for seconds in latencies:
            histogram.observe(seconds)

    def health_answered(self, path: str, status: int) -> None:
        """One /healthz or /livez answer (kube-proxy counts them by HTTP status)."""
        counter = self.healthz if path == "/healthz" else self.livez
        counter.labels(str(status)).inc()

    def set_no_local_endpoints(self, internal: int, external: int) -> None:
        self.no_local_endpoints.labels(IP_FAMILY, "internal").set(internal)
        self.no_local_endpoints.labels(IP_FAMILY, "external").set(external)
