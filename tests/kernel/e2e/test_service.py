"""Upstream `[sig-network] Services ...` beyond conformance (test/e2e/network/service.go),
ported: ports added and deleted, the source pod IP, services up and down and recreated,
REJECT without endpoints, unready endpoints, the service-proxy-name and headless labels,
internalTrafficPolicy=Local and the terminating-endpoint fallbacks. The EndpointSlices
carry the conditions the EndpointSlice controller writes for the pods upstream creates
(ready = publishNotReadyAddresses or the pod is ready; serving = the pod is ready;
terminating = the pod is being deleted)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from lab.harness.agentproc import TIMEOUT_SCALE
from tests.factories import service
from tests.kernel.e2e.harness import (
    CLIENT_IPS,
    E2E,
    NODE_IPS,
    POD_IPS,
    POD_NODE,
    SOCKET_LB,
    Result,
    answers,
    eventually,
    slice_for,
    wait_flagged,
)

S = "[sig-network] Services "
HTTP = {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}


def only(expected: str, results: list[Result]) -> bool:
    return answers(results) == [expected] * len(results)


def failing(results: list[Result]) -> bool:
    return not any(r["ok"] for r in results)


def pod(e2e: E2E, client: str, target: str, count: int = 5) -> list[Result]:
    return e2e.from_pod(client, "tcp", target, count, timeout=0.5)


def host(e2e: E2E, node: str, target: str, count: int = 5) -> list[Result]:
    return e2e.from_host(node, "tcp", target, count, timeout=0.5)


@pytest.mark.pod_clients
@pytest.mark.upstream(S + "should be updated after adding or deleting ports")
def test_updated_after_adding_or_deleting_ports(e2e: E2E) -> None:
    a = e2e.allocate("edit-port-test")
    port1 = {"name": "portname1", "protocol": "TCP", "port": 80, "targetPort": "svc1"}
    port2 = {"name": "portname2", "protocol": "TCP", "port": 81, "targetPort": "svc2"}
    one, two = f"{a.cluster_ip}:80", f"{a.cluster_ip}:81"
    e2e.apply(
        service(a.name, cluster_ip=a.cluster_ip, ports=[port1]),
        slice_for(a.name, ["pod11"], [{"name": "portname1", "protocol": "TCP", "port": 8080}]),
    )
    eventually(lambda: only("pod11", pod(e2e, "client1", one)), "port 80 -> pod1")
    # Port 81 added, served by a second pod (a slice of its own: another port set).
    e2e.apply(
        service(a.name, cluster_ip=a.cluster_ip, ports=[port1, port2]),
        slice_for(
            a.name,
            ["pod21"],
            [{"name": "portname2", "protocol": "TCP", "port": 8081}],
            suffix="2",
        ),
    )
    eventually(lambda: only("pod21", pod(e2e, "client1", two)), "port 81 -> pod2")
    assert only("pod11", pod(e2e, "client1", one))
    # Port 81 deleted (and its endpoints with it): it stops forwarding to pod2.
    e2e.apply(service(a.name, cluster_ip=a.cluster_ip, ports=[port1]))
    e2e.delete("EndpointSlice", f"{a.name}-2")
    eventually(lambda: failing(pod(e2e, "client1", two, 2)), "port 81 gone")
    assert only("pod11", pod(e2e, "client1", one))


@pytest.mark.pod_clients
@pytest.mark.upstream(
    S + "should preserve source pod IP for traffic thru service cluster IP [LinuxOnly]"
)
def test_preserve_source_pod_ip_for_traffic_thru_service_cluster_ip(e2e: E2E) -> None:
    """The server sees the client pod's own address, from the same node and another."""
    a = e2e.allocate("sourceip-test")
    vip = f"{a.cluster_ip}:80"
    e2e.apply(service(a.name, cluster_ip=a.cluster_ip), slice_for(a.name, ["pod11"]))
    for client in ("client1", "client2"):  # same node as pod11, the other node
        eventually(lambda c=client: only("pod11", pod(e2e, c, vip, 1)), f"{client} served")
        results = pod(e2e, client, vip, 3)
        assert {str(r["seen_as"]).rsplit(":", 1)[0] for r in results} == {CLIENT_IPS[client]}


