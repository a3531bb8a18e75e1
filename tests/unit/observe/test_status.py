"""The agent's status record (ebpflb/observe/status.py), fed by a real Agent on fake maps."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from ebpflb.clock import FakeClock
from ebpflb.config import Config
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.k8s.sources.base import Kind, ListFigures, SourceProgress
from ebpflb.observe.health import ProxyHealth
from ebpflb.observe.metrics import Metrics, StatusCollector
from ebpflb.observe.status import AgentStatus, Phase
from ebpflb.sync.agent import Agent
from tests.factories import endpoint, endpoint_slice, service

# The keys PLAN.md promises (more may be added).
STATUS_KEYS = {
    "ready",
    "process_start",
    "phases",
    "compile_seconds",
    "lists",
    "sync",
    "frontends",
    "programs",
    "interfaces",
}
SYNC_KEYS = {"kind", "finished", "duration_s", "added", "updated", "removed", "unchanged"}
SYNC_KEYS |= {"failed", "errors"}
PROCESS_START = FakeClock.EPOCH + 990.0  # 10 s before the fake clock's start


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def status(clock: FakeClock) -> AgentStatus:
    return AgentStatus(ProxyHealth(60.0, clock), clock, PROCESS_START)


def make_agent(status: AgentStatus, clock: FakeClock, maps: FakeMapSet | None = None) -> Agent:
    return Agent(
        Config(min_sync_period=1.0, max_sync_period=30.0),
        maps or FakeMapSet(),
        Metrics(CollectorRegistry()),
        clock=clock,
        status=status,
    )


def sync(agent: Agent, clock: FakeClock) -> None:
    clock.advance(2)
    assert agent.runner.run_once() is not None


def test_startup_phases_and_figures(status: AgentStatus, clock: FakeClock) -> None:
    document = status.to_json()
    assert set(document) >= STATUS_KEYS
    assert document["ready"] is False and document["phases"] == {}
    assert document["sync"]["count"] == 0 and document["sync"]["last"] is None

    status.read_source(
        lambda: SourceProgress(
            lists={Kind.SERVICE: ListFigures(10_000, 0.26)}, errors=("a.yaml document 2: bad",)
        )
    )
    clock.advance(1.5)
    status.compiled(
        "socket_lb", 0.41, Phase.SOCKET_LB_COMPILED, "loaded", "bundled /usr/share/h (6.1.0)"
    )
    status.compiled("nodeport", 0.52, Phase.NODEPORT_COMPILED)
    status.programs_replaced(4)
    status.program_ids({"ebpflb_np_in": 41, "ebpflb_connect4": 40})
    status.interfaces_attached({"eth0": "native", "eth1": "off"})
    clock.advance(0.5)
    status.phase_done(Phase.ATTACHED)
    status.phase_done(Phase.ATTACHED)  # the first end counts
    document = status.to_json()
    assert document["process_start"] == PROCESS_START
    assert document["phases"] == {
        "socket_lb_compiled": 11.5,
        "nodeport_compiled": 11.5,
        "attached": 12.0,
    }
    assert document["compile_seconds"] == {"socket_lb": 0.41, "nodeport": 0.52}
    assert document["lists"] == {"Service": {"objects": 10_000, "seconds": 0.26}}
    assert document["programs"] == {
        "replaced_previous": 4,
        "origin": {"socket_lb": "loaded"},
        "headers": {"socket_lb": "bundled /usr/share/h (6.1.0)"},
        "ids": {"ebpflb_connect4": 40, "ebpflb_np_in": 41},
    }
    assert document["interfaces"] == {"eth0": {"xdp": "native"}, "eth1": {"xdp": "off"}}
    assert document["problems"]["source_errors"] == ["a.yaml document 2: bad"]


def test_syncs_are_recorded_from_the_agent(status: AgentStatus, clock: FakeClock) -> None:
    agent = make_agent(status, clock)
    agent.object_updated(Kind.SERVICE, service())
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice())
    clock.advance(1)
    agent.initial_list_done(Kind.SERVICE)
    agent.initial_list_done(Kind.ENDPOINT_SLICE)
    assert status.to_json()["ready"] is False
    sync(agent, clock)
    document = status.to_json()
    assert document["ready"] is True and document["healthy"] is True
    assert document["phases"]["services_listed"] == document["phases"]["slices_listed"] == 11.0
    assert document["phases"]["first_sync"] == 13.0
    first = document["sync"]["last"]
    assert set(first) >= SYNC_KEYS
    assert (first["kind"], first["added"], first["errors"], first["ok"]) == ("first", 1, [], True)
    assert document["frontends"] == 1 and document["sync"]["count"] == 1

    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice(endpoints=[endpoint("10.244.1.11")]))
    assert status.to_json()["sync"]["oldest_pending_s"] == 0.0  # queued for the health check
    sync(agent, clock)
    document = status.to_json()
    last = document["sync"]["last"]
    assert (last["kind"], last["updated"], last["added"]) == ("incremental", 1, 0)
    assert document["sync"]["first"]["kind"] == "first"
    assert document["sync"]["count"] == 2 and document["sync"]["oldest_pending_s"] is None
    assert document["frontend_changes"] == {"added": 1, "updated": 1, "removed": 0}

    agent.object_deleted(Kind.SERVICE, agent.services.refs().pop())
    sync(agent, clock)
    assert status.to_json()["frontends"] == 0
    assert status.frontend_changes() == {"added": 1, "updated": 1, "removed": 1}


def test_a_failed_write_is_reported_and_keeps_the_change_pending(
    status: AgentStatus, clock: FakeClock
) -> None:
    agent = make_agent(status, clock, FakeMapSet(max_services=1))
    agent.object_updated(Kind.SERVICE, service())
    agent.initial_list_done(Kind.SERVICE)
    agent.initial_list_done(Kind.ENDPOINT_SLICE)
    sync(agent, clock)
    agent.object_updated(Kind.SERVICE, service("dns", cluster_ip="10.96.0.53"))
    sync(agent, clock)
    document = status.to_json()
    last = document["sync"]["last"]
    assert (last["failed"], last["ok"], last["error_count"]) == (1, False, 1)
    assert "default/dns" in last["errors"][0] and "ebpflb_svc4 is full" in last["errors"][0]
    assert document["sync"]["oldest_pending_s"] == 2.0  # still waiting: /healthz will say so


def test_rejected_objects_and_orphan_slices_are_listed_until_fixed(
    status: AgentStatus, clock: FakeClock
) -> None:
    agent = make_agent(status, clock)
    agent.object_updated(Kind.SERVICE, service("bad", cluster_ip="10.96.0.300"))
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice("lost-1", service_name="nobody"))
    agent.initial_list_done(Kind.SERVICE)
    agent.initial_list_done(Kind.ENDPOINT_SLICE)
    sync(agent, clock)
    problems = status.to_json()["problems"]
    (invalid,) = problems["invalid_objects"]
    assert (invalid["kind"], invalid["name"]) == ("Service", "default/bad")
    assert "clusterIP '10.96.0.300'" in invalid["error"]
    assert problems["orphan_slices"] == [{"slice": "default/lost-1", "service": "default/nobody"}]

    agent.object_updated(Kind.SERVICE, service("bad", cluster_ip="10.96.0.30"))  # fixed
    agent.object_updated(Kind.SERVICE, service("nobody", cluster_ip="10.96.0.31"))
    sync(agent, clock)
    problems = status.to_json()["problems"]
    assert problems["invalid_objects"] == [] and problems["orphan_slices"] == []


def test_phase_and_change_metrics_come_from_the_status(
    status: AgentStatus, clock: FakeClock
) -> None:
    registry = CollectorRegistry()
    registry.register(StatusCollector(status.phases, status.frontend_changes))
    clock.advance(2)
    status.phase_done(Phase.ATTACHED)
    agent = make_agent(status, clock)
    agent.object_updated(Kind.SERVICE, service())
    agent.initial_list_done(Kind.SERVICE)
    agent.initial_list_done(Kind.ENDPOINT_SLICE)
    sync(agent, clock)
    sample = registry.get_sample_value
    assert sample("ebpflb_startup_phase_seconds", {"phase": "attached"}) == 12.0
    assert sample("ebpflb_startup_phase_seconds", {"phase": "first_sync"}) == 14.0
    assert sample("ebpflb_startup_phase_seconds", {"phase": "nodeport_compiled"}) is None
    assert sample("ebpflb_frontend_changes_total", {"change": "added"}) == 1
    assert sample("ebpflb_frontend_changes_total", {"change": "removed"}) == 0
