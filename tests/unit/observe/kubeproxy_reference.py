"""kube-proxy's metric definitions, as recorded from kube-proxy itself (test fixture).

Sources, read 2026-11-30:
- kubernetes/kubernetes pkg/proxy/metrics/metrics.go (the v1.28+ line with
  sync_full/partial and no_local_endpoints): names, types, help, buckets;
- staging/src/k8s.io/component-base/metrics/buckets.go: MergeBuckets starts its result
  with one zero bucket (`make([]float64, 1)`), so network_programming has le="0";
- the Kubernetes metrics reference "Metrics (v1.36)" (kubernetes.io, generated from the
  code): labels (v1.36 adds `ip_family` to the per-family metrics).

Only the metrics that mean something for ebpflb are listed; left out: the iptables and
nftables rule counts and restore/cleanup failures, conntrack reconciler, nfacct packet
counters (no iptables, no conntrack entries to reconcile).

Each entry: name as exposed (a counter with its _total), type, label names, buckets
(histograms, without +Inf).
"""

from __future__ import annotations

from typing import NamedTuple


class Definition(NamedTuple):
    name: str
    type: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


# ExponentialBuckets(0.001, 2, 15)
SYNC_BUCKETS = (
    0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128,
    0.256, 0.512, 1.024, 2.048, 4.096, 8.192, 16.384,
)  # fmt: skip
# MergeBuckets(LinearBuckets(0.25, 0.25, 2), LinearBuckets(1, 1, 59),
#              LinearBuckets(60, 5, 12), LinearBuckets(120, 30, 7))
PROGRAMMING_BUCKETS = (
    0, 0.25, 0.5,
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
    21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
    41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59,
    60, 65, 70, 75, 80, 85, 90, 95, 100, 105, 110, 115,
    120, 150, 180, 210, 240, 270, 300,
)  # fmt: skip

KUBE_PROXY_METRICS = (
    Definition(
        "kubeproxy_sync_proxy_rules_duration_seconds", "histogram", ("ip_family",), SYNC_BUCKETS
    ),
    Definition(
        "kubeproxy_sync_full_proxy_rules_duration_seconds",
        "histogram",
        ("ip_family",),
        SYNC_BUCKETS,
    ),
    Definition(
        "kubeproxy_sync_partial_proxy_rules_duration_seconds",
        "histogram",
        ("ip_family",),
        SYNC_BUCKETS,
    ),
    Definition("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "gauge", ("ip_family",)),
    Definition("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", "gauge", ("ip_family",)),
    Definition(
        "kubeproxy_network_programming_duration_seconds",
        "histogram",
        ("ip_family",),
        PROGRAMMING_BUCKETS,
    ),
    Definition("kubeproxy_sync_proxy_rules_endpoint_changes_pending", "gauge", ()),
    Definition("kubeproxy_sync_proxy_rules_endpoint_changes_total", "counter", ()),
    Definition("kubeproxy_sync_proxy_rules_service_changes_pending", "gauge", ()),
    Definition("kubeproxy_sync_proxy_rules_service_changes_total", "counter", ()),
    Definition("kubeproxy_proxy_healthz_total", "counter", ("code",)),
    Definition("kubeproxy_proxy_livez_total", "counter", ("code",)),
    Definition(
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
        "gauge",
        ("ip_family", "traffic_policy"),
    ),
)
