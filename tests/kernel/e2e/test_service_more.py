"""Upstream `[sig-network] Services ...` (test/e2e/network/service.go): an SCTP Service and
a restarted proxy, ported."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from lab.harness.nshttp import http_get
from tests.factories import service
from tests.kernel.e2e.harness import E2E, NODE_IPS, Result, eventually, restart_agent, slice_for

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


def health(e2e: E2E, node: str, port: int) -> int:
    """The status of `node`'s healthCheckNodePort /healthz, asked from outside (0: no
    answer), as a cloud load balancer's probe asks it."""
    client = e2e.shared.cluster.clients["client"]
    try:
        status, _headers, _body = http_get(
            NODE_IPS[node], port, "/healthz", netns=client, timeout=1
        )
    except OSError:
        return 0
    return status


@pytest.mark.upstream(
    S + "should fail health check node port if there are only terminating endpoints"
)
def test_fail_health_check_node_port_if_only_terminating_endpoints(e2e: E2E) -> None:
    """An externalTrafficPolicy=Local LoadBalancer Service, its one pod on node1: node1's
    healthCheckNodePort answers 200; the pod deleted (grace period running): 503, while
    traffic to node1's nodePort still reaches the terminating pod."""
    a = e2e.allocate("svc-proxy-terminating")
    node_port, hc_port = a.node_ports[0], a.node_ports[1]
    port = {
        "name": "http",
        "protocol": "TCP",
        "port": 80,
        "targetPort": 8080,
        "nodePort": node_port,
    }
    e2e.apply(
        service(
            a.name,
            cluster_ip=a.cluster_ip,
            type="LoadBalancer",
            ports=[port],
            externalTrafficPolicy="Local",
            healthCheckNodePort=hc_port,
        ),
        slice_for(a.name, ["pod11"]),
    )
    target = f"{NODE_IPS['node1']}:{node_port}"
    eventually(lambda: health(e2e, "node1", hc_port) == 200, "200 with a ready local pod")
    eventually(lambda: served_by(e2e.from_outside("tcp", target, 5), {"pod11"}), "served")
    e2e.apply(slice_for(a.name, ["pod11"], ready=False, serving=True, terminating=True))
    eventually(lambda: health(e2e, "node1", hc_port) == 503, "503 with only a terminating pod")
    assert served_by(e2e.from_outside("tcp", target, 5), {"pod11"})


AFFINITY_CONFIRM_COUNT = 15  # upstream's AffinityConfirmCount
AFFINITY_TIMEOUT = 2  # seconds; shorter than upstream's (the row's note says how)
AFFINITY_TIMEOUT_ROWS = (
    "should have session affinity timeout work for service with type clusterIP [LinuxOnly]",
    "should have session affinity timeout work for NodePort service [LinuxOnly]",
)


@pytest.mark.pod_clients
@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("clusterIP", marks=pytest.mark.upstream(S + AFFINITY_TIMEOUT_ROWS[0])),
        pytest.param("NodePort", marks=pytest.mark.upstream(S + AFFINITY_TIMEOUT_ROWS[1])),
    ],
)
def test_session_affinity_timeout_work(e2e: E2E, kind: str) -> None:
    """ClientIP affinity with timeoutSeconds: sticky for 15 requests in a row; then, each
    time the same pod answers, a pause longer than the timeout (timeout + 1 s)
    and another request, up to 10: another pod must answer (3 pods: a new pick)."""
    a = e2e.allocate("affinity-timeout")
    port: dict[str, Any] = {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}
    spec: dict[str, Any] = {
        "sessionAffinity": "ClientIP",
        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": AFFINITY_TIMEOUT}},
    }
    target = f"{a.cluster_ip}:80"
    if kind == "NodePort":
        port["nodePort"] = a.node_ports[0]
        spec["type"] = "NodePort"
        target = f"{NODE_IPS['node2']}:{a.node_ports[0]}"
    e2e.apply(
        service(a.name, cluster_ip=a.cluster_ip, ports=[port], **spec),
        slice_for(a.name, ["pod11", "pod12", "pod21"]),
    )

    def sticky() -> bool:
        results = e2e.from_pod("client1", "tcp", target, AFFINITY_CONFIRM_COUNT)
        return all(r["ok"] for r in results) and len({r["server"] for r in results}) == 1

    eventually(sticky, "sticky")
    hosts: set[str] = set()
    for _ in range(10):
        (result,) = e2e.from_pod("client1", "tcp", target, 1)
        if result["ok"]:
            hosts.add(str(result["server"]))
            if len(hosts) > 1:
                return
            time.sleep(AFFINITY_TIMEOUT + 1)
    pytest.fail(f"sticky after the timeout: {hosts}")
