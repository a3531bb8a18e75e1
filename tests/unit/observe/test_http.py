"""The health and metrics servers over real HTTP on 127.0.0.1 (ebpflb/observe/http.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from ebpflb.clock import FakeClock
from ebpflb.config import Config, parse_bind_address
from ebpflb.errors import ConfigError
from ebpflb.observe.health import ProxyHealth
from ebpflb.observe.http import HttpServer, health_routes, metrics_routes
from ebpflb.observe.metrics import Metrics, StatusCollector
from ebpflb.observe.status import AgentStatus, Phase
from lab.harness.nshttp import http_get


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def status(clock: FakeClock) -> AgentStatus:
    return AgentStatus(ProxyHealth(60.0, clock), clock, FakeClock.EPOCH)


@pytest.fixture
def health_server(status: AgentStatus) -> Iterator[HttpServer]:
    server = HttpServer(
        "127.0.0.1:0", health_routes(status.health), flag="healthz-bind-address", poll_interval=0.05
    )
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def registry(status: AgentStatus) -> CollectorRegistry:
    registry = CollectorRegistry()
    Metrics(registry)
    registry.register(StatusCollector(status.phases, status.frontend_changes))
    return registry


@pytest.fixture
def metrics_server(registry: CollectorRegistry, status: AgentStatus) -> Iterator[HttpServer]:
    server = HttpServer(
        "127.0.0.1:0",
        metrics_routes(registry, status),
        flag="metrics-bind-address",
        poll_interval=0.05,
    )
    try:
        yield server
    finally:
        server.close()


def get(server: HttpServer, path: str) -> tuple[int, dict[str, str], bytes]:
    return http_get("127.0.0.1", server.port, path)


def test_healthz_livez_readyz_follow_the_syncs(
    health_server: HttpServer, status: AgentStatus, clock: FakeClock
) -> None:
    code, headers, body = get(health_server, "/healthz")
    assert code == 503
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert json.loads(body)["healthy"] is False
    assert get(health_server, "/livez")[0] == 200
    assert get(health_server, "/readyz")[:1] == (503,)

    status.sync_started()
    status.health.sync_finished(ok=True)
    assert get(health_server, "/healthz")[0] == 200
    assert get(health_server, "/readyz")[0] == 200

    status.change_queued()
    clock.advance(60)
    code, _, body = get(health_server, "/healthz")
    assert code == 503 and json.loads(body)["status"]["IPv4"]["healthy"] is False
    assert get(health_server, "/livez")[0] == 503
    assert get(health_server, "/readyz")[0] == 200  # still ready: it synced once


def test_proxy_mode_answers_as_kube_proxys_status_port(metrics_server: HttpServer) -> None:
    """kube-proxy's 10249 /proxyMode: 200 and the mode, which upstream's e2e "should check
    kube-proxy urls" requires of the metrics port."""
    code, headers, body = get(metrics_server, "/proxyMode")
    assert (code, body) == (200, b"ebpflb")
    assert headers["Content-Type"].startswith("text/plain")
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_unknown_paths_are_404(health_server: HttpServer, metrics_server: HttpServer) -> None:
    assert get(health_server, "/metrics")[0] == 404
    assert get(metrics_server, "/healthz")[0] == 404
    assert get(health_server, "/healthz?verbose=1")[0] == 503  # the query is ignored


def test_metrics_are_prometheus_text_from_the_registry(
    metrics_server: HttpServer, status: AgentStatus, clock: FakeClock
) -> None:
    clock.advance(3)
    status.phase_done(Phase.ATTACHED)
    code, headers, body = get(metrics_server, "/metrics")
    assert code == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert families["ebpflb_startup_phase_seconds"].type == "gauge"
    assert [(s.labels, s.value) for s in families["ebpflb_startup_phase_seconds"].samples] == [
        ({"phase": "attached"}, 1003.0)
    ]
    assert families["ebpflb_frontend_changes"].type == "counter"
    assert "ebpflb_sync_duration_seconds" in families


def test_metrics_speak_openmetrics_when_asked(metrics_server: HttpServer) -> None:
    from lab.harness.nshttp import _Connection

    connection = _Connection("127.0.0.1", metrics_server.port, None, 5.0)
    try:
        connection.request("GET", "/metrics", headers={"Accept": "application/openmetrics-text"})
        response = connection.getresponse()
        assert response.getheader("Content-Type", "").startswith("application/openmetrics-text")
        assert response.read().endswith(b"# EOF\n")
    finally:
        connection.close()


def test_status_is_the_json_record(metrics_server: HttpServer, status: AgentStatus) -> None:
    status.compiled("socket_lb", 0.4, Phase.SOCKET_LB_COMPILED)
    code, headers, body = get(metrics_server, "/status")
    assert code == 200 and headers["Content-Type"] == "application/json"
    document = json.loads(body)
    assert document == json.loads(json.dumps(status.to_json()))
    assert document["compile_seconds"] == {"socket_lb": 0.4}


def test_a_taken_port_fails_with_the_flag_named(health_server: HttpServer) -> None:
    with pytest.raises(ConfigError, match=r"^healthz-bind-address 127\.0\.0\.1:\d+: .*in use"):
        HttpServer(
            f"127.0.0.1:{health_server.port}", {}, flag="healthz-bind-address", poll_interval=0.05
        )


def test_bind_addresses_are_parsed_and_checked() -> None:
    assert parse_bind_address("0.0.0.0:10256", "f") == ("0.0.0.0", 10256)
    assert parse_bind_address(":10256", "f") == ("0.0.0.0", 10256)
    assert parse_bind_address("[::1]:10249", "f") == ("::1", 10249)
    for bad in ("10256", "host:port", "::1:10249", "1.2.3.4:70000"):
        with pytest.raises(ConfigError, match="healthz-bind-address"):
            Config(healthz_bind_address=bad)
    assert Config().healthz_bind_address == "0.0.0.0:10256"  # kube-proxy's
    assert Config().health_timeout == 60.0  # 2 x the 30 s sync period, as kube-proxy
    Config(healthz_bind_address="", metrics_bind_address="")  # both disabled


def test_ipv6_loopback_is_served() -> None:
    status = AgentStatus(ProxyHealth(60.0, FakeClock()), FakeClock(), 0.0)
    try:
        server = HttpServer(
            "[::1]:0", health_routes(status.health), flag="healthz-bind-address", poll_interval=0.05
        )
    except ConfigError as exc:  # a machine without IPv6
        pytest.skip(str(exc))
    try:
        import http.client

        connection = http.client.HTTPConnection("::1", server.port, timeout=5)
        connection.request("GET", "/livez")
        assert connection.getresponse().status == 200
        connection.close()
    finally:
        server.close()


def test_health_answers_are_counted_by_status_as_kube_proxy_does(status: AgentStatus) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    server = HttpServer(
        "127.0.0.1:0",
        health_routes(status.health, metrics.kube_proxy.health_answered),
        flag="healthz-bind-address",
        poll_interval=0.05,
    )
    try:
        assert get(server, "/healthz")[0] == 503  # no sync yet
        status.sync_started()
        status.health.sync_finished(ok=True)
        for path in ("/healthz", "/healthz", "/livez", "/readyz"):
            get(server, path)
    finally:
        server.close()

    def count(name: str, code: str) -> float | None:
        return registry.get_sample_value(name, {"code": code})

    assert count("kubeproxy_proxy_healthz_total", "503") == 1
    assert count("kubeproxy_proxy_healthz_total", "200") == 2
    assert count("kubeproxy_proxy_livez_total", "200") == 1
    assert count("kubeproxy_proxy_livez_total", "503") is None  # /readyz is not counted
