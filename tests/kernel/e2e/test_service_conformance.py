"""Upstream `[sig-network] Services ... [Conformance]` (test/e2e/network/service.go),
ported: the same steps, limits and expected outcomes, on the shared two-node cluster with
the Services and EndpointSlices written through the API while both agents run."""

from __future__ import annotations

from typing import Any

import pytest

from tests.factories import service
from tests.kernel.e2e.harness import (
    E2E,
    NODE_IPS,
    Result,
    answers,
    errors,
    eventually,
    slice_for,
)

S = "[sig-network] Services "
AFFINITY_CONFIRM_COUNT = 15  # upstream's AffinityConfirmCount
TCP = {"name": "tcp-port", "protocol": "TCP", "port": 8080}
UDP = {"name": "udp-port", "protocol": "UDP", "port": 8080}


def all_ok_and(expected: set[str], results: list[Result]) -> bool:
    return all(r["ok"] for r in results) and {r["server"] for r in results} == expected


def reach(e2e: E2E, client: Any, target: str, expected: set[str], count: int = 20) -> None:
    """Until `count` requests of `client(target, count)` all succeed and exactly
    `expected` answered them (a change reaches the agents asynchronously)."""
    eventually(lambda: all_ok_and(expected, client(target, count)), f"{target} -> {expected}")


def refused(e2e: E2E, target: str, client: str = "client1") -> None:
    eventually(
        lambda: errors(e2e.from_pod(client, "tcp", target, 2)) == {e2e.shared.refusal},
        f"{target} refused",
    )


@pytest.mark.pod_clients
@pytest.mark.upstream(S + "should serve a basic endpoint from pods [Conformance]")
def test_serve_a_basic_endpoint_from_pods(e2e: E2E) -> None:
    """Endpoints 0 -> 1 -> 2 -> 1 -> 0 pods; the ClusterIP follows every state (none:
    refused)."""
    a = e2e.allocate("endpoint-test2")
    vip = f"{a.cluster_ip}:80"
    e2e.apply(service(a.name, cluster_ip=a.cluster_ip), slice_for(a.name, []))
    refused(e2e, vip)
    for pods in (["pod11"], ["pod11", "pod21"], ["pod21"]):
        e2e.apply(slice_for(a.name, pods))
        reach(e2e, lambda t, n: e2e.from_pod("client1", "tcp", t, n), vip, set(pods))
    e2e.apply(slice_for(a.name, []))
    refused(e2e, vip)


@pytest.mark.pod_clients
@pytest.mark.upstream(S + "should serve multiport endpoints from pods [Conformance]")
def test_serve_multiport_endpoints_from_pods(e2e: E2E) -> None:
    """Two ports to named target ports (80 -> svc1, 81 -> svc2), each pod serving one of
    them: the controller writes one slice per port set, so each port reaches only its pod."""
    a = e2e.allocate("multi-endpoint-test")
    ports = [
        {"name": "portname1", "protocol": "TCP", "port": 80, "targetPort": "svc1"},
        {"name": "portname2", "protocol": "TCP", "port": 81, "targetPort": "svc2"},
    ]
    port1 = [{"name": "portname1", "protocol": "TCP", "port": 8080}]
    port2 = [{"name": "portname2", "protocol": "TCP", "port": 8081}]
    e2e.apply(service(a.name, cluster_ip=a.cluster_ip, ports=ports))
    one, two = f"{a.cluster_ip}:80", f"{a.cluster_ip}:81"

    def client(t: str, n: int) -> list[Result]:
        return e2e.from_pod("client1", "tcp", t, n)

    e2e.apply(slice_for(a.name, ["pod11"], port1, suffix="a"))
    reach(e2e, client, one, {"pod11"})
    e2e.apply(slice_for(a.name, ["pod21"], port2, suffix="b"))
    reach(e2e, client, one, {"pod11"})
    reach(e2e, client, two, {"pod21"})
    e2e.delete("EndpointSlice", f"{a.name}-a")
    refused(e2e, one)
    reach(e2e, client, two, {"pod21"})
    e2e.delete("EndpointSlice", f"{a.name}-b")
    refused(e2e, two)


@pytest.mark.pod_clients
@pytest.mark.upstream(
    S + "should serve endpoints on same port and different protocols [Conformance]"
)
def test_serve_endpoints_on_same_port_and_different_protocols(e2e: E2E) -> None:
    """80/TCP and 80/UDP of one Service to one pod; the UDP port removed: UDP fails within
    30 s while TCP still works; then the reverse."""
    a = e2e.allocate("multiprotocol-test")
    tcp = {"name": "tcp-port", "protocol": "TCP", "port": 80, "targetPort": 8080}
    udp = {"name": "udp-port", "protocol": "UDP", "port": 80, "targetPort": 8080}
    vip = f"{a.cluster_ip}:80"
    e2e.apply(
        service(a.name, cluster_ip=a.cluster_ip, ports=[tcp, udp]),
        slice_for(a.name, ["pod21"], [TCP, UDP]),
    )

    def works(mode: str) -> bool:
        return answers(e2e.from_pod("client1", mode, vip, 2, timeout=0.5)) == ["pod21"] * 2

    eventually(lambda: works("tcp") and works("udp"), "both protocols served")
    for removed, kept in ((udp, tcp), (tcp, udp)):
        e2e.apply(service(a.name, cluster_ip=a.cluster_ip, ports=[kept]))
        eventually(lambda r=removed: not works(r["protocol"].lower()), f"{removed} gone", 30)
        assert works(kept["protocol"].lower()), f"{kept} broke when {removed} was removed"
        e2e.apply(service(a.name, cluster_ip=a.cluster_ip, ports=[tcp, udp]))
        eventually(lambda: works("tcp") and works("udp"), "both protocols back", 30)


