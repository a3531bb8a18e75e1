"""Upstream rows whose endpoints are hostNetwork pods, ported: the endpoint is a server in a
node's own network namespace, its address the node's (as a hostNetwork pod's is), and it
answers with the node's name (upstream's netexec /hostname there is the node's hostname).

- `[sig-network] Networking Granular Checks: Services should function for service endpoints
  using hostNetwork` (networking.go): one such endpoint per node; a pod and a hostNetwork
  client dial the ClusterIP and a node's nodePort over http and udp and must reach every
  endpoint; a 2,000-byte body and datagram come back whole.
- `[sig-network] Services should respect internalTrafficPolicy=Local Pod and Node, to Pod
  (hostNetwork: true)` (service.go): the endpoint on node1 only, port 10180, the Service
  internalTrafficPolicy=Local; a pod and a hostNetwork client on node1 reach it five times
  out of five, the same two on node2 fail five times out of five.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from lab.harness.agentproc import TIMEOUT_SCALE
from tests.factories import endpoint, service
from tests.kernel.e2e.harness import CLIENTS, E2E, NODE_IPS, Result, eventually

G = "[sig-network] Networking Granular Checks: Services "
S = "[sig-network] Services "
PORT = 10180  # upstream's endpointPort for the hostNetwork server
MAX_TRIES = 20


@pytest.fixture
def host_servers(e2e: E2E) -> Iterator[None]:
    """A server in each node's namespace on PORT (TCP and UDP), named after its node;
    stopped (by PID) when the test ends."""
    cluster = e2e.shared.cluster
    started: list[subprocess.Popen[str]] = []
    try:
        for node, agent in e2e.shared.nodes.items():
            argv = [sys.executable, "-m", "lab.harness.echo", "serve", "--name", node]
            argv += ["--tcp", str(PORT), "--udp", str(PORT), "--lifetime", str(300 * TIMEOUT_SCALE)]
            proc = cluster.spawn(agent.netns, argv)
            started.append(proc)
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready", (
                proc.stderr.read() if proc.stderr else ""
            )
        yield
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)


def host_slice(name: str, nodes: list[str], ports: list[dict[str, Any]]) -> dict[str, Any]:
    """The EndpointSlice of hostNetwork pods on `nodes`: their addresses are the nodes'."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{name}-1",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": name},
        },
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": [endpoint(NODE_IPS[n], True, None, None, n) for n in nodes],
    }


def dial(
    e2e: E2E, origin: str, node: str, mode: str, target: str, count: int, *extra: str
) -> list[Result]:
    """`count` requests from a pod (its node's client pod) or a hostNetwork client."""
    if origin == "pod":
        return e2e.from_pod(CLIENTS[node][0], mode, target, count, *extra, timeout=0.5)
    return e2e.from_host(node, mode, target, count, *extra, timeout=0.5)


@pytest.mark.pod_clients
@pytest.mark.upstream(G + "should function for service endpoints using hostNetwork")
def test_service_endpoints_using_host_network(e2e: E2E, host_servers: None) -> None:
    a = e2e.allocate("hostnet-endpoints")
    http, udp = a.node_ports[0], a.node_ports[1]
    ports = [
        {"name": "http", "protocol": "TCP", "port": 80, "targetPort": PORT, "nodePort": http},
        {"name": "udp", "protocol": "UDP", "port": 90, "targetPort": PORT, "nodePort": udp},
    ]
    slice_ports = [
        {"name": "http", "protocol": "TCP", "port": PORT},
        {"name": "udp", "protocol": "UDP", "port": PORT},
    ]
    e2e.apply(
        service(a.name, cluster_ip=a.cluster_ip, type="NodePort", ports=ports),
        host_slice(a.name, ["node1", "node2"], slice_ports),
    )
    every = set(NODE_IPS)  # each endpoint answers with its node's name
    for origin in ("pod", "node"):
        for mode, port, node_port in (("tcp", 80, http), ("udp", 90, udp)):
            for target in (f"{a.cluster_ip}:{port}", f"{NODE_IPS['node1']}:{node_port}"):

                def reached(o: str = origin, m: str = mode, t: str = target) -> bool:
                    results = dial(e2e, o, "node1", m, t, MAX_TRIES)
                    return all(r["ok"] for r in results) and {r["server"] for r in results} == every

                eventually(reached, f"{origin} -> {target} ({mode}): every endpoint")
    # Large requests through the ClusterIP (upstream: "handle large requests ... hostNetwork").
    for mode, port in (("tcp", 80), ("udp", 90)):
        target = f"{a.cluster_ip}:{port}"
        results = dial(e2e, "pod", "node1", mode, target, 5, "--size", "2000")
        assert all(r["ok"] and r.get("echoed") == 2000 for r in results), results


@pytest.mark.pod_clients
@pytest.mark.upstream(
    S + "should respect internalTrafficPolicy=Local Pod and Node, to Pod (hostNetwork: true)"
)
def test_respect_internal_traffic_policy_local_pod_and_node_to_host_network_pod(
    e2e: E2E, host_servers: None
) -> None:
    a = e2e.allocate("itp-local-hostnet")
    vip = f"{a.cluster_ip}:80"
    e2e.apply(
        service(
            a.name,
            cluster_ip=a.cluster_ip,
            internalTrafficPolicy="Local",
            ports=[{"name": "http", "protocol": "TCP", "port": 80, "targetPort": PORT}],
        ),
        host_slice(a.name, ["node1"], [{"name": "http", "protocol": "TCP", "port": PORT}]),
    )

    def node1_served(origin: str) -> bool:
        results = dial(e2e, origin, "node1", "tcp", vip, 5)
        return all(r["ok"] for r in results) and {r["server"] for r in results} == {"node1"}

    for origin in ("pod", "node"):
        eventually(lambda o=origin: node1_served(o), f"{origin} on node1 served by node1")
        failed = dial(e2e, origin, "node2", "tcp", vip, 5)
        assert not any(r["ok"] for r in failed), failed
