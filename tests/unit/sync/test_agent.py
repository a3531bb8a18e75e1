"""The whole sync path (objects -> trackers -> desired -> reconciler -> maps) on fake maps."""

from __future__ import annotations

import gc
import logging

import pytest
from prometheus_client import CollectorRegistry

from ebpflb.clock import FakeClock
from ebpflb.config import Config
from ebpflb.datapath.maps import dump
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.k8s.sources.base import Kind
from ebpflb.model import NamespacedName
from ebpflb.observe.metrics import Metrics
from ebpflb.sync import agent as agent_module
from ebpflb.sync.agent import Agent
from ebpflb.sync.runner import SyncKind
from tests.factories import endpoint, endpoint_slice, service


@pytest.fixture
def maps() -> FakeMapSet:
    return FakeMapSet()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def agent(maps: FakeMapSet, clock: FakeClock) -> Agent:
    return Agent(
        Config(min_sync_period=1.0, max_sync_period=60.0),
        maps,
        Metrics(CollectorRegistry()),
        clock=clock,
    )


def frontends(maps: FakeMapSet) -> dict[str, list[tuple[str, int]]]:
    report = dump.collect(maps)
    return {
        s["frontend"]: [(b["address"], b["slots"]) for b in s["backends"]]
        for s in report["services"]
    }


def start(agent: Agent) -> None:
    agent.initial_list_done(Kind.SERVICE)
    agent.initial_list_done(Kind.ENDPOINT_SLICE)
    assert agent.runner.run_once() is not None


def test_nothing_is_written_before_both_lists(agent: Agent, maps: FakeMapSet) -> None:
    agent.object_updated(Kind.SERVICE, service())
    agent.initial_list_done(Kind.SERVICE)
    assert agent.runner.run_once() is None and not maps.services.data
    agent.initial_list_done(Kind.ENDPOINT_SLICE)
    assert agent.runner.run_once() is not None
    assert list(frontends(maps)) == ["10.96.0.10:80/TCP"]


def test_create_update_delete_flow_into_the_maps(
    agent: Agent, maps: FakeMapSet, clock: FakeClock
) -> None:
    agent.object_updated(Kind.SERVICE, service())
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice())
    start(agent)
    assert [a for a, _ in frontends(maps)["10.96.0.10:80/TCP"]] == [
        "10.244.1.11:8080",
        "10.244.1.12:8080",
        "10.244.1.13:8080",
    ]
    clock.advance(2)
    agent.object_updated(
        Kind.ENDPOINT_SLICE,
        endpoint_slice(
            endpoints=[
                endpoint("10.244.1.11"),
                endpoint("10.244.1.12"),
                endpoint("10.244.1.13", ready=False),
            ]
        ),
    )
    assert agent.runner.run_once() is not None
    assert [a for a, _ in frontends(maps)["10.96.0.10:80/TCP"]] == [
        "10.244.1.11:8080",
        "10.244.1.12:8080",
    ]
    assert agent.last_result is not None and 0 < agent.last_result.slots_written < 509
    clock.advance(2)
    agent.object_deleted(Kind.SERVICE, NamespacedName("default", "web"))
    agent.runner.run_once()
    assert frontends(maps) == {} and not maps.backends.data


def test_invalid_object_is_logged_counted_and_others_work(
    agent: Agent, maps: FakeMapSet, caplog: pytest.LogCaptureFixture
) -> None:
    agent.object_updated(Kind.SERVICE, service("bad", cluster_ip="10.96.0.300"))
    agent.object_updated(Kind.SERVICE, service("web"))
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice())
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice("ghost-1", service_name="ghost"))
    with caplog.at_level(logging.WARNING):
        start(agent)
    assert list(frontends(maps)) == ["10.96.0.10:80/TCP"]
    assert (
        agent.metrics.registry.get_sample_value(
            "ebpflb_invalid_objects_total", {"kind": "Service", "reason": "value"}
        )
        == 1
    )
    messages = caplog.text
    assert "EndpointSlice default/ghost-1 names unknown service default/ghost" in messages


