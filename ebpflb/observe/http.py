"""The agent's two HTTP servers (the standard library's ThreadingHTTPServer, one thread per
request, so a slow scrape never delays a health probe):

- health, on --healthz-bind-address (kube-proxy's 0.0.0.0:10256): /healthz and /livez with
  kube-proxy's JSON (ebpflb.observe.health), and /readyz;
- metrics, on --metrics-bind-address (kube-proxy's 127.0.0.1:10249): /metrics, the
  Prometheus exposition of the injected registry, /status, the JSON of AgentStatus, and
  kube-proxy's /proxyMode (the upstream e2e "should check kube-proxy urls" reads it).

Both are bound before anything else starts, so an address already in use fails the start
with one line naming the flag (kube-proxy's --bind-address-hard-fail behaviour; kube-proxy
otherwise logs and retries every 5 s, leaving a node that load balancers cannot probe).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from ebpflb.config import parse_bind_address
from ebpflb.errors import ConfigError
from ebpflb.observe.health import (
    HealthSnapshot,
    ProxyHealth,
    healthz_response,
    livez_response,
    readyz_response,
)
from ebpflb.observe.status import AgentStatus

log = logging.getLogger(__name__)

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
# What /proxyMode answers where kube-proxy names its mode (iptables, ipvs, nftables): a tool
# reading it to learn how Services are implemented must not take ebpflb for one of those.
PROXY_MODE = b"ebpflb"


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


# A route answers a GET from the request's headers (names lower-cased).
Route = Callable[[Mapping[str, str]], Response]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    routes: Mapping[str, Route]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def _answer(self, *, with_body: bool) -> None:
        route = self.server.routes.get(self.path.split("?", 1)[0])
        if route is None:
            response = Response(404, TEXT, b"404 page not found\n")
        else:
            try:
                response = route({k.lower(): v for k, v in self.headers.items()})
            except Exception:  # one bad answer must not take the server down
                log.exception("answering %s failed", self.path)
                response = Response(500, TEXT, b"internal error\n")
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        if with_body:
            self.wfile.write(response.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # probes and scrapes every few seconds: not worth a log line each


class HttpServer:
    """Serves `routes` on `address` (HOST:PORT) from a daemon thread until close()."""

    def __init__(
        self,
        address: str,
        routes: Mapping[str, Route],
        *,
        flag: str,
        poll_interval: float = 0.5,
    ) -> None:
        """`poll_interval`: how often the serving thread checks for close()."""
        host, port = parse_bind_address(address, flag)
        server_class = type(
            "_BoundServer",
            (_Server,),
            {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET},
        )
        try:
            self._server: _Server = server_class((host, port), _Handler)
        except OSError as exc:
            raise ConfigError(f"{flag} {address}: {exc.strerror or exc}") from exc
        self._server.routes = routes
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(poll_interval,),
            name=f"http-{flag}",
            daemon=True,
        )
        self._thread.start()

    @property
    def port(self) -> int:
        """The bound port (the one the system chose for port 0)."""
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _kube_proxy_json(answer: tuple[int, bytes]) -> Response:
    status, body = answer
    return Response(status, JSON, body, {"X-Content-Type-Options": "nosniff"})


def health_routes(
    health: ProxyHealth, answered: Callable[[str, int], object] | None = None
) -> dict[str, Route]:
    """`answered(path, status)` is told of every /healthz and /livez answer (kube-proxy
    counts them: kubeproxy_proxy_healthz_total, kubeproxy_proxy_livez_total)."""

    def readyz(_headers: Mapping[str, str]) -> Response:
        status, body = readyz_response(health.snapshot())
        return Response(status, TEXT, body)

    def counted(path: str, respond: Callable[[HealthSnapshot], tuple[int, bytes]]) -> Route:
        def route(_headers: Mapping[str, str]) -> Response:
            response = _kube_proxy_json(respond(health.snapshot()))
            if answered is not None:
                answered(path, response.status)
            return response

        return route

    return {
        "/healthz": counted("/healthz", healthz_response),
        "/livez": counted("/livez", livez_response),
        "/readyz": readyz,
    }


def metrics_routes(registry: CollectorRegistry, status: AgentStatus) -> dict[str, Route]:
    def metrics(headers: Mapping[str, str]) -> Response:
        encoder, content_type = choose_encoder(headers.get("accept") or "")
        return Response(200, content_type, encoder(registry))

    def status_json(_headers: Mapping[str, str]) -> Response:
        return Response(200, JSON, json.dumps(status.to_json(), indent=2).encode() + b"\n")

    def proxy_mode(_headers: Mapping[str, str]) -> Response:
        return Response(200, TEXT, PROXY_MODE, {"X-Content-Type-Options": "nosniff"})

    return {"/metrics": metrics, "/status": status_json, "/proxyMode": proxy_mode}
