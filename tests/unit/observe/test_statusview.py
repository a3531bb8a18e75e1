"""`ebpflb status`: gathering from a real (in-process) agent HTTP server or from the pins,
and the rendering of both cases, from typed documents."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ebpflb.clock import FakeClock
from ebpflb.observe import statusview
from ebpflb.observe.fill import MapFill, MapFillCollector
from ebpflb.observe.health import ProxyHealth
from ebpflb.observe.http import HttpServer, metrics_routes
from ebpflb.observe.metrics import DatapathCollector, Metrics, SourceCollector
from ebpflb.observe.status import AgentStatus, Phase, SyncRecord, SyncRecordKind

NOW = FakeClock.EPOCH + 3600.0


@pytest.fixture
def agent_server() -> Iterator[HttpServer]:
    clock = FakeClock()
    status = AgentStatus(ProxyHealth(60.0, clock), clock, FakeClock.EPOCH)
    status.phase_done(Phase.ATTACHED)
    status.sync_finished(
        SyncRecord(SyncRecordKind.FIRST, FakeClock.EPOCH + 1002.0, 0.0021, 3, True, added=3)
    )
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.kube_proxy.programmed([1.5, 2.5])
    registry.register(DatapathCollector(lambda: {"connect_xlated": 5, "fragment": 0}))
    registry.register(SourceCollector(lambda: {"Service": {"lists": 1, "relists": 2}}))
    registry.register(
        MapFillCollector(lambda: [MapFill("ebpflb_svc4", 3, 65536), MapFill("ebpflb_ct4", 0, 8)])
    )
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


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_agent_urls() -> None:
    assert statusview.agent_url("127.0.0.1:10249", "/status") == "http://127.0.0.1:10249/status"
    assert statusview.agent_url("0.0.0.0:10249", "/x") == "http://127.0.0.1:10249/x"
    assert statusview.agent_url("[::]:10249", "/x") == "http://[::1]:10249/x"
    assert statusview.agent_url(":10249", "/x") == "http://127.0.0.1:10249/x"


def test_an_answering_agent_is_read_over_http(agent_server: HttpServer, tmp_path: Path) -> None:
    address = f"127.0.0.1:{agent_server.port}"
    document = statusview.gather(address, tmp_path)
    assert document["agent"] == {"address": address, "answering": True, "error": None}
    assert document["status"]["frontends"] == 3 and document["status"]["ready"] is True
    assert document["maps_from"] == "agent" and "pins" not in document
    assert document["maps"]["ebpflb_svc4"] == {"entries": 3, "capacity": 65536, "ratio": 0.0}
    assert document["kube_proxy"]["programming_count"] == 2
    assert document["kube_proxy"]["programming_seconds"] == 4.0
    assert document["datapath"] == {"connect_xlated": 5, "fragment": 0}
    assert document["source"] == {"Service": {"lists": 1, "relists": 2}}
    text = statusview.render_text(document)
    assert "datapath    connect_xlated=5\n" in text
    assert "source      Service: lists=1, relists=2\n" in text


def test_an_agent_that_does_not_answer_falls_back_to_the_pins(tmp_path: Path) -> None:
    document = statusview.gather(f"127.0.0.1:{closed_port()}", tmp_path, timeout=0.5)
    assert document["agent"]["answering"] is False
    assert document["agent"]["error"] == "Connection refused"
    assert document["status"] is None and document["maps"] == {}
    assert document["pins"]["dir"] == str(tmp_path)
    assert "no ebpflb maps pinned" in document["pins"]["error"]
    text = statusview.render_text(document)
    assert "NOT answering" in text and "cannot be read" in text


def status_document() -> dict[str, Any]:
    return {
        "agent": {"address": "127.0.0.1:10249", "answering": True, "error": None},
        "status": {
            "ready": True,
            "healthy": True,
            "process_start": NOW - 7300,
            "phases": {"socket_lb_compiled": 0.62, "attached": 0.7, "first_sync": 1.1},
            "compile_seconds": {"socket_lb": 0.41},
            "lists": {"Service": {"objects": 3, "seconds": 0.01}},
            "sync": {
                "count": 12,
                "last": {
                    "kind": "incremental",
                    "finished": NOW - 3,
                    "duration_s": 0.0015,
                    "added": 0,
                    "updated": 1,
                    "removed": 0,
                    "unchanged": 0,
                    "failed": 0,
                    "errors": [],
                    "error_count": 0,
                    "frontends": 3,
                    "ok": True,
                },
                "first": None,
                "oldest_pending_s": None,
                "health_timeout_s": 60.0,
            },
            "frontends": 3,
            "frontend_changes": {"added": 3, "updated": 1, "removed": 0},
            "programs": {
                "replaced_previous": 4,
                "headers": {"socket_lb": "bundled /usr/share/h (6.1.0-57-amd64)"},
            },
            "interfaces": {"eth0": {"xdp": "native"}},
            "problems": {
                "invalid_objects": [],
                "invalid_object_count": 0,
                "source_errors": [],
                "source_error_count": 0,
                "orphan_slices": [],
            },
            "features": {"set_retval": True},
        },
        "kube_proxy": {"programming_count": 4, "programming_seconds": 6.0},
        "maps": {
            "ebpflb_svc4": {"entries": 3, "capacity": 65536, "ratio": 0.0},
            "ebpflb_ct4": {"entries": 8, "capacity": 8, "ratio": 1.0},
        },
        "maps_from": "agent",
    }


EXPECTED_AGENT = """\
agent       answering on 127.0.0.1:10249: ready, healthy; up 2.0 h (since 2024-12-31 22:58:20 UTC)
start-up    socket_lb_compiled 620.0 ms, attached 700.0 ms, first_sync 1.1 s after the process started
lists       Service: 3 in 10.0 ms
sync        12 syncs; last: incremental, 3.0 s ago, took 1.5 ms, +0 ~1 -0 frontends, ok
frontends   3 programmed (since start: +3 ~1 -0)
programming 4 endpoint changes programmed, mean 1.5 s from the slice's trigger time to the map write
interfaces  eth0 (xdp native)
programs    took over 4 from a previous agent
headers     socket_lb compiled with bundled /usr/share/h (6.1.0-57-amd64)
problems    none
features    {"set_retval":true}