@pytest.mark.pod_clients
@pytest.mark.upstream(S + "should allow pods to hairpin back to themselves through services")
def test_allow_pods_to_hairpin_back_to_themselves_through_services(e2e: E2E) -> None:
    """The only endpoint's own pod dials its Service and reaches itself. Socket-LB
    translates at connect(): the connection goes to the pod's own address, from it. The
    per-packet path SNATs it to the node's address (kube-proxy's masquerade), which the
    pod sees as the source: otherwise it would answer itself and the client drop that."""
    a = e2e.allocate("hairpin-test")
    vip = f"{a.cluster_ip}:8080"
    e2e.apply(
        service(a.name, cluster_ip=a.cluster_ip, ports=[{**HTTP, "port": 8080}]),
        slice_for(a.name, ["pod12"]),
    )
    eventually(lambda: only("pod12", pod(e2e, "pod12", vip)), "hairpin")
    source = POD_IPS["pod12"] if e2e.path == SOCKET_LB else NODE_IPS[POD_NODE["pod12"]]
    results = pod(e2e, "pod12", vip, 3)
    assert {str(r["seen_as"]).rsplit(":", 1)[0] for r in results} == {source}, results


@pytest.mark.pod_clients
@pytest.mark.upstream(S + "should be able to up and down services")
def test_up_and_down_services(e2e: E2E) -> None:
    """Three Services of two pods each; one deleted: only its ClusterIP stops, the others
    stay up; checked from a hostNetwork client and from a pod."""
    a = e2e.allocate("up-down")
    names = [f"{a.name}-{i}" for i in (1, 2, 3)]
    vips = [f"{a.ip(i)}:80" for i in (0, 1, 2)]
    pods = [["pod11", "pod21"], ["pod12", "pod22"], ["pod13", "pod21"]]

    def up(index: int) -> bool:
        want = set(pods[index])
        results = [*host(e2e, "node1", vips[index], 12), *pod(e2e, "client2", vips[index], 12)]
        return all(r["ok"] for r in results) and {r["server"] for r in results} == want

    for i in (0, 1):
        e2e.apply(service(names[i], cluster_ip=a.ip(i)), slice_for(names[i], pods[i]))
        eventually(lambda i=i: up(i), f"{names[i]} up")
    e2e.delete("Service", names[0])
    e2e.delete("EndpointSlice", f"{names[0]}-1")
    down = f"{names[0]} down"
    eventually(
        lambda: failing([*host(e2e, "node1", vips[0], 2), *pod(e2e, "client2", vips[0], 2)]), down
    )
    assert up(1)
    e2e.apply(service(names[2], cluster_ip=a.ip(2)), slice_for(names[2], pods[2]))
    eventually(lambda: up(2), f"{names[2]} up")
    assert up(1)


@pytest.mark.pod_clients
@pytest.mark.upstream(S + "should work after the service has been recreated")
def test_work_after_the_service_has_been_recreated(e2e: E2E) -> None:
    """Deleted and created again under the same name with a new ClusterIP: the new one
    works, the old one stays down (no stale state)."""
    a = e2e.allocate("service-recreate")
    old, new = f"{a.ip(0)}:80", f"{a.ip(1)}:80"
    e2e.apply(service(a.name, cluster_ip=a.ip(0)), slice_for(a.name, ["pod12"]))
    eventually(lambda: only("pod12", pod(e2e, "client1", old)), "created")
    e2e.delete("Service", a.name)
    eventually(lambda: failing(pod(e2e, "client1", old, 2)), "deleted")
    e2e.apply(service(a.name, cluster_ip=a.ip(1)))
    eventually(lambda: only("pod12", pod(e2e, "client1", new)), "recreated")
    assert failing(pod(e2e, "client1", old, 2))


@pytest.mark.pod_clients
@pytest.mark.upstream(S + "should be rejected when no endpoints exist")
def test_rejected_when_no_endpoints_exist(e2e: E2E) -> None:
    """agnhost connect --timeout=3s must say REFUSED: the connection is rejected at once,
    not left to time out; from a pod on either node, TCP and UDP."""
    a = e2e.allocate("no-pods")
    e2e.apply(service(a.name, cluster_ip=a.cluster_ip, ports=[HTTP]), slice_for(a.name, []))
    vip = f"{a.cluster_ip}:80"
    refusal = e2e.shared.refusal
    for client in ("client1", "client2"):
        eventually(lambda c=client: answers(pod(e2e, c, vip, 1)) == [refusal], "refused")
        started = time.monotonic()
        results = e2e.from_pod(client, "tcp", vip, 3, timeout=3.0)
        assert answers(results) == [refusal] * 3
        assert time.monotonic() - started < 3.0 * TIMEOUT_SCALE  # not a timeout