@pytest.mark.pod_clients
@pytest.mark.upstream(S + "should be able to create a functioning NodePort service [Conformance]")
def test_create_a_functioning_nodeport_service(e2e: E2E) -> None:
    """A NodePort Service with two pods (one per node): its ClusterIP and every node's
    address with the nodePort reach both, from a pod and from outside."""
    a = e2e.allocate("nodeport-test")
    port = {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}
    e2e.apply(
        service(
            a.name,
            cluster_ip=a.cluster_ip,
            type="NodePort",
            ports=[{**port, "nodePort": a.node_ports[0]}],
        ),
        slice_for(a.name, ["pod11", "pod21"]),
    )
    both = {"pod11", "pod21"}
    targets = [f"{a.cluster_ip}:80", *(f"{ip}:{a.node_ports[0]}" for ip in NODE_IPS.values())]
    for target in targets:
        reach(e2e, lambda t, n: e2e.from_pod("client1", "tcp", t, n), target, both)
    for target in targets[1:]:
        reach(e2e, lambda t, n: e2e.from_outside("tcp", t, n), target, both)


def external_name(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "ExternalName", "externalName": "foo.example.com"},
    }


def nodeport_service(e2e: E2E, name: str, cluster_ip: str, node_port: int) -> dict[str, Any]:
    port = {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}
    return service(
        name, cluster_ip=cluster_ip, type="NodePort", ports=[{**port, "nodePort": node_port}]
    )


def frontend_ports(e2e: E2E, node: str) -> set[int]:
    """The ports of every frontend node `node`'s maps hold."""
    return {
        int(s["frontend"].split("/")[0].rsplit(":", 1)[1])
        for s in e2e.shared.nodes[node].dump()["services"]
    }


@pytest.mark.pod_clients
@pytest.mark.upstream(
    S + "should be able to change the type from ExternalName to ClusterIP [Conformance]"
)
def test_change_the_type_from_externalname_to_clusterip(e2e: E2E) -> None:
    a = e2e.allocate("externalname-service")
    e2e.apply(external_name(a.name), slice_for(a.name, ["pod11", "pod21"]))
    e2e.apply(service(a.name, cluster_ip=a.cluster_ip))
    reach(
        e2e,
        lambda t, n: e2e.from_pod("client2", "tcp", t, n),
        f"{a.cluster_ip}:80",
        {"pod11", "pod21"},
    )


@pytest.mark.pod_clients
@pytest.mark.upstream(
    S + "should be able to change the type from ExternalName to NodePort [Conformance]"
)
def test_change_the_type_from_externalname_to_nodeport(e2e: E2E) -> None:
    a = e2e.allocate("externalname-service")
    e2e.apply(external_name(a.name), slice_for(a.name, ["pod11", "pod21"]))
    e2e.apply(nodeport_service(e2e, a.name, a.cluster_ip, a.node_ports[0]))
    both = {"pod11", "pod21"}
    reach(e2e, lambda t, n: e2e.from_pod("client2", "tcp", t, n), f"{a.cluster_ip}:80", both)
    for ip in NODE_IPS.values():
        reach(e2e, lambda t, n: e2e.from_outside("tcp", t, n), f"{ip}:{a.node_ports[0]}", both)


@pytest.mark.pod_clients
@pytest.mark.upstream(
    S + "should be able to change the type from ClusterIP to ExternalName [Conformance]"
)
def test_change_the_type_from_clusterip_to_externalname(e2e: E2E) -> None:
    """Upstream checks the name then resolves as a CNAME (DNS's part); the proxy's part:
    the ClusterIP stops answering and leaves both nodes' maps."""
    a = e2e.allocate("clusterip-service")
    vip = f"{a.cluster_ip}:80"
    e2e.apply(service(a.name, cluster_ip=a.cluster_ip), slice_for(a.name, ["pod11", "pod21"]))
    reach(e2e, lambda t, n: e2e.from_pod("client1", "tcp", t, n), vip, {"pod11", "pod21"})
    e2e.apply(external_name(a.name))
    eventually(lambda: not any(r["ok"] for r in e2e.from_pod("client1", "tcp", vip, 2)), "VIP gone")
    for node in e2e.shared.nodes:
        frontends = {s["frontend"] for s in e2e.shared.nodes[node].dump()["services"]}
        assert not any(f.startswith(f"{a.cluster_ip}:") for f in frontends), node


