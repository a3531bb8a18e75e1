"""Our kube-proxy metrics against kube-proxy's definitions (kubeproxy_reference.py beside
this file): names, types, label names and buckets, as /metrics exposes them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ebpflb.observe.metrics import Metrics
from tests.unit.observe.kubeproxy_reference import KUBE_PROXY_METRICS, Definition


def exposed() -> dict[str, tuple[str, list[Sample]]]:
    """Every family /metrics shows, by each of its sample names: (type, samples)."""
    metrics = Metrics(CollectorRegistry())
    # Series labelled by HTTP status exist once a probe was answered.
    metrics.kube_proxy.health_answered("/healthz", 200)
    metrics.kube_proxy.health_answered("/livez", 503)
    text = generate_latest(metrics.registry).decode()
    found: dict[str, tuple[str, list[Sample]]] = {}
    for family in text_string_to_metric_families(text):
        found[family.name] = (family.type, family.samples)
        for sample in family.samples:
            found.setdefault(sample.name, (family.type, family.samples))
    return found


def _samples(samples: list[Sample], name: str) -> Iterator[Sample]:
    return (s for s in samples if s.name == name)


@pytest.mark.parametrize("definition", KUBE_PROXY_METRICS, ids=lambda d: d.name)
def test_each_kube_proxy_metric_is_exposed_as_kube_proxy_defines_it(
    definition: Definition,
) -> None:
    families = exposed()
    assert definition.name in families, f"{definition.name} is not exposed"
    kind, samples = families[definition.name]
    assert kind == definition.type
    if definition.type == "histogram":
        buckets = list(_samples(samples, f"{definition.name}_bucket"))
        assert buckets, "a histogram's series exist from the start"
        labels = {k for s in buckets for k in s.labels if k != "le"}
        bounds = sorted(float(s.labels["le"]) for s in buckets)
        assert bounds[-1] == float("inf")
        assert tuple(bounds[:-1]) == pytest.approx(definition.buckets, rel=0, abs=1e-12)
    else:
        series = list(_samples(samples, definition.name))
        assert series, "the series exist from the start"
        labels = {k for s in series for k in s.labels}
    assert labels == set(definition.labels)


def test_no_local_endpoints_has_both_traffic_policies() -> None:
    _, samples = exposed()["kubeproxy_sync_proxy_rules_no_local_endpoints_total"]
    assert {s.labels["traffic_policy"] for s in samples} == {"internal", "external"}
    assert {s.labels["ip_family"] for s in samples} == {"IPv4"}


def test_the_reference_is_complete_for_what_ebpflb_exposes() -> None:
    """Every kubeproxy_* family ebpflb exposes is in the reference: nothing invented."""
    reference = {d.name for d in KUBE_PROXY_METRICS}
    ours = {
        name
        for name, (kind, _) in exposed().items()
        if name.startswith("kubeproxy_")
        and not name.endswith(("_bucket", "_count", "_sum", "_created"))
        and not (kind == "counter" and not name.endswith("_total"))
    }
    assert ours == reference