def test_invalid_edit_keeps_the_last_good_version(
    agent: Agent, maps: FakeMapSet, clock: FakeClock
) -> None:
    agent.object_updated(Kind.SERVICE, service())
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice())
    start(agent)
    clock.advance(2)
    agent.object_updated(Kind.SERVICE, service(ports=[{"name": "http", "port": 99999}]))
    assert agent.runner.run_once() is None  # nothing pending: the edit was rejected
    assert list(frontends(maps)) == ["10.96.0.10:80/TCP"]


def test_full_resync_repairs_a_deleted_entry(
    agent: Agent, maps: FakeMapSet, clock: FakeClock
) -> None:
    agent.object_updated(Kind.SERVICE, service())
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice())
    start(agent)
    maps.services.data.clear()  # somebody deleted the entry behind the agent's back
    clock.advance(60)
    assert agent.runner.run_once() is not None
    assert list(frontends(maps)) == ["10.96.0.10:80/TCP"]
    assert (
        agent.metrics.registry.get_sample_value(
            "ebpflb_drift_repaired_total", {"map": "ebpflb_svc4"}
        )
        == 1
    )


def test_terminating_fallback_and_named_target_port(agent: Agent, maps: FakeMapSet) -> None:
    agent.object_updated(
        Kind.SERVICE, service(ports=[{"name": "http", "port": 80, "targetPort": "web-http"}])
    )
    agent.object_updated(
        Kind.ENDPOINT_SLICE,
        endpoint_slice(
            endpoints=[
                endpoint("10.244.1.11", ready=False, serving=True, terminating=True),
                endpoint("10.244.1.12", ready=False, serving=False, terminating=True),
            ]
        ),
    )
    start(agent)
    assert [a for a, _ in frontends(maps)["10.96.0.10:80/TCP"]] == ["10.244.1.11:8080"]


def test_the_maps_may_come_after_the_lists(clock: FakeClock) -> None:
    """A source lists while the datapath compiles: no sync before the maps exist."""
    agent = Agent(Config(), None, Metrics(CollectorRegistry()), clock=clock)
    agent.object_updated(Kind.SERVICE, service())
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice())
    agent.initial_list_done(Kind.SERVICE)
    agent.initial_list_done(Kind.ENDPOINT_SLICE)
    assert agent.runner.run_once() is None
    with pytest.raises(RuntimeError, match="no maps yet"):
        agent.reconciler  # noqa: B018
    maps = FakeMapSet()
    agent.use_maps(maps)
    assert agent.runner.run_once() is not None
    assert list(frontends(maps)) == ["10.96.0.10:80/TCP"]


def test_each_changed_service_is_looked_at_once_and_a_resync_reuses_it(
    agent: Agent, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_at: list[NamespacedName] = []
    real = agent_module.service_state

    def counting(*args: object) -> object:
        looked_at.append(args[2])  # type: ignore[arg-type]
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(agent_module, "service_state", counting)
    agent.object_updated(Kind.SERVICE, service())
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice())
    start(agent)
    assert looked_at == [NamespacedName("default", "web")]
    clock.advance(2)
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice(endpoints=[endpoint("10.244.1.11")]))
    agent.runner.run_once()
    assert looked_at == [NamespacedName("default", "web")] * 2
    clock.advance(60)  # a full resync: the desired state is kept, not recomputed
    assert agent.runner.run_once() is not None
    assert len(looked_at) == 2


def test_a_sync_runs_without_the_cyclic_gc(agent: Agent) -> None:
    seen: list[bool] = []
    agent.housekeeping = lambda: seen.append(gc.isenabled())
    agent.object_updated(Kind.SERVICE, service())
    start(agent)  # the first sync is a full one, with housekeeping only later
    agent._sync(SyncKind.FULL)
    assert seen == [False] and gc.isenabled()


# ---- capacity: one frontend that cannot be programmed never stops the others ----------


def big_service(agent: Agent, count: int = 120) -> None:
    """default/big at 10.96.0.30 with `count` ready endpoints (10.244.2.1 on)."""
    agent.object_updated(Kind.SERVICE, service("big", cluster_ip="10.96.0.30"))
    agent.object_updated(
        Kind.ENDPOINT_SLICE,
        endpoint_slice(
            "big-1",
            service_name="big",
            endpoints=[endpoint(f"10.244.2.{i}") for i in range(1, count + 1)],
        ),
    )


