"""Per-frontend datapath counters: the reconciler zeroes a service id before a new
frontend takes it, and the collector exposes one series per frontend (or only totals)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from ebpflb.cli import parse_args
from ebpflb.datapath import contract
from ebpflb.datapath.maps import ServiceCounters
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.model import Frontend
from ebpflb.observe.svccounters import METRICS, ServiceCounterCollector
from ebpflb.reconcile import Reconciler
from tests.unit.reconcile.test_reconcile import API, WEB, backends, desired, fe


def test_service_counters_mirror_the_c_struct_field_for_field() -> None:
    names = [f.name for f in dataclasses.fields(ServiceCounters)]
    assert names == [name for name, _ in contract.LbSvcStats._fields_]
    assert {m.field for m in METRICS} == set(names)


def test_a_reused_service_id_starts_from_zero() -> None:
    maps = FakeMapSet(max_services=8)
    rec = Reconciler(maps)
    rec.apply(desired(WEB, fe(), backends(11)))
    web_id = maps.services.data[fe()].svc_id
    assert maps.service_counters.resets == [web_id]
    maps.service_counters.data[web_id] = ServiceCounters(sock_xlated=5, refused=1)
    rec.apply({WEB: {}})  # web goes; its id is free
    rec.apply(desired(API, fe("10.96.0.11"), backends(12)))
    assert maps.services.data[fe("10.96.0.11")].svc_id == web_id  # lowest free: reused
    assert maps.service_counters.get(web_id) == ServiceCounters()
    assert maps.service_counters.resets == [web_id, web_id]


def test_an_unchanged_frontend_keeps_its_counts() -> None:
    maps = FakeMapSet()
    rec = Reconciler(maps)
    rec.apply(desired(WEB, fe(), backends(11)))
    svc_id = maps.services.data[fe()].svc_id
    maps.service_counters.data[svc_id] = ServiceCounters(sock_xlated=5)
    rec.apply(desired(WEB, fe(), backends(11, 12)))  # new backends, same frontend and id
    assert maps.service_counters.get(svc_id) == ServiceCounters(sock_xlated=5)


def test_a_failed_reset_fails_only_that_frontend_and_is_retried() -> None:
    maps = FakeMapSet()
    rec = Reconciler(maps)
    maps.service_counters.failing = {1}
    result = rec.apply(desired(WEB, fe(), backends(11)))
    assert result.failed == {WEB} and "ebpflb_svcstats" in result.errors[0]
    assert fe() not in maps.services.data  # never counted under stale numbers
    maps.service_counters.failing = set()
    result = rec.apply(desired(WEB, fe(), backends(11)))
    assert result.added == 1 and fe() in maps.services.data


def scrape(collector: ServiceCounterCollector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def two_frontends() -> tuple[FakeMapSet, Reconciler]:
    maps = FakeMapSet()
    rec = Reconciler(maps)
    rec.apply(desired(WEB, fe(), backends(11)))
    rec.apply(desired(API, fe("10.96.0.11", 53), backends(12)))
    web = maps.services.data[fe()].svc_id
    maps.service_counters.data[web] = ServiceCounters(3, 1, 2, 20, 2000)
    return maps, rec


def test_one_series_per_frontend_with_its_service_port_and_protocol() -> None:
    maps, rec = two_frontends()
    text = scrape(ServiceCounterCollector(maps.service_counters, lambda: rec.realized))
    web = 'frontend="10.96.0.10:80",port="http",protocol="TCP",service="default/web"'
    api = 'frontend="10.96.0.11:53",port="http",protocol="TCP",service="default/api"'
    assert f"ebpflb_service_socket_translations_total{{{web}}} 3.0" in text
    assert f"ebpflb_service_refused_total{{{web}}} 1.0" in text
    assert f"ebpflb_service_nodeport_flows_total{{{web}}} 2.0" in text
    assert f"ebpflb_service_nodeport_packets_total{{{web}}} 20.0" in text
    assert f"ebpflb_service_nodeport_bytes_total{{{web}}} 2000.0" in text
    assert f"ebpflb_service_socket_translations_total{{{api}}} 0.0" in text  # zero, present
    assert text.count("ebpflb_service_refused_total{") == 2


def test_per_service_metrics_off_keeps_only_totals() -> None:
    maps, rec = two_frontends()
    api = maps.services.data[fe("10.96.0.11", 53)].svc_id
    maps.service_counters.data[api] = ServiceCounters(sock_xlated=4)
    maps.service_counters.data[7] = ServiceCounters(sock_xlated=100)  # no frontend: not counted
    collector = ServiceCounterCollector(
        maps.service_counters, lambda: rec.realized, per_service=False
    )
    text = scrape(collector)
    assert "ebpflb_service_socket_translations_total 7.0" in text
    assert "ebpflb_service_nodeport_bytes_total 2000.0" in text
    assert "frontend=" not in text


def test_a_failing_read_yields_no_service_series_and_does_not_raise() -> None:
    maps, _ = two_frontends()

    def broken() -> dict[Frontend, object]:
        raise RuntimeError("no reconciler yet")

    text = scrape(ServiceCounterCollector(maps.service_counters, broken))  # type: ignore[arg-type]
    assert "ebpflb_service_" not in text


def test_the_flag_turns_per_service_series_off_from_the_command_line_and_the_file(
    tmp_path: Path,
) -> None:
    assert parse_args(["run"]).per_service_metrics is True
    assert parse_args(["run", "--per-service-metrics=false"]).per_service_metrics is False
    config = tmp_path / "c.yaml"
    config.write_text("per-service-metrics: false\n")
    assert parse_args(["run", "--config", str(config)]).per_service_metrics is False
