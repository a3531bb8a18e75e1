"""Upstream `[sig-network] Services ...` (test/e2e/network/service.go): an SCTP Service and
a restarted proxy, ported."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.factories import service
from tests.kernel.e2e.harness import E2E, Result, eventually, restart_agent, slice_for

S = "[sig-network] Services "
MODULES, PROTOCOLS = Path("/proc/modules"), Path("/proc/net/protocols")


def sctp_loaded() -> bool:
    """Whether the kernel has SCTP: the module listed (where modules exist) or the
    protocol registered (built in, or loaded). Only read, never loaded."""
    if MODULES.is_file() and any(
        line.split()[0] == "sctp" for line in MODULES.read_text().splitlines()
    ):
        return True
    return any(line.split()[:1] == ["SCTP"] for line in PROTOCOLS.read_text().splitlines())


def frontends(e2e: E2E, node: str) -> set[str]:
    return {str(s["frontend"]) for s in e2e.shared.nodes[node].dump()["services"]}


@pytest.mark.upstream(
    S + "should allow creating a basic SCTP service with pod and endpoints [LinuxOnly] [Serial]"
)
def test_allow_creating_a_basic_sctp_service(e2e: E2E) -> None:
    """A Service with an SCTP port and its endpoints: the agents take it (its TCP port is
    programmed and served; the SCTP port, which ebpflb does not translate, is left out)
    and the sctp module is not loaded as a side effect, as upstream checks on the nodes."""
    before = sctp_loaded()
    a = e2e.allocate("sctp-endpoint-test")
    ports = [
        {"name": "sctp", "protocol": "SCTP", "port": 5060, "targetPort": 5060},
        {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
    ]
    slice_ports = [
        {"name": "sctp", "protocol": "SCTP", "port": 5060},
        {"name": "http", "protocol": "TCP", "port": 8080},
    ]
    e2e.apply(
        service(a.name, cluster_ip=a.cluster_ip, ports=ports),
        slice_for(a.name, ["pod11"], slice_ports),
    )
    vip = f"{a.cluster_ip}:80"
    eventually(
        lambda: [r.get("server") for r in e2e.from_host("node2", "tcp", vip)] == ["pod11"], vip
    )
    for node in e2e.shared.nodes:
        mine = {f for f in frontends(e2e, node) if f.startswith(f"{a.cluster_ip}:")}
        assert mine == {f"{vip}/TCP"}, (node, mine)
    if not before:
        assert not sctp_loaded(), "the sctp module was loaded"


def served_by(results: list[Result], pods: set[str]) -> bool:
    return all(r["ok"] for r in results) and {r["server"] for r in results} == pods


@pytest.mark.pod_clients
@pytest.mark.upstream(S + "should work after restarting kube-proxy [Disruptive]")
def test_work_after_restarting_kube_proxy(e2e: E2E) -> None:
    """Two Services up (from node1's network and a pod on node2); node1's agent restarted:
    both still up, from both, and a third Service created afterwards is served (the new
    agent follows the API again)."""
    a = e2e.allocate("service-restart")
    pods = [["pod11", "pod21"], ["pod12", "pod22"], ["pod13", "pod21"]]

    def create(i: int) -> None:
        name = f"{a.name}-{i}"
        e2e.apply(service(name, cluster_ip=a.ip(i)), slice_for(name, pods[i]))

    def up(i: int) -> bool:
        vip = f"{a.ip(i)}:80"
        results = [
            *e2e.from_host("node1", "tcp", vip, 12, timeout=0.5),
            *e2e.from_pod("client1", "tcp", vip, 12, timeout=0.5),
        ]
        return served_by(results, set(pods[i]))

    for i in (0, 1):
        create(i)
        eventually(lambda i=i: up(i), f"service {i} up")
    restart_agent(e2e.shared, "node1")
    assert up(0) and up(1)
    create(2)
    eventually(lambda: up(2), "a Service created after the restart up")