def test_a_service_over_the_table_size_limit_fails_alone_and_is_retried(
    maps: FakeMapSet, clock: FakeClock
) -> None:
    agent = Agent(
        Config(min_sync_period=1.0, max_sync_period=60.0, maglev_max_table_size=101),
        maps,
        Metrics(CollectorRegistry()),
        clock=clock,
    )
    big_service(agent)
    agent.object_updated(Kind.SERVICE, service())
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice())
    start(agent)
    assert list(frontends(maps)) == ["10.96.0.10:80/TCP"]
    assert agent.synced.is_set()
    assert agent.last_result is not None
    assert agent.last_result.failed == {NamespacedName("default", "big")}
    errors = agent.metrics.registry.get_sample_value(
        "ebpflb_syncs_total", {"kind": "full", "result": "error"}
    )
    assert errors == 1
    # The retry (after retry_period, with nothing else pending) tries it again.
    clock.advance(2.5)
    assert agent.runner.run_once() is SyncKind.INCREMENTAL
    assert agent.last_result.failed == {NamespacedName("default", "big")}
    # An edit of another service is applied; a full resync repairs the rest.
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice(endpoints=[endpoint("10.244.1.11")]))
    clock.advance(2.5)
    agent.runner.run_once()
    assert [a for a, _ in frontends(maps)["10.96.0.10:80/TCP"]] == ["10.244.1.11:8080"]
    maps.services.data.clear()
    clock.advance(60)
    assert agent.runner.run_once() is SyncKind.FULL
    assert list(frontends(maps)) == ["10.96.0.10:80/TCP"]
    # Once it fits, the next retry programs it.
    big_service(agent, count=100)
    clock.advance(2.5)
    agent.runner.run_once()
    assert sorted(frontends(maps)) == ["10.96.0.10:80/TCP", "10.96.0.30:80/TCP"]
    assert agent.last_result.errors == []


@pytest.mark.parametrize("first", [True, False])
def test_an_apply_that_raises_loses_no_pending_service(
    agent: Agent, maps: FakeMapSet, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, first: bool
) -> None:
    """Whatever goes wrong inside an apply, the services it was given are retried."""
    if not first:
        start(agent)
        clock.advance(2)
    agent.object_updated(Kind.SERVICE, service())
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice())
    real = agent.reconciler.apply

    def broken(*args: object, **kwargs: object) -> object:
        monkeypatch.setattr(agent.reconciler, "apply", real)  # fails once
        raise RuntimeError("something unexpected")

    monkeypatch.setattr(agent.reconciler, "apply", broken)
    if first:
        agent.initial_list_done(Kind.SERVICE)
        agent.initial_list_done(Kind.ENDPOINT_SLICE)
    assert agent.runner.run_once() is not None
    assert frontends(maps) == {}
    assert agent.synced.is_set() is not first  # not ready after a first sync that raised
    clock.advance(2.5)
    assert agent.runner.run_once() is not None
    assert list(frontends(maps)) == ["10.96.0.10:80/TCP"]
    assert agent.synced.is_set()


def test_a_full_resync_that_raises_is_done_again_at_the_retry(
    agent: Agent, maps: FakeMapSet, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent.object_updated(Kind.SERVICE, service())
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice())
    start(agent)
    maps.services.data.clear()
    real = agent.reconciler.restore

    def broken() -> None:
        monkeypatch.setattr(agent.reconciler, "restore", real)
        raise RuntimeError("reading the maps failed")

    monkeypatch.setattr(agent.reconciler, "restore", broken)
    clock.advance(60)
    assert agent.runner.run_once() is SyncKind.FULL
    assert frontends(maps) == {}
    clock.advance(2.5)
    assert agent.runner.run_once() is SyncKind.INCREMENTAL  # the retry repairs, as a full one
    assert list(frontends(maps)) == ["10.96.0.10:80/TCP"]
