"""lab.bench.agent against a small HTTP server serving what PLAN.md's "Shared
interfaces" specify: /readyz (503, then 200), /status JSON, /metrics text. No agent, no
kernel: this pins the bench's side of the interface."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from lab.bench.agent import AgentError, AgentStatus, Endpoints, startup
from lab.bench.records.agent import Listing

STATUS: dict[str, Any] = {
    "ready": True,
    "process_start": 1764500000.25,
    "phases": {
        "socket_lb_compiled": 1.075,
        "nodeport_compiled": 1.615,
        "attached": 1.616,
        "services_listed": 0.454,
        "slices_listed": 0.468,
        "first_sync": 1.52,
    },
    "compile_seconds": {"socket_lb": 0.43, "nodeport": 0.54},
    "lists": {
        "Service": {"objects": 1000, "seconds": 0.036},
        "EndpointSlice": {"objects": 1000, "seconds": 0.048},
    },
    "sync": {
        "count": 1,
        "last": {
            "kind": "first",
            "finished": 1764500001.77,
            "duration_s": 0.052,
            "added": 1003,
            "updated": 0,
            "removed": 0,
            "unchanged": 0,
            "failed": 0,
            "errors": [],
        },
    },
    "frontends": 1003,
    "programs": {"replaced_previous": 0},
    "interfaces": {"eth0": {"xdp": "native"}, "eth1": {"xdp": "off"}},
    "a_key_added_later": {"ignored": True},
}
METRICS = """\
# HELP ebpflb_drift_repaired_total Map entries found different ...
# TYPE ebpflb_drift_repaired_total counter
ebpflb_drift_repaired_total{map="ebpflb_svc4"} 2.0
ebpflb_drift_repaired_total{map="ebpflb_backends"} 5.0
# HELP ebpflb_startup_phase_seconds Seconds after process start.
# TYPE ebpflb_startup_phase_seconds gauge
ebpflb_startup_phase_seconds{phase="first_sync"} 1.52
"""


@dataclass
class Agent:
    """What the fake serves; tests change it while it runs."""

    not_ready_answers: int = 0  # /readyz says 503 this many times first
    status: dict[str, Any] = field(default_factory=lambda: json.loads(json.dumps(STATUS)))
    status_body: bytes | None = None  # overrides status
    readyz_code: int | None = None
    requests: list[str] = field(default_factory=list)


@pytest.fixture
def served() -> Iterator[tuple[Agent, Endpoints]]:
    agent = Agent()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            agent.requests.append(self.path)
            code, body, kind = 404, b"not found", "text/plain"
            if self.path == "/readyz":
                if agent.readyz_code is not None:
                    code = agent.readyz_code
                elif agent.not_ready_answers > 0:
                    agent.not_ready_answers -= 1
                    code = 503
                else:
                    code = 200
                body = b"ok" if code == 200 else b"not ready"
            elif self.path == "/status":
                code, kind = 200, "application/json"
                body = agent.status_body or json.dumps(agent.status).encode()
            elif self.path == "/metrics":
                code, body = 200, METRICS.encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    address = f"127.0.0.1:{server.server_address[1]}"
    try:
        yield agent, Endpoints(health=address, metrics=address, timeout=2)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_wait_ready_polls_readyz_until_200(served: tuple[Agent, Endpoints]) -> None:
    agent, endpoints = served
    agent.not_ready_answers = 3
    endpoints.wait_ready(alive=lambda: True, timeout=5, poll=0.01)
    assert agent.requests == ["/readyz"] * 4


def test_wait_ready_gives_up_when_the_agent_exits(served: tuple[Agent, Endpoints]) -> None:
    agent, endpoints = served
    agent.not_ready_answers = 1000
    with pytest.raises(AgentError, match="exited before it was ready"):
        endpoints.wait_ready(alive=lambda: False, timeout=5, poll=0.01)
    with pytest.raises(AgentError, match=r"not ready after 0\.05 s"):
        endpoints.wait_ready(alive=lambda: True, timeout=0.05, poll=0.01)


def test_nothing_listening_is_not_ready_yet() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        endpoints = Endpoints(health=f"127.0.0.1:{port}", metrics=f"127.0.0.1:{port}")
        assert endpoints.ready() is False
        with pytest.raises(AgentError, match=r"/status on 127\.0\.0\.1"):
            endpoints.status()


def test_an_unexpected_readyz_code_is_an_error(served: tuple[Agent, Endpoints]) -> None:
    agent, endpoints = served
    agent.readyz_code = 500
    with pytest.raises(AgentError, match="/readyz answered 500"):
        endpoints.ready()


def test_status_reads_the_spec_fields(served: tuple[Agent, Endpoints]) -> None:
    _, endpoints = served
    status = endpoints.status()
    assert status.ready and status.process_start == 1764500000.25
    assert status.phases["first_sync"] == 1.52
    assert status.compile_seconds == {"socket_lb": 0.43, "nodeport": 0.54}
    assert status.lists["EndpointSlice"] == Listing(1000, 0.048)
    assert status.last_sync is not None and status.last_sync.kind == "first"
    assert (status.sync_count, status.frontends) == (1, 1003)
    assert status.xdp == {"eth0": "native", "eth1": "off"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"<html>", "not JSON"),
        (b'{"ready": true}', "KeyError: 'process_start'"),
        (b'{"ready": true, "process_start": "soon"}', "ValueError"),
        (b'{"ready": true, "process_start": 1, "lists": {"Service": {}}}', "objects"),
    ],
)
def test_malformed_status_is_named(
    served: tuple[Agent, Endpoints], body: bytes, message: str
) -> None:
    agent, endpoints = served
    agent.status_body = body
    with pytest.raises(AgentError, match=message):
        endpoints.status()


def test_metric_samples_by_name_and_labels(served: tuple[Agent, Endpoints]) -> None:
    _, endpoints = served
    assert endpoints.metric("ebpflb_drift_repaired_total", {"map": "ebpflb_svc4"}) == 2.0
    assert endpoints.metric("ebpflb_drift_repaired_total", {"map": "ebpflb_nat"}) is None
    assert endpoints.metric("ebpflb_startup_phase_seconds", {"phase": "first_sync"}) == 1.52


def test_startup_figures_count_from_the_spawn() -> None:
    status = AgentStatus.parse(STATUS)
    figures = startup(status, spawned_at=1764500000.0, cpu_s_at_synced=1.73)
    # The agent's process started 0.25 s after the bench spawned it (the interpreter).
    assert figures.start_to_synced_s == pytest.approx(1.77)
    assert figures.phases["attached"] == pytest.approx(1.866)
    assert figures.phases["services_listed"] == pytest.approx(0.704)
    assert figures.first_sync_s == 0.052
    assert (figures.frontends, figures.sync_errors, figures.cpu_s_at_synced) == (1003, 0, 1.73)
    assert figures.compile_s["nodeport"] == 0.54
    assert figures.lists["Service"] == Listing(1000, 0.036)


def test_startup_needs_the_first_sync_and_counts_its_failures() -> None:
    data = json.loads(json.dumps(STATUS))
    data["sync"]["last"]["failed"] = 2
    assert startup(AgentStatus.parse(data), 1764500000.0, 1.0).sync_errors == 2
    del data["phases"]["first_sync"]
    with pytest.raises(AgentError, match="no first_sync phase"):
        startup(AgentStatus.parse(data), 1764500000.0, 1.0)


def test_the_periodic_resync_is_the_first_full_sync_after_the_first(
    served: tuple[Agent, Endpoints],
) -> None:
    agent, endpoints = served
    assert endpoints.wait_for_full_resync(timeout=0.1, poll=0.02) is None
    agent.status["sync"] = {"count": 2, "last": {"kind": "full", "duration_s": 0.15}}
    result = endpoints.wait_for_full_resync(timeout=1, poll=0.02)
    assert result is not None and (result.kind, result.duration_s) == ("full", 0.15)
