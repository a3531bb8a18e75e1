"""`ebpflb run --kubeconfig` against the fake API server on 127.0.0.1: Services created,
changed and deleted through the API reach the kernel maps and move real traffic between
namespaces; a map entry deleted behind the agent's back returns at the next full resync."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from ebpflb.datapath.maps.kernel import KernelMapSet
from ebpflb.model import Frontend, Proto
from lab.harness.agentproc import AgentProcess
from lab.harness.fakeapi import FakeApiServer
from lab.harness.netns import Cgroup, Topology
from tests.factories import endpoint, endpoint_slice, service
from tests.kernel.conftest import PODS, AgentFactory, served_by, wait_backends, wait_until

WEB = "10.96.0.10:80"
WEB_TCP = "10.96.0.10:80/TCP"
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
    bpffs: Path,
) -> None:
    agent = kube_agent()  # an empty cluster: synced with nothing to program
    lists = agent.status()["lists"]
    assert (lists["Service"]["objects"], lists["EndpointSlice"]["objects"]) == (0, 0)

    api.create(service("web"))
    api.create(endpoint_slice("web-1"))
    wait_backends(bpffs, WEB_TCP, {f"{ip}:8080" for ip in PODS.values()})
    counts = served_by(topology.requests(topology.node_ns, "tcp", WEB, 90, cgroup))
    assert set(counts) == set(PODS)

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
    wait_backends(bpffs, WEB_TCP, {"10.244.1.13:8080"})
    counts = served_by(topology.requests(topology.node_ns, "tcp", WEB, 20, cgroup))
    assert set(counts) == {"pod3"}

    # The watch is cut; the deletion made meanwhile still arrives after the reconnection.
    assert api.drop_watches() == 2
    api.delete("Service", "default", "web")
    wait_backends(bpffs, WEB_TCP, None, timeout=15)
    (result,) = topology.requests(topology.node_ns, "tcp", WEB, 1, cgroup)
    assert result["error"] == "ENETUNREACH"  # no longer translated: dies in the namespace
    metrics = agent.metrics()  # the drops were seen (a broken watch each) and survived
    for kind in ("Service", "EndpointSlice"):
        failures = metrics.value("ebpflb_source_events_total", source=kind, event="failures")
        assert failures is not None and failures >= 1, kind


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

    def repaired() -> float | None:
        return agent.metrics().value("ebpflb_drift_repaired_total", map="ebpflb_svc4")

    assert repaired() is None  # nothing repaired so far
    with KernelMapSet(bpffs) as maps:
        assert maps.services.delete(WEB_FRONTEND)
        (result,) = topology.requests(topology.node_ns, "tcp", WEB, 1, cgroup)
        if maps.services.get(WEB_FRONTEND) is None:  # still missing after the request
            assert result["error"] == "ENETUNREACH"
        wait_until(lambda: repaired() is not None, "repaired at a full resync")
        assert repaired() == 1  # the one entry deleted
        assert maps.services.get(WEB_FRONTEND) is not None
    assert len(served_by(topology.requests(topology.node_ns, "tcp", WEB, 30, cgroup))) == 3
