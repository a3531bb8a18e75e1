"""`ebpflb run --kubeconfig` against the fake API server on 127.0.0.1: Services created,
changed and deleted through the API reach the kernel maps and move real traffic between
namespaces; a map entry deleted behind the agent's back returns at the next full resync."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from ebpflb.datapath.kernel import KernelMapSet
from ebpflb.model import Frontend, Proto
from ebpflb.testing.agentproc import AgentProcess
from ebpflb.testing.fakeapi import FakeApiServer
from ebpflb.testing.netns import Cgroup, Topology
from tests.factories import endpoint, endpoint_slice, service
from tests.kernel.conftest import PODS, AgentFactory, served_by

WEB = "10.96.0.10:80"
WEB_FRONTEND = Frontend(IPv4Address("10.96.0.10"), 80, Proto.TCP)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def kube_agent(
    api: FakeApiServer, start_agent: AgentFactory, tmp_path: Path
) -> Callable[..., AgentProcess]:
    """Start `ebpflb run --kubeconfig FILE` (FILE naming the fake API server)."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    return lambda *extra: start_agent("--kubeconfig", str(kubeconfig), *extra)


def test_service_created_updated_and_deleted_through_the_api(
    topology: Topology,
    cgroup: Cgroup,
    api: FakeApiServer,
    kube_agent: Callable[..., AgentProcess],
) -> None:
    agent = kube_agent()  # an empty cluster: synced with nothing to program
    assert "listed 0 Services" in agent.output()

    mark = len(agent.lines)
    api.create(service("web"))
    api.create(endpoint_slice("web-1"))
    agent.wait_for("default/web:http 10.96.0.10:80/TCP added: 3 backends", timeout=10, start=mark)
    counts = served_by(topology.requests(topology.node_ns, "tcp", WEB, 90, cgroup))
    assert set(counts) == set(PODS)

    mark = len(agent.lines)
    api.update(
        endpoint_slice(
            "web-1",
            endpoints=[
                endpoint("10.244.1.11", ready=False),
                endpoint("10.244.1.12", ready=False),
                endpoint("10.244.1.13"),
            ],
        )
    )
    agent.wait_for("default/web:http 10.96.0.10:80/TCP updated", timeout=10, start=mark)
    counts = served_by(topology.requests(topology.node_ns, "tcp", WEB, 20, cgroup))
    assert set(counts) == {"pod3"}

    # The watch is cut; the deletion made meanwhile still arrives after the reconnection.
    mark = len(agent.lines)
    assert api.drop_watches() == 2
    api.delete("Service", "default", "web")
    agent.wait_for("default/web:http 10.96.0.10:80/TCP removed", timeout=15, start=mark)
    (result,) = topology.requests(topology.node_ns, "tcp", WEB, 1, cgroup)
    assert result["error"] == "ENETUNREACH"  # no longer translated: dies in the namespace
    assert "watch from resourceVersion" in agent.output()  # the drop was seen and survived


def test_entry_deleted_behind_the_agents_back_returns_at_the_next_full_resync(
    topology: Topology,
    cgroup: Cgroup,
    api: FakeApiServer,
    kube_agent: Callable[..., AgentProcess],
    bpffs: Path,
) -> None:
    api.create(service("web"))
    api.create(endpoint_slice("web-1"))
    agent = kube_agent("--sync-period", "2")
    assert len(served_by(topology.requests(topology.node_ns, "tcp", WEB, 30, cgroup))) == 3

    mark = len(agent.lines)
    with KernelMapSet(bpffs) as maps:
        assert maps.services.delete(WEB_FRONTEND)
        (result,) = topology.requests(topology.node_ns, "tcp", WEB, 1, cgroup)
        if maps.services.get(WEB_FRONTEND) is None:  # still missing after the request
            assert result["error"] == "ENETUNREACH"
        line = agent.wait_for("full resync repaired drift", timeout=10, start=mark)
        assert "'ebpflb_svc4': 1" in line
        assert maps.services.get(WEB_FRONTEND) is not None
    assert len(served_by(topology.requests(topology.node_ns, "tcp", WEB, 30, cgroup))) == 3
