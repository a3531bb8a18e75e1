"""Upstream `[sig-network] Networking Granular Checks: Services` (test/e2e/network/
networking.go), ported: a test pod (pod-Service) or a hostNetwork pod (node-Service) dials
the Service's ClusterIP and a node's address with its nodePort, and every endpoint's
hostname must come back within the tries; large requests carry a 2,000-byte body or
datagram through the ClusterIP. The endpoints are netexec pods on both nodes."""

from __future__ import annotations

import pytest

from tests.factories import service
from tests.kernel.e2e.harness import E2E, NODE_IPS, Allocation, Result, eventually, slice_for

G = "[sig-network] Networking Granular Checks: Services "
ENDPOINTS = ["pod11", "pod21"]  # one netexec pod per node
MAX_TRIES = 20  # upstream's MaxTries is 2 x endpoints + slack; enough to see both here


SLICE_PORTS = [
    {"name": "http", "protocol": "TCP", "port": 8080},
    {"name": "udp", "protocol": "UDP", "port": 8080},
]


def netexec_service(e2e: E2E, name: str) -> tuple[Allocation, dict[str, int]]:
    """The Service of upstream's NetworkingTestConfig: http 80 -> 8080 and udp 90 -> 8080,
    NodePort; its allocation and nodePorts by protocol."""
    a = e2e.allocate(name)
    http, udp = a.node_ports[0], a.node_ports[1]
    ports = [
        {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": http},
        {"name": "udp", "protocol": "UDP", "port": 90, "targetPort": 8080, "nodePort": udp},
    ]
    e2e.apply(
        service(a.name, cluster_ip=a.cluster_ip, type="NodePort", ports=ports),
        slice_for(a.name, ENDPOINTS, SLICE_PORTS),
    )
    return a, {"tcp": http, "udp": udp}


def dial(e2e: E2E, origin: str, mode: str, target: str, *extra: str) -> list[Result]:
    """MAX_TRIES requests from the test container: a pod on node1, node1's network, or
    (endpoint) one of the endpoints' own pods."""
    if origin in ("pod", "endpoint"):
        client = "client1" if origin == "pod" else ENDPOINTS[0]
        return e2e.from_pod(client, mode, target, MAX_TRIES, *extra, timeout=0.5)
    return e2e.from_host("node1", mode, target, MAX_TRIES, *extra, timeout=0.5)


def every_endpoint(results: list[Result]) -> bool:
    return all(r["ok"] for r in results) and {r["server"] for r in results} == set(ENDPOINTS)


def granular(e2e: E2E, origin: str, mode: str) -> None:
    a, node_ports = netexec_service(e2e, f"{origin}-{mode}")
    port = 80 if mode == "tcp" else 90
    targets = [f"{a.cluster_ip}:{port}", f"{NODE_IPS['node1']}:{node_ports[mode]}"]
    for target in targets:
        eventually(lambda t=target: every_endpoint(dial(e2e, origin, mode, t)), f"{target}")


@pytest.mark.pod_clients
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
            "endpoint",
            "tcp",
            marks=pytest.mark.upstream(G + "should function for endpoint-Service: http"),
        ),
        pytest.param(
            "endpoint",
            "udp",
            marks=pytest.mark.upstream(G + "should function for endpoint-Service: udp"),
        ),
    ],
)
def test_granular_service_checks(e2e: E2E, origin: str, mode: str) -> None:
    granular(e2e, origin, mode)


NODE_HTTP, NODE_UDP = (G + "should function for node-Service: " + m for m in ("http", "udp"))


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("tcp", marks=pytest.mark.upstream(NODE_HTTP)),
        pytest.param("udp", marks=pytest.mark.upstream(NODE_UDP)),
    ],
)
def test_granular_node_service_checks(e2e: E2E, mode: str) -> None:
    """A hostNetwork test container: the same on both datapaths (socket-LB in the node)."""
    granular(e2e, "node", mode)


@pytest.mark.pod_clients
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
    a, _ = netexec_service(e2e, f"large-{mode}")
    target = f"{a.cluster_ip}:{80 if mode == 'tcp' else 90}"

    def whole(results: list[Result]) -> bool:
        return all(r["ok"] and r.get("echoed") == 2000 for r in results)

    eventually(lambda: whole(dial(e2e, "pod", mode, target, "--size", "2000")), "2,000 bytes")


