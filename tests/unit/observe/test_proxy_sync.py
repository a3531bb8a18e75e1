"""kube-proxy's metrics fed by the agent's sync path, on fake maps and a fake clock:
network programming latency from the slices' trigger-time annotation to the map write,
change counters, sync durations and timestamps, services without local endpoints."""

from __future__ import annotations

from datetime import UTC, datetime
from ipaddress import IPv4Address
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ebpflb.clock import FakeClock
from ebpflb.config import Config
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.k8s.sources.base import Kind
from ebpflb.k8s.translate import TRIGGER_TIME_ANNOTATION, parse_trigger_time, translate_slice
from ebpflb.model import Frontend, Proto
from ebpflb.observe.metrics import Metrics
from ebpflb.sync.agent import Agent
from tests.factories import endpoint, endpoint_slice, service

IPV4 = {"ip_family": "IPv4"}
PROGRAMMING = "kubeproxy_network_programming_duration_seconds"
FRONTEND = Frontend(IPv4Address("10.96.0.10"), 80, Proto.TCP)
TWO = ("10.244.1.11", "10.244.1.12")


def rfc3339(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z")


def annotated(trigger: float | None, ips: tuple[str, ...] = ("10.244.1.11",)) -> dict[str, Any]:
    obj = endpoint_slice(endpoints=[endpoint(ip) for ip in ips])
    if trigger is not None:
        obj["metadata"]["annotations"] = {TRIGGER_TIME_ANNOTATION: rfc3339(trigger)}
    return obj


class Harness:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.maps = FakeMapSet()
        self.registry = CollectorRegistry()
        self.agent = Agent(
            Config(min_sync_period=1.0, max_sync_period=600.0, node_name="node-a"),
            self.maps,
            Metrics(self.registry),
            clock=self.clock,
        )

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        found = self.registry.get_sample_value(name, labels if labels is not None else IPV4)
        return 0.0 if found is None else found

    def start(self) -> None:
        self.agent.object_updated(Kind.SERVICE, service())
        self.agent.object_updated(Kind.ENDPOINT_SLICE, annotated(None))
        self.agent.initial_list_done(Kind.SERVICE)
        self.agent.initial_list_done(Kind.ENDPOINT_SLICE)
        assert self.agent.runner.run_once() is not None

    def sync(self) -> None:
        self.clock.advance(1.0)  # past --min-sync-period
        assert self.agent.runner.run_once() is not None


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_trigger_time_parses_rfc3339_and_ignores_anything_else() -> None:
    assert parse_trigger_time("2026-11-30T17:52:48Z") == 1796061168.0
    assert parse_trigger_time("2026-11-30T17:52:48.123456789Z") == pytest.approx(1796061168.123456)
    assert parse_trigger_time("2026-11-30T18:52:48.5+01:00") == 1796061168.5
    for bad in ("", "yesterday", "2026-11-30", "2026-11-30 17:52:48Z", "2026-11-30T17:52:48"):
        assert parse_trigger_time(bad) is None


def test_the_trigger_time_travels_as_a_typed_value_outside_the_slice_meaning() -> None:
    with_time = translate_slice(annotated(1796061168.0))
    assert with_time.trigger_time == 1796061168.0
    # A slice differing only in its annotation means the same: nothing to program.
    assert with_time == translate_slice(annotated(None))
    broken = annotated(None)
    broken["metadata"]["annotations"] = {TRIGGER_TIME_ANNOTATION: "not a time"}
    assert translate_slice(broken).trigger_time is None  # ignored, the slice stays


def test_latency_runs_from_the_trigger_time_to_the_map_write(h: Harness) -> None:
    h.start()
    assert h.value(f"{PROGRAMMING}_count") == 0
    h.clock.advance(10)
    h.agent.object_updated(
        Kind.ENDPOINT_SLICE, annotated(h.clock.wall() - 3.5, ("10.244.1.11", "10.244.1.12"))
    )
    h.sync()  # written 1 s later (the min sync period)
    assert h.value(f"{PROGRAMMING}_count") == 1
    assert h.value(f"{PROGRAMMING}_sum") == pytest.approx(4.5)
    assert h.value(f"{PROGRAMMING}_bucket", {**IPV4, "le": "5.0"}) == 1
    assert h.value(f"{PROGRAMMING}_bucket", {**IPV4, "le": "4.0"}) == 0


def test_each_change_is_observed_once_and_only_a_change(h: Harness) -> None:
    h.start()
    h.clock.advance(5)
    trigger = h.clock.wall()
    h.agent.object_updated(Kind.ENDPOINT_SLICE, annotated(trigger, ("10.244.1.12",)))
    h.agent.object_updated(Kind.ENDPOINT_SLICE, annotated(trigger, ("10.244.1.12",)))  # again
    h.agent.object_updated(Kind.ENDPOINT_SLICE, annotated(trigger + 0.5, ("10.244.1.13",)))
    h.sync()
    assert h.value(f"{PROGRAMMING}_count") == 2  # two updates changed the slice
    assert h.value(f"{PROGRAMMING}_sum") == pytest.approx(1.0 + 0.5)
    h.clock.advance(600)
    assert h.agent.runner.run_once() is not None  # a full resync observes nothing new
    assert h.value(f"{PROGRAMMING}_count") == 2


def test_a_change_undone_before_the_sync_programs_nothing(h: Harness) -> None:
    h.start()
    h.clock.advance(5)
    h.agent.object_updated(Kind.ENDPOINT_SLICE, annotated(h.clock.wall(), ("10.244.1.12",)))
    h.agent.object_updated(Kind.ENDPOINT_SLICE, annotated(h.clock.wall(), ("10.244.1.11",)))
    h.sync()
    h.clock.advance(600)
    assert h.agent.runner.run_once() is not None  # a full resync
    assert h.value(f"{PROGRAMMING}_count") == 0


def test_trigger_times_from_before_the_agent_started_are_not_observed(h: Harness) -> None:
    h.agent.object_updated(Kind.SERVICE, service())
    h.agent.object_updated(Kind.ENDPOINT_SLICE, annotated(h.clock.wall() - 3600))
    h.agent.initial_list_done(Kind.SERVICE)
    h.agent.initial_list_done(Kind.ENDPOINT_SLICE)
    h.agent.runner.run_once()
    assert h.value(f"{PROGRAMMING}_count") == 0


def test_a_change_made_while_listing_is_observed_after_the_first_sync(h: Harness) -> None:
    h.agent.object_updated(Kind.SERVICE, service())
    h.clock.advance(2)
    h.agent.object_updated(Kind.ENDPOINT_SLICE, annotated(h.clock.wall() - 1))
    h.clock.advance(2)
    h.agent.initial_list_done(Kind.SERVICE)
    h.agent.initial_list_done(Kind.ENDPOINT_SLICE)
    h.agent.runner.run_once()
    assert h.value(f"{PROGRAMMING}_count") == 1
    assert h.value(f"{PROGRAMMING}_sum") == pytest.approx(3.0)


def test_a_failed_write_is_observed_when_the_retry_programs_it(h: Harness) -> None:
    h.start()
    h.clock.advance(5)
    trigger = h.clock.wall()
    h.maps.services.failing.add(FRONTEND)  # the entry changes: 2 backends
    h.agent.object_updated(Kind.ENDPOINT_SLICE, annotated(trigger, TWO))
    h.sync()
    assert h.value(f"{PROGRAMMING}_count") == 0  # not programmed: nothing to observe yet
    h.maps.services.failing.clear()
    h.clock.advance(10)  # the retry period
    assert h.agent.runner.run_once() is not None
    assert h.value(f"{PROGRAMMING}_count") == 1
    assert h.value(f"{PROGRAMMING}_sum") == pytest.approx(11.0)


def test_change_counters_and_pending_gauges(h: Harness) -> None:
    h.start()
    assert h.value("kubeproxy_sync_proxy_rules_service_changes_total", {}) == 1
    assert h.value("kubeproxy_sync_proxy_rules_endpoint_changes_total", {}) == 1
    h.agent.object_updated(Kind.SERVICE, service(ports=[{"name": "http", "port": 81}]))
    h.agent.object_updated(Kind.ENDPOINT_SLICE, annotated(None, ("10.244.1.12",)))
    h.agent.object_updated(Kind.ENDPOINT_SLICE, annotated(None, ("10.244.1.12",)))  # no change
    assert h.value("kubeproxy_sync_proxy_rules_service_changes_total", {}) == 2
    assert h.value("kubeproxy_sync_proxy_rules_endpoint_changes_total", {}) == 3
    assert h.value("kubeproxy_sync_proxy_rules_service_changes_pending", {}) == 1
    assert h.value("kubeproxy_sync_proxy_rules_endpoint_changes_pending", {}) == 1
    queued = h.clock.wall()
    assert h.value("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds") == queued
    h.sync()
    assert h.value("kubeproxy_sync_proxy_rules_service_changes_pending", {}) == 0
    assert h.value("kubeproxy_sync_proxy_rules_endpoint_changes_pending", {}) == 0
    assert h.value("kubeproxy_sync_proxy_rules_last_timestamp_seconds") == h.clock.wall()
    h.agent.object_deleted(Kind.ENDPOINT_SLICE, translate_slice(annotated(None)).ref)
    assert h.value("kubeproxy_sync_proxy_rules_endpoint_changes_total", {}) == 4


def test_full_and_partial_syncs_are_told_apart(h: Harness) -> None:
    h.start()
    count = "kubeproxy_sync_{}proxy_rules_duration_seconds_count"
    assert (h.value(count.format("")), h.value(count.format("full_"))) == (1, 1)
    h.agent.object_updated(Kind.ENDPOINT_SLICE, annotated(None, ("10.244.1.12",)))
    h.sync()
    assert h.value(count.format("partial_")) == 1
    assert h.value(count.format("")) == 2
    h.clock.advance(600)  # --sync-period: a full resync
    h.agent.runner.run_once()
    assert h.value(count.format("full_")) == 2


def test_a_failed_sync_leaves_the_last_timestamp(h: Harness) -> None:
    h.start()
    synced = h.value("kubeproxy_sync_proxy_rules_last_timestamp_seconds")
    h.maps.services.failing.add(FRONTEND)
    h.agent.object_updated(Kind.ENDPOINT_SLICE, annotated(None, TWO))
    h.sync()
    assert h.value("kubeproxy_sync_proxy_rules_last_timestamp_seconds") == synced


def test_services_with_a_local_policy_and_no_local_endpoint_are_counted(h: Harness) -> None:
    h.agent.object_updated(
        Kind.SERVICE,
        service(
            type="NodePort",
            externalTrafficPolicy="Local",
            ports=[{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}],
        ),
    )
    h.agent.object_updated(
        Kind.SERVICE, service("dns", cluster_ip="10.96.0.53", internalTrafficPolicy="Local")
    )
    h.agent.object_updated(Kind.SERVICE, service("empty", cluster_ip="10.96.0.99"))
    elsewhere = [endpoint("10.244.2.1", node="node-b")]
    h.agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice(endpoints=elsewhere))
    h.agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice("dns-1", "dns", endpoints=elsewhere))
    h.agent.initial_list_done(Kind.SERVICE)
    h.agent.initial_list_done(Kind.ENDPOINT_SLICE)
    h.agent.runner.run_once()
    gauge = "kubeproxy_sync_proxy_rules_no_local_endpoints_total"
    assert h.value(gauge, {**IPV4, "traffic_policy": "external"}) == 1
    assert h.value(gauge, {**IPV4, "traffic_policy": "internal"}) == 1
    # A local endpoint arrives for web: no longer counted.
    here = [endpoint("10.244.1.1", node="node-a")]
    h.agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice(endpoints=here))
    h.sync()
    assert h.value(gauge, {**IPV4, "traffic_policy": "external"}) == 0
    assert h.value(gauge, {**IPV4, "traffic_policy": "internal"}) == 1


def test_ipv6_slices_are_not_ipv4_endpoint_changes(h: Harness) -> None:
    h.start()
    v6 = endpoint_slice("web-v6", address_type="IPv6", endpoints=[endpoint("fd00::1")])
    h.agent.object_updated(Kind.ENDPOINT_SLICE, v6)
    assert h.value("kubeproxy_sync_proxy_rules_endpoint_changes_total", {}) == 1  # the start's
