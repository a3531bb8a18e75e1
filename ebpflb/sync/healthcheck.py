"""healthCheckNodePort servers, as kube-proxy runs them for externalTrafficPolicy=Local.

A cloud load balancer probes http://<node>:<healthCheckNodePort>/ and sends a service's
traffic only to nodes answering 200, i.e. nodes with a local endpoint; a node without one
answers 503 and is skipped (the datapath would not forward anyway). The response body and
headers follow kube-proxy's (pkg/proxy/healthcheck).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ebpflb.model import NamespacedName

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HealthTarget:
    service: NamespacedName
    local_endpoints: int


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    target: HealthTarget


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        target = self.server.target
        body = json.dumps(
            {
                "service": {"namespace": target.service.namespace, "name": target.service.name},
                "localEndpoints": target.local_endpoints,
                "serviceProxyHealthy": True,
            }
        ).encode()
        self.send_response(200 if target.local_endpoints > 0 else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Load-Balancing-Endpoint-Weight", str(target.local_endpoints))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # probes every few seconds: not worth a log line each


class HealthCheckServers:
    """One HTTP server per healthCheckNodePort, kept in step with the desired state."""

    def __init__(self, bind_address: str = "0.0.0.0") -> None:
        self.bind_address = bind_address
        self._servers: dict[int, _Server] = {}
        self.failed: dict[int, str] = {}  # port -> why it could not be served

    def sync(self, targets: Mapping[int, HealthTarget]) -> None:
        for port in sorted(set(self._servers) - set(targets)):
            server = self._servers.pop(port)
            server.shutdown()
            server.server_close()
            log.info("health check port %d for %s closed", port, server.target.service)
        for port, target in sorted(targets.items()):
            running = self._servers.get(port)
            if running is not None:
                running.target = target
                continue
            try:
                server = _Server((self.bind_address, port), _Handler)
            except OSError as exc:
                if self.failed.get(port) != exc.strerror:
                    log.error(
                        "cannot serve health check port %d for %s: %s",
                        port,
                        target.service,
                        exc.strerror,
                    )
                self.failed[port] = str(exc.strerror)
                continue
            self.failed.pop(port, None)
            server.target = target
            threading.Thread(
                target=server.serve_forever, name=f"healthz-{port}", daemon=True
            ).start()
            self._servers[port] = server
            log.info("serving health check port %d for %s", port, target.service)

    def close(self) -> None:
        self.sync({})