@pytest.mark.pod_clients
@pytest.mark.upstream(S + "should create endpoints for unready pods")
def test_create_endpoints_for_unready_pods(e2e: E2E) -> None:
    """publishNotReadyAddresses: an unready pod is served; the pod terminating and the
    flag off: not served; the flag back on: the terminating pod is served again."""
    a = e2e.allocate("tolerate-unready")
    vip = f"{a.cluster_ip}:80"

    def tolerating(on: bool) -> dict[str, Any]:
        return service(a.name, cluster_ip=a.cluster_ip, publishNotReadyAddresses=on)

    # Unready pod, the flag on: ready (the flag), not serving (the pod), not terminating.
    e2e.apply(tolerating(True), slice_for(a.name, ["pod21"], ready=True, serving=False))
    eventually(lambda: only("pod21", pod(e2e, "client1", vip)), "unready pod served")
    # The pod is deleted (a long grace period) and the flag turned off.
    e2e.apply(
        tolerating(False),
        slice_for(a.name, ["pod21"], ready=False, serving=False, terminating=True),
    )
    eventually(lambda: failing(pod(e2e, "client1", vip, 2)), "terminating pod not served")
    e2e.apply(
        tolerating(True),
        slice_for(a.name, ["pod21"], ready=True, serving=False, terminating=True),
    )
    eventually(lambda: only("pod21", pod(e2e, "client1", vip)), "terminating pod served")


def labelled_toggle(e2e: E2E, label: str, value: str) -> None:
    """Upstream's pattern for both labels: two Services; the labelled one is never served
    while the other is; the label removed: served; added again: no longer served."""
    a = e2e.allocate("label")
    labelled, control = f"{a.name}-toggled", f"{a.name}-control"
    vip, control_vip = f"{a.ip(0)}:80", f"{a.ip(1)}:80"

    def svc(labels: dict[str, str]) -> dict[str, Any]:
        obj = service(labelled, cluster_ip=a.ip(0))
        obj["metadata"]["labels"] = labels
        return obj

    e2e.apply(
        svc({label: value}),
        slice_for(labelled, ["pod11", "pod21"]),
        service(control, cluster_ip=a.ip(1)),
        slice_for(control, ["pod12"]),
    )
    eventually(lambda: only("pod12", pod(e2e, "client1", control_vip)), "control served")
    assert failing(pod(e2e, "client1", vip, 2)), "a labelled Service was served"
    e2e.apply(svc({}))
    eventually(lambda: all(r["ok"] for r in pod(e2e, "client1", vip)), "label off: served")
    e2e.apply(svc({label: value}))
    eventually(lambda: failing(pod(e2e, "client1", vip, 2)), "label on: not served")
    assert only("pod12", pod(e2e, "client1", control_vip))


@pytest.mark.pod_clients
@pytest.mark.upstream(S + "should implement service.kubernetes.io/service-proxy-name")
def test_implement_service_proxy_name(e2e: E2E) -> None:
    labelled_toggle(e2e, "service.kubernetes.io/service-proxy-name", "foo-bar")


@pytest.mark.pod_clients
@pytest.mark.upstream(S + "should implement service.kubernetes.io/headless")
def test_implement_service_headless(e2e: E2E) -> None:
    labelled_toggle(e2e, "service.kubernetes.io/headless", "")


ITP_POD = S + "should respect internalTrafficPolicy=Local Pod to Pod"
ITP_HOST = S + "should respect internalTrafficPolicy=Local Pod (hostNetwork: true) to Pod"


def itp_local(e2e: E2E, network: str) -> None:
    """The endpoint on node1: a client there reaches it; one on node2 fails every time."""
    a = e2e.allocate("itp-local")
    vip = f"{a.cluster_ip}:80"
    e2e.apply(
        service(a.name, cluster_ip=a.cluster_ip, internalTrafficPolicy="Local"),
        slice_for(a.name, ["pod11"]),
    )

    def client(node: str, count: int = 5) -> list[Result]:
        if network == "host":
            return host(e2e, node, vip, count)
        return pod(e2e, "client1" if node == "node1" else "client2", vip, count)

    eventually(lambda: only("pod11", client("node1")), "same-node client served")
    assert failing(client("node2"))


@pytest.mark.pod_clients
@pytest.mark.upstream(ITP_POD)
def test_respect_internal_traffic_policy_local_pod_to_pod(e2e: E2E) -> None:
    itp_local(e2e, "pod")


@pytest.mark.upstream(ITP_HOST)
def test_respect_internal_traffic_policy_local_host_to_pod(e2e: E2E) -> None:
    itp_local(e2e, "host")