@pytest.mark.upstream(
    S + "should be able to change the type from NodePort to ExternalName [Conformance]"
)
def test_change_the_type_from_nodeport_to_externalname(e2e: E2E) -> None:
    """The nodePort is released: it stops answering on every node and leaves every node's
    maps (ebpflb holds no listening socket on a nodePort, so nothing else holds it)."""
    a = e2e.allocate("nodeport-service")
    node_port = a.node_ports[0]
    e2e.apply(
        nodeport_service(e2e, a.name, a.cluster_ip, node_port),
        slice_for(a.name, ["pod11", "pod21"]),
    )
    targets = [f"{ip}:{node_port}" for ip in NODE_IPS.values()]
    for target in targets:
        reach(e2e, lambda t, n: e2e.from_outside("tcp", t, n), target, {"pod11", "pod21"})
    e2e.apply(external_name(a.name))
    for target in targets:
        eventually(
            lambda t=target: not any(r["ok"] for r in e2e.from_outside("tcp", t, 2, timeout=0.5)),
            f"{target} released",
        )
    for node in e2e.shared.nodes:
        assert node_port not in frontend_ports(e2e, node), node


def sticky(results: list[Result]) -> bool:
    """Upstream's checkAffinity(..., true): every one of the consecutive requests answered
    by the same pod."""
    return all(r["ok"] for r in results) and len({r["server"] for r in results}) == 1


def spread(results: list[Result]) -> bool:
    """checkAffinity(..., false): more than one pod answered."""
    return all(r["ok"] for r in results) and len({r["server"] for r in results}) > 1


def affinity_service(a: Any, affinity: str, node_port: bool) -> dict[str, Any]:
    port: dict[str, Any] = {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}
    extra: dict[str, Any] = {"sessionAffinity": affinity}
    if node_port:
        port["nodePort"] = a.node_ports[0]
        extra["type"] = "NodePort"
    return service(a.name, cluster_ip=a.cluster_ip, ports=[port], **extra)


AFFINITY_WORK = (
    "should have session affinity work for service with type clusterIP [LinuxOnly] [Conformance]",
    "should have session affinity work for NodePort service [LinuxOnly] [Conformance]",
)
AFFINITY_SWITCH = (
    "should be able to switch session affinity for service with type clusterIP [LinuxOnly]"
    " [Conformance]",
    "should be able to switch session affinity for NodePort service [LinuxOnly] [Conformance]",
)
THREE = ["pod11", "pod12", "pod21"]  # upstream's affinity Services have 3 replicas


def affinity_clients(e2e: E2E, a: Any, node_port: bool) -> list[tuple[str, Any]]:
    """(target, client) pairs upstream's affinity tests use: the ClusterIP from a pod, or a
    node's address with the nodePort from a pod (and, here, from outside as well)."""
    if not node_port:
        target = f"{a.cluster_ip}:80"
        return [(target, lambda n: e2e.from_pod("client1", "tcp", target, n))]
    pairs = []
    for ip in NODE_IPS.values():
        target = f"{ip}:{a.node_ports[0]}"
        pairs.append((target, lambda n, t=target: e2e.from_pod("client1", "tcp", t, n)))
        pairs.append((target, lambda n, t=target: e2e.from_outside("tcp", t, n)))
    return pairs


@pytest.mark.pod_clients
@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("clusterIP", marks=pytest.mark.upstream(S + AFFINITY_WORK[0])),
        pytest.param("NodePort", marks=pytest.mark.upstream(S + AFFINITY_WORK[1])),
    ],
)
def test_session_affinity_work(e2e: E2E, kind: str) -> None:
    node_port = kind == "NodePort"
    a = e2e.allocate("affinity")
    e2e.apply(affinity_service(a, "ClientIP", node_port), slice_for(a.name, THREE))
    for target, client in affinity_clients(e2e, a, node_port):
        eventually(lambda c=client: sticky(c(AFFINITY_CONFIRM_COUNT)), f"{target} sticky")


@pytest.mark.pod_clients
@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("clusterIP", marks=pytest.mark.upstream(S + AFFINITY_SWITCH[0])),
        pytest.param("NodePort", marks=pytest.mark.upstream(S + AFFINITY_SWITCH[1])),
    ],
)
def test_switch_session_affinity(e2e: E2E, kind: str) -> None:
    """ClientIP (sticky) -> None (spread over the pods) -> ClientIP (sticky again), at
    runtime, without a restart."""
    node_port = kind == "NodePort"
    a = e2e.allocate("affinity-transition")
    e2e.apply(affinity_service(a, "ClientIP", node_port), slice_for(a.name, THREE))
    pairs = affinity_clients(e2e, a, node_port)
    for affinity, check in (("ClientIP", sticky), ("None", spread), ("ClientIP", sticky)):
        e2e.apply(affinity_service(a, affinity, node_port))
        for target, client in pairs:
            eventually(
                lambda c=client, k=check: k(c(AFFINITY_CONFIRM_COUNT)), f"{target} {affinity}"
            )
