from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

from ebpflb.model import NamespacedName
from ebpflb.sync.healthcheck import HealthCheckServers, HealthTarget

WEB = NamespacedName("default", "web")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int) -> tuple[int, dict[str, object], str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status, json.loads(r.read()), r.headers["X-Load-Balancing-Endpoint-Weight"]
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers["X-Load-Balancing-Endpoint-Weight"]


def test_answers_like_kube_proxy_and_follows_the_endpoints() -> None:
    servers = HealthCheckServers("127.0.0.1")
    port = free_port()
    try:
        servers.sync({port: HealthTarget(WEB, 2)})
        status, body, weight = get(port)
        assert (status, weight) == (200, "2")
        assert body == {
            "service": {"namespace": "default", "name": "web"},
            "localEndpoints": 2,
            "serviceProxyHealthy": True,
        }
        servers.sync({port: HealthTarget(WEB, 0)})
        assert get(port)[:1] == (503,)
        servers.sync({})
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0  # closed with the service
    finally:
        servers.close()


def test_a_port_in_use_is_reported_not_fatal() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        servers = HealthCheckServers("127.0.0.1")
        try:
            servers.sync({port: HealthTarget(WEB, 1)})
            assert port in servers.failed
        finally:
            servers.close()
