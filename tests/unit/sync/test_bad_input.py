"""Bad input reaches the agent and costs only itself: objects -> agent -> fake maps.

The same path as tests/unit/sync/test_agent.py (real translation, trackers, reconciler, on
FakeMapSet); tests/kernel/agent/test_bad_input.py repeats the manifest cases with the real
agent, kernel and traffic.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ebpflb.clock import FakeClock
from ebpflb.config import Config
from ebpflb.datapath.maps import dump
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.k8s.sources.base import Kind
from ebpflb.k8s.sources.manifests import ManifestSource
from ebpflb.observe.metrics import Metrics
from ebpflb.sync import agent as agent_module
from ebpflb.sync.agent import Agent
from tests.factories import endpoint_slice, service


def make_agent(maps: FakeMapSet, **config: Any) -> Agent:
    return Agent(
        Config(min_sync_period=1.0, max_sync_period=60.0, **config),
        maps,
        Metrics(CollectorRegistry()),
        clock=FakeClock(),
    )


def frontends(maps: FakeMapSet) -> dict[str, list[str]]:
    return {
        s["frontend"]: [b["address"] for b in s["backends"]] for s in dump.collect(maps)["services"]
    }


def start(agent: Agent) -> None:
    agent.initial_list_done(Kind.SERVICE)
    agent.initial_list_done(Kind.ENDPOINT_SLICE)
    assert agent.runner.run_once() is not None


def sample(agent: Agent, name: str, **labels: str) -> float:
    return agent.metrics.registry.get_sample_value(name, labels) or 0.0


def test_wrong_types_cost_only_their_object_and_are_counted_by_reason() -> None:
    """`protocol: 6` and a list `spec` raised AttributeError out of object_updated: the
    agent exited at start."""
    maps = FakeMapSet()
    agent = make_agent(maps)
    agent.object_updated(Kind.SERVICE, service("proto", ports=[{"port": 80, "protocol": 6}]))
    agent.object_updated(Kind.SERVICE, {**service("listy"), "spec": [1, 2]})
    agent.object_updated(Kind.SERVICE, service())
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice())
    start(agent)
    assert list(frontends(maps)) == ["10.96.0.10:80/TCP"]
    assert sample(agent, "ebpflb_invalid_objects_total", kind="Service", reason="type") == 2


def test_an_unexpected_exception_in_translation_costs_only_its_object(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = agent_module.translate_service

    def buggy(obj: Any) -> Any:
        if obj["metadata"]["name"] == "unlucky":
            raise KeyError("a bug")
        return real(obj)

    monkeypatch.setattr(agent_module, "translate_service", buggy)
    maps = FakeMapSet()
    agent = make_agent(maps)
    with caplog.at_level(logging.ERROR):
        agent.object_updated(Kind.SERVICE, service("unlucky", cluster_ip="10.96.0.11"))
    agent.object_updated(Kind.SERVICE, service())
    start(agent)
    assert list(frontends(maps)) == ["10.96.0.10:80/TCP"]
    assert sample(agent, "ebpflb_invalid_objects_total", kind="Service", reason="internal") == 1
    assert "invalid Service, skipped: Service default/unlucky: KeyError: 'a bug'" in caplog.text
    assert "Traceback" in caplog.text  # a bug: its traceback is logged


def test_a_string_false_does_not_make_a_backend() -> None:
    """`ready: "false"` counted as ready: an address with no pod became the only backend."""
    maps = FakeMapSet()
    agent = make_agent(maps)
    agent.object_updated(Kind.SERVICE, service())
    agent.object_updated(
        Kind.ENDPOINT_SLICE,
        endpoint_slice(endpoints=[{"addresses": ["10.244.9.9"], "conditions": {"ready": "false"}}]),
    )
    start(agent)
    assert frontends(maps) == {"10.96.0.10:80/TCP": []}  # refuses: no valid endpoint
    assert sample(agent, "ebpflb_invalid_objects_total", kind="EndpointSlice", reason="type") == 1


def test_an_sctp_port_is_skipped_once_and_the_other_ports_programmed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    maps = FakeMapSet()
    agent = make_agent(maps)
    ports = [
        {"name": "http", "port": 80},
        {"name": "sig", "port": 3868, "protocol": "SCTP"},
        {"name": "dns", "port": 53, "protocol": "UDP"},
    ]
    with caplog.at_level(logging.WARNING):
        agent.object_updated(Kind.SERVICE, service(ports=ports))
        agent.object_updated(Kind.SERVICE, service(ports=ports, externalTrafficPolicy="Local"))
    start(agent)
    assert sorted(frontends(maps)) == ["10.96.0.10:53/UDP", "10.96.0.10:80/TCP"]
    lines = [r.getMessage() for r in caplog.records if "not programmed" in r.getMessage()]
    assert lines == [
        "service default/web: port spec.ports[1] (sig, 3868/SCTP) not programmed (protocol not"
        " supported: ebpflb programs TCP and UDP); its other ports are"
    ]
    assert sample(agent, "ebpflb_ports_skipped_total", reason="protocol") == 1


def test_external_ips_are_refused_by_default_and_reported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    maps = FakeMapSet()
    agent = make_agent(maps)
    obj = service(type="LoadBalancer", externalIPs=["192.0.2.7", "198.51.100.7"])
    with caplog.at_level(logging.WARNING):
        agent.object_updated(Kind.SERVICE, obj)
        agent.object_updated(Kind.SERVICE, {**obj, "metadata": {**obj["metadata"], "labels": {}}})
    start(agent)
    assert list(frontends(maps)) == ["10.96.0.10:80/TCP"]
    refused = [r.getMessage() for r in caplog.records if "externalIP" in r.getMessage()]
    assert len(refused) == 2 and "service default/web: externalIP 192.0.2.7" in refused[0]
    assert sample(agent, "ebpflb_external_ips_refused_total") == 2


def test_external_ips_inside_the_allow_list_are_programmed() -> None:
    maps = FakeMapSet()
    agent = make_agent(maps, external_ip_cidrs=Config.parse_cidrs("192.0.2.0/24"))
    agent.object_updated(
        Kind.SERVICE, service(type="LoadBalancer", externalIPs=["192.0.2.7", "198.51.100.7"])
    )
    start(agent)
    assert sorted(frontends(maps)) == ["10.96.0.10:80/TCP", "192.0.2.7:80/TCP"]
    assert sample(agent, "ebpflb_external_ips_refused_total") == 1


SERVICE = """\
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  clusterIP: {ip}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
"""
SLICE = """\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints: [{{addresses: [{backend}]}}]
"""


def reload(source: ManifestSource, agent: Agent, clock: FakeClock, *edited: Path) -> None:
    for file in edited:
        stamp = os.stat(file).st_mtime_ns + 10**9
        os.utime(file, ns=(stamp, stamp))
    source.sync_once()
    assert source.sync_once()
    clock.advance(2)
    agent.runner.run_once()


def test_bad_files_and_documents_through_the_manifest_source(tmp_path: Path) -> None:
    """The kernel test's scenario on fake maps: bad files at start, a bad document added
    to a good file while running, then an edit of another good file."""
    (tmp_path / "random.yaml").write_bytes(os.urandom(512) + b"\xff")
    (tmp_path / "proto.yaml").write_text(
        SERVICE.format(name="proto", ip="10.96.0.61").replace("port: 80,", "port: 80, protocol: 6,")
    )
    (tmp_path / "listy.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: listy}\nspec: [1, 2]\n"
    )
    web = tmp_path / "web.yaml"
    web.write_text(
        SERVICE.format(name="web", ip="10.96.0.10")
        + "---\n"
        + SLICE.format(name="web", backend="10.244.1.11")
    )
    other = tmp_path / "other.yaml"
    other.write_text(SERVICE.format(name="other", ip="10.96.0.20"))
    maps = FakeMapSet()
    clock = FakeClock()
    agent = Agent(Config(min_sync_period=1.0), maps, Metrics(CollectorRegistry()), clock=clock)
    source = ManifestSource(tmp_path, agent)
    source.start()
    assert source.wait_listed(10)  # read in the source's thread
    agent.runner.run_once()
    assert frontends(maps) == {"10.96.0.10:80/TCP": ["10.244.1.11:8080"], "10.96.0.20:80/TCP": []}
    assert sample(agent, "ebpflb_invalid_objects_total", kind="Manifest", reason="decode") == 1
    assert sample(agent, "ebpflb_invalid_objects_total", kind="Service", reason="type") == 2

    # A bad document, then a good one after it, added to a good file while running.
    web.write_text(
        web.read_text()
        + "---\n"
        + SERVICE.format(name="late-bad", ip="10.96.0.62").replace("port: 80,", "port: '80',")
        + "---\n"
        + SERVICE.format(name="late-good", ip="10.96.0.63")
    )
    reload(source, agent, clock, web)
    assert "10.96.0.63:80/TCP" in frontends(maps) and "10.96.0.62:80/TCP" not in frontends(maps)
    # A later edit of another good file is applied.
    other.write_text(
        other.read_text() + "---\n" + SLICE.format(name="other", backend="10.244.1.12")
    )
    reload(source, agent, clock, other)
    assert frontends(maps)["10.96.0.20:80/TCP"] == ["10.244.1.12:8080"]
    assert sample(agent, "ebpflb_invalid_objects_total", kind="Service", reason="type") == 3