MAP              ENTRIES     CAPACITY    FILL  (the agent)
ebpflb_svc4            3       65,536    0.0%
ebpflb_ct4             8            8  100.0%  FULL"""  # noqa: E501


def test_an_answering_agent_renders_as_a_summary_and_a_map_table() -> None:
    assert statusview.render_text(status_document(), now=NOW) == EXPECTED_AGENT


def test_a_pending_change_and_problems_are_shown() -> None:
    document = status_document()
    status = document["status"]
    status["healthy"] = False
    status["sync"]["oldest_pending_s"] = 75.0
    status["sync"]["last"].update(ok=False, failed=1, errors=["default/extra: ebpflb_svc4 is full"])
    status["problems"].update(
        invalid_object_count=1,
        invalid_objects=[{"kind": "Service", "name": "a/b", "error": "spec.ports: is empty"}],
    )
    text = statusview.render_text(document, now=NOW)
    assert "ready, NOT healthy" in text
    assert "FAILED 1 service(s)" in text and "error: default/extra: ebpflb_svc4 is full" in text
    assert "pending     a change has waited 75.0 s (/healthz turns 503 at 60.0 s)" in text
    assert "problems    1 invalid object(s), e.g. Service a/b: spec.ports: is empty" in text


def test_the_socket_lb_scope_and_the_udp_socket_destroy_method_are_shown() -> None:
    document = status_document()
    document["status"]["socket_lb"] = {
        "scope": "hostns-only",
        "netns_cookie": 4097,
        "udp_socket_destroy": "sock_diag SOCK_DESTROY, in the agent's network namespace",
    }
    text = statusview.render_text(document, now=NOW)
    assert "socket-LB   hostns-only (the network namespace with cookie 4097)" in text
    assert "stale UDP   sock_diag SOCK_DESTROY, in the agent's network namespace" in text


EXPECTED_PINS = """\
agent       NOT answering on 127.0.0.1:10249: Connection refused
pins        what the maps pinned under /sys/fs/bpf/ebpflb hold (traffic still uses them):
frontends   3 of 3 services, 1 refusing (no usable endpoint)
backends    6; Maglev slots in use: 1,527
datapath    connect_xlated=40