def terminating_only(a: Any, pods: list[str]) -> dict[str, Any]:
    """The slice of a Service whose only pods were deleted (grace period still running):
    not ready, still serving, terminating."""
    return slice_for(a.name, pods, ready=False, serving=True, terminating=True)


@pytest.mark.pod_clients
@pytest.mark.upstream(
    S + "should fallback to terminating endpoints when there are no ready endpoints with"
    " internalTrafficPolicy=Cluster"
)
def test_fallback_to_terminating_endpoints_internal_cluster(e2e: E2E) -> None:
    a = e2e.allocate("itp-cluster-fallback")
    vip = f"{a.cluster_ip}:80"
    e2e.apply(service(a.name, cluster_ip=a.cluster_ip), slice_for(a.name, ["pod11"]))
    eventually(lambda: only("pod11", pod(e2e, "client2", vip)), "served")
    e2e.apply(terminating_only(a, ["pod11"]))
    wait_flagged(e2e, f"{vip}/TCP", "terminating", ["node1", "node2"])
    for client in ("client1", "client2"):
        assert only("pod11", pod(e2e, client, vip)), client


@pytest.mark.pod_clients
@pytest.mark.upstream(
    S + "should fallback to local terminating endpoints when there are no ready endpoints"
    " with internalTrafficPolicy=Local"
)
def test_fallback_to_local_terminating_endpoints_internal_local(e2e: E2E) -> None:
    a = e2e.allocate("itp-local-fallback")
    vip = f"{a.cluster_ip}:80"
    e2e.apply(
        service(a.name, cluster_ip=a.cluster_ip, internalTrafficPolicy="Local"),
        slice_for(a.name, ["pod11"]),
    )
    eventually(lambda: only("pod11", pod(e2e, "client1", vip)), "served")
    e2e.apply(terminating_only(a, ["pod11"]))
    wait_flagged(e2e, f"{vip}/TCP", "terminating", ["node1"])  # node2: no local one
    assert only("pod11", pod(e2e, "client1", vip))
    assert failing(pod(e2e, "client2", vip))


def nodeport(a: Any, **spec: Any) -> dict[str, Any]:
    return service(
        a.name,
        cluster_ip=a.cluster_ip,
        type="NodePort",
        ports=[{**HTTP, "nodePort": a.node_ports[0]}],
        **spec,
    )


@pytest.mark.pod_clients
@pytest.mark.upstream(
    S + "should fallback to terminating endpoints when there are no ready endpoints with"
    " externallTrafficPolicy=Cluster"
)
def test_fallback_to_terminating_endpoints_external_cluster(e2e: E2E) -> None:
    """Pods on both nodes reach the terminating pod through node1's nodePort."""
    a = e2e.allocate("etp-cluster-fallback")
    target = f"{NODE_IPS['node1']}:{a.node_ports[0]}"
    e2e.apply(nodeport(a), slice_for(a.name, ["pod11"]))
    eventually(lambda: only("pod11", pod(e2e, "client2", target)), "served")
    e2e.apply(terminating_only(a, ["pod11"]))
    wait_flagged(e2e, f"{a.cluster_ip}:80/TCP", "terminating", ["node1", "node2"])
    for client in ("client1", "client2"):
        assert only("pod11", pod(e2e, client, target)), client


@pytest.mark.pod_clients
@pytest.mark.upstream(
    S + "should fallback to local terminating endpoints when there are no ready endpoints"
    " with externalTrafficPolicy=Local"
)
def test_fallback_to_local_terminating_endpoints_external_local(e2e: E2E) -> None:
    """The terminating pod on node1: a pod on node1 -> node2's nodePort fails (no local
    endpoint there); pods on both nodes -> node1's nodePort reach it. (A pod -> its own
    node's nodePort is deliberately untested upstream: kubernetes PR #123622.)"""
    a = e2e.allocate("etp-local-fallback")
    node1, node2 = (f"{NODE_IPS[n]}:{a.node_ports[0]}" for n in ("node1", "node2"))
    e2e.apply(nodeport(a, externalTrafficPolicy="Local"), slice_for(a.name, ["pod11"]))
    eventually(lambda: only("pod11", pod(e2e, "client2", node1)), "served")
    e2e.apply(terminating_only(a, ["pod11"]))
    wait_flagged(e2e, f"{a.cluster_ip}:80/TCP", "terminating", ["node1", "node2"])
    assert failing(pod(e2e, "client1", node2, 3))
    for client in ("client1", "client2"):
        assert only("pod11", pod(e2e, client, node1)), client