@pytest.mark.pod_clients
@pytest.mark.upstream(G + "should function for multiple endpoint-Services with same selector")
def test_multiple_endpoint_services_with_same_selector(e2e: E2E) -> None:
    """A second Service over the same pods: both ClusterIPs reach every endpoint."""
    first, _ = netexec_service(e2e, "multi-a")
    second, _ = netexec_service(e2e, "multi-b")
    for cluster_ip in (first.cluster_ip, second.cluster_ip):
        for mode, port in (("tcp", 80), ("udp", 90)):
            target = f"{cluster_ip}:{port}"
            eventually(lambda m=mode, t=target: every_endpoint(dial(e2e, "pod", m, t)), target)


@pytest.mark.pod_clients
@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("tcp", marks=pytest.mark.upstream(G + "should update endpoints: http")),
        pytest.param("udp", marks=pytest.mark.upstream(G + "should update endpoints: udp")),
    ],
)
def test_update_endpoints(e2e: E2E, mode: str) -> None:
    """One netexec pod deleted: the ClusterIP reaches only the other one."""
    a, _ = netexec_service(e2e, f"update-{mode}")
    target = f"{a.cluster_ip}:{80 if mode == 'tcp' else 90}"
    eventually(lambda: every_endpoint(dial(e2e, "pod", mode, target)), "every endpoint")
    e2e.apply(slice_for(a.name, ENDPOINTS[1:], SLICE_PORTS))

    def remaining() -> bool:
        results = dial(e2e, "pod", mode, target)
        return all(r["ok"] for r in results) and {r["server"] for r in results} == {ENDPOINTS[1]}

    eventually(remaining, "only the remaining endpoint")


@pytest.mark.upstream(G + "should support basic nodePort: udp functionality")
def test_support_basic_nodeport_udp(e2e: E2E) -> None:
    """From a node, both nodes' address with the udp nodePort reach every endpoint."""
    _, node_ports = netexec_service(e2e, "nodeport-udp")
    for ip in NODE_IPS.values():
        target = f"{ip}:{node_ports['udp']}"
        eventually(lambda t=target: every_endpoint(dial(e2e, "node", "udp", t)), target)


@pytest.mark.pod_clients
@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(
            "tcp",
            marks=pytest.mark.upstream(
                G + "should function for client IP based session affinity: http [LinuxOnly]"
            ),
        ),
        pytest.param(
            "udp",
            marks=pytest.mark.upstream(
                G + "should function for client IP based session affinity: udp [LinuxOnly]"
            ),
        ),
    ],
)
def test_client_ip_based_session_affinity(e2e: E2E, mode: str) -> None:
    """The netexec Service with sessionAffinity ClientIP: every one of the test
    container's requests to the ClusterIP answered by one and the same endpoint
    (upstream: `len(eps) != 1` fails)."""
    a = e2e.allocate(f"affinity-{mode}")
    ports = [
        {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
        {"name": "udp", "protocol": "UDP", "port": 90, "targetPort": 8080},
    ]
    e2e.apply(
        service(a.name, cluster_ip=a.cluster_ip, ports=ports, sessionAffinity="ClientIP"),
        slice_for(a.name, ENDPOINTS, SLICE_PORTS),
    )
    target = f"{a.cluster_ip}:{80 if mode == 'tcp' else 90}"

    def one_endpoint() -> bool:
        results = dial(e2e, "pod", mode, target)
        return all(r["ok"] for r in results) and len({r["server"] for r in results}) == 1

    eventually(one_endpoint, "one endpoint for every request")


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("tcp", marks=pytest.mark.upstream(G + "should update nodePort: http [Slow]")),
        pytest.param("udp", marks=pytest.mark.upstream(G + "should update nodePort: udp [Slow]")),
    ],
)
def test_update_nodeport(e2e: E2E, mode: str) -> None:
    """From a node, its address with the nodePort reaches every endpoint; the NodePort
    Service deleted: 10 tries get no endpoint (upstream: ZERO host endpoints after 10)."""
    a, node_ports = netexec_service(e2e, f"update-np-{mode}")
    target = f"{NODE_IPS['node1']}:{node_ports[mode]}"
    eventually(lambda: every_endpoint(dial(e2e, "node", mode, target)), "every endpoint")
    e2e.delete("Service", a.name)

    def none() -> bool:
        return not any(r["ok"] for r in e2e.from_host("node1", mode, target, 10, timeout=0.3))

    eventually(none, "no endpoint through the deleted nodePort")