MAP              ENTRIES     CAPACITY    FILL  (the pins)
ebpflb_svc4            3       65,536    0.0%"""


def test_the_pins_render_when_the_agent_does_not_answer() -> None:
    document = {
        "agent": {"address": "127.0.0.1:10249", "answering": False, "error": "Connection refused"},
        "status": None,
        "kube_proxy": None,
        "maps": {"ebpflb_svc4": {"entries": 3, "capacity": 65536, "ratio": 0.0}},
        "maps_from": "pins",
        "pins": {
            "dir": "/sys/fs/bpf/ebpflb",
            "frontends": 3,
            "services": 3,
            "backends": 6,
            "slots_used": 1527,
            "refusing": 1,
            "counters": {"connect_xlated": 40, "fragment": 0},
        },
    }
    assert statusview.render_text(document) == EXPECTED_PINS


def test_a_grown_map_shows_how_often_it_grew() -> None:
    samples = statusview.metric_samples(
        'ebpflb_map_entries{map="ebpflb_slots"} 7140\n'
        'ebpflb_map_capacity{map="ebpflb_slots"} 7168\n'
        'ebpflb_map_grows_total{map="ebpflb_slots"} 5\n'
        'ebpflb_map_entries{map="ebpflb_svc4"} 14\n'
        'ebpflb_map_capacity{map="ebpflb_svc4"} 65536\n'
    )
    levels = statusview.fill_from_metrics(samples)
    assert levels["ebpflb_slots"]["grows"] == 5 and "grows" not in levels["ebpflb_svc4"]
    document = {**status_document(), "maps": levels, "maps_from": "agent"}
    lines = {
        line.split()[0]: line
        for line in statusview.render_text(document, now=NOW).splitlines()
        if line.startswith("ebpflb_")
    }
    assert lines["ebpflb_slots"].endswith("grew 5x") and "grew" not in lines["ebpflb_svc4"]


def test_the_pin_layout_and_a_refusal_are_shown() -> None:
    document = status_document()
    document["status"] = {
        **document["status"],
        "pin_layout": {
            "layout": 2,
            "found": 3,
            "written_by": "0.3.0",
            "verdict": "newer-refused",
            "refused": "the maps pinned under /sys/fs/bpf/ebpflb have layout 3",
        },
    }
    lines = statusview.render_text(document, now=NOW).splitlines()
    assert "pin layout  2; found 3 (ebpflb 0.3.0): newer-refused" in lines
    assert "            REFUSED: the maps pinned under /sys/fs/bpf/ebpflb have layout 3" in lines


def test_the_pod_path_shows_its_patterns_and_interfaces() -> None:
    document = status_document()
    document["status"]["pod_interfaces"] = {
        "patterns": ["veth*", "cali*"],
        "attached": ["cali1", "veth2"],
        "failed": ["veth9: attaching ebpflb_pod_in to veth9 ingress failed: No such device"],
    }
    lines = statusview.render_text(document, now=NOW).splitlines()
    (line,) = [line for line in lines if line.startswith("pod path")]
    assert line == (
        "pod path    veth*,cali*: 2 interfaces (cali1, veth2); 1 failed: veth9: attaching"
        " ebpflb_pod_in to veth9 ingress failed: No such device"
    )
