"""Upstream `[sig-network] Networking Granular Checks: Services` (test/e2e/network/
networking.go), ported: a test pod (pod-Service) or a hostNetwork pod (node-Service) dials
the Service's ClusterIP and a node's address with its nodePort, and every endpoint's
hostname must come back within the tries; large requests carry a 2,000-byte body or
datagram through the ClusterIP. The endpoints are netexec pods on both nodes."""

from __future__ import annotations

import pytest

from tests.factories import service
from tests.kernel.e2e.harness import E2E, NODE_IPS, Result, eventually, slice_for

G = "[sig-network] Networking Granular Checks: Services "
ENDPOINTS = ["pod11", "pod21"]  # one netexec pod per node
MAX_TRIES = 20  # upstream's MaxTries is 2 x endpoints + slack; enough to see both here


def netexec_service(e2e: E2E, name: str) -> tuple[str, dict[str, int]]:
    """The Service of upstream's NetworkingTestConfig: http 80 -> 8080 and udp 90 -> 8080,
    NodePort; its ClusterIP and nodePorts by protocol."""
    a = e2e.allocate(name)
    http, udp = a.node_ports[0], a.node_ports[1]
    ports = [
        {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": http},
        {"name": "udp", "protocol": "UDP", "port": 90, "targetPort": 8080, "nodePort": udp},
    ]
    slice_ports = [
        {"name": "http", "protocol": "TCP", "port": 8080},
        {"name": "udp", "protocol": "UDP", "port": 8080},
    ]
    e2e.apply(
        service(a.name, cluster_ip=a.cluster_ip, type="NodePort", ports=ports),
        slice_for(a.name, ENDPOINTS, slice_ports),
    )
    return a.cluster_ip, {"tcp": http, "udp": udp}


def dial(e2e: E2E, origin: str, mode: str, target: str, *extra: str) -> list[Result]:
    """MAX_TRIES requests from the test container: a pod on node1, or node1's network."""
    if origin == "pod":
        return e2e.from_pod("client1", mode, target, MAX_TRIES, *extra, timeout=0.5)
    return e2e.from_host("node1", mode, target, MAX_TRIES, *extra, timeout=0.5)


def every_endpoint(results: list[Result]) -> bool:
    return all(r["ok"] for r in results) and {r["server"] for r in results} == set(ENDPOINTS)


def granular(e2e: E2E, origin: str, mode: str) -> None:
    cluster_ip, node_ports = netexec_service(e2e, f"{origin}-{mode}")
    port = 80 if mode == "tcp" else 90
    targets = [f"{cluster_ip}:{port}", f"{NODE_IPS['node1']}:{node_ports[mode]}"]
    for target in targets:
        eventually(lambda t=target: every_endpoint(dial(e2e, origin, mode, t)), f"{target}")


@pytest.mark.parametrize(
    ("origin", "mode"),
    [
        pytest.param(
            "pod", "tcp", marks=pytest.mark.upstream(G + "should function for pod-Service: http")
        ),
        pytest.param(
            "pod", "udp", marks=pytest.mark.upstream(G + "should function for pod-Service: udp")
        ),
        pytest.param(
            "node", "tcp", marks=pytest.mark.upstream(G + "should function for node-Service: http")
        ),
        pytest.param(
            "node", "udp", marks=pytest.mark.upstream(G + "should function for node-Service: udp")
        ),
    ],
)
def test_granular_service_checks(e2e: E2E, origin: str, mode: str) -> None:
    granular(e2e, origin, mode)


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(
            "tcp", marks=pytest.mark.upstream(G + "should be able to handle large requests: http")
        ),
        pytest.param(
            "udp", marks=pytest.mark.upstream(G + "should be able to handle large requests: udp")
        ),
    ],
)
def test_handle_large_requests(e2e: E2E, mode: str) -> None:
    """2,000 bytes: more than one TCP segment's worth of the first write on a loaded path,
    and a UDP datagram that fragments at the pods' 1,500-byte MTU (both ways: echoed)."""
    cluster_ip, _ = netexec_service(e2e, f"large-{mode}")
    target = f"{cluster_ip}:{80 if mode == 'tcp' else 90}"

    def whole(results: list[Result]) -> bool:
        return all(r["ok"] and r.get("echoed") == 2000 for r in results)

    eventually(lambda: whole(dial(e2e, "pod", mode, target, "--size", "2000")), "2,000 bytes")
