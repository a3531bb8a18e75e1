"""Upstream `[sig-network] Conntrack ...` (test/e2e/network/conntrack.go), ported: a client
sends one UDP datagram a second from the fixed source port 12345 (upstream's loop of
`nc -u -p 12345`: a new socket each time, the same flow), while the server pod behind the
Service is replaced; the new pod must answer within 60 s. A flow state kept for the old pod
(a stale conntrack entry, a connected socket's old translation) keeps the client on it:
here the old pod still runs and answers, so such state fails the test instead of just
delaying it. Polls end as soon as the new pod answers."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from lab.harness.agentproc import TIMEOUT_SCALE
from tests.factories import service
from tests.kernel.e2e.harness import E2E, NODE_IPS, Allocation, Result, answers, slice_for

C = "[sig-network] Conntrack "
SOURCE_PORT = 12345  # upstream's srcPort
LIMIT = 60.0  # upstream: wait.PollImmediate(..., time.Minute, logContainsFn(podBackend2))
UDP = [{"name": "udp", "protocol": "UDP", "port": 8080}]


def udp_service(a: Allocation, **spec: Any) -> dict[str, Any]:
    port: dict[str, Any] = {"name": "udp", "protocol": "UDP", "port": 80, "targetPort": 8080}
    if spec.get("type") == "NodePort":
        port["nodePort"] = a.node_ports[0]
    return service(a.name, cluster_ip=a.cluster_ip, ports=[port], **spec)


Client = Callable[[], Result]


def client_of(e2e: E2E, origin: str, target: str) -> Client:
    """One datagram from port 12345 of a pod ("client1", "client2") or a node's network
    ("node1"), on a connected socket as nc's, and its answer."""
    extra = ("--connected", "--source-port", str(SOURCE_PORT))
    if origin.startswith("node"):
        return lambda: e2e.from_host(origin, "udp", target, 1, *extra)[0]
    return lambda: e2e.from_pod(origin, "udp", target, 1, *extra)[0]


def until(client: Client, pod: str, never: Sequence[str] = ()) -> list[str]:
    """One datagram a second until `pod` answers (at most LIMIT seconds); the answers. No
    answer may come from a pod of `never`."""
    seen: list[str] = []
    deadline = time.monotonic() + LIMIT * TIMEOUT_SCALE
    while True:
        started = time.monotonic()
        (answer,) = answers([client()])
        seen.append(answer)
        assert answer not in never, seen
        if answer == pod:
            return seen
        if started > deadline:
            pytest.fail(f"{pod} not reached within {LIMIT:.0f}s: {seen[-10:]}")
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))


def cycle(
    e2e: E2E, a: Allocation, client: Client, old: str, new: str, others: Sequence[str] = ()
) -> None:
    """The server pod cycles as upstream's: `old` serves; `new` is created (both serve);
    `old` is deleted. `others`: further endpoints throughout (never reached: iTP Local)."""
    e2e.apply(slice_for(a.name, [old, *others], UDP))
    until(client, old, others)
    e2e.apply(slice_for(a.name, [old, new, *others], UDP))
    e2e.apply(slice_for(a.name, [new, *others], UDP))
    seen = until(client, new, others)
    # From the first answer of `new` on, the flow stays there: ask a few more times.
    after = [answers([client()])[0] for _ in range(3)]
    assert after == [new] * 3, (seen, after)


@pytest.mark.pod_clients
@pytest.mark.upstream(
    C + "should be able to preserve UDP traffic when server pod cycles for a NodePort service"
)
def test_preserve_udp_traffic_when_server_pod_cycles_for_a_nodeport_service(e2e: E2E) -> None:
    """A pod on node1 sends to node2's address with the nodePort; the server pods run on
    node2."""
    a = e2e.allocate("svc-udp")
    e2e.apply(udp_service(a, type="NodePort"))
    target = f"{NODE_IPS['node2']}:{a.node_ports[0]}"
    cycle(e2e, a, client_of(e2e, "client1", target), "pod21", "pod22")


@pytest.mark.pod_clients
@pytest.mark.upstream(
    C + "should be able to preserve UDP traffic when server pod cycles for a ClusterIP service"
)
def test_preserve_udp_traffic_when_server_pod_cycles_for_a_clusterip_service(e2e: E2E) -> None:
    a = e2e.allocate("svc-udp")
    e2e.apply(udp_service(a))
    cycle(e2e, a, client_of(e2e, "client1", f"{a.cluster_ip}:80"), "pod21", "pod22")


@pytest.mark.upstream(
    C + "should be able to preserve UDP traffic when server pod cycles for a ClusterIP"
    " service and client is hostNetwork"
)
def test_preserve_udp_traffic_when_server_pod_cycles_for_a_hostnetwork_client(e2e: E2E) -> None:
    a = e2e.allocate("svc-udp")
    e2e.apply(udp_service(a))
    cycle(e2e, a, client_of(e2e, "node1", f"{a.cluster_ip}:80"), "pod21", "pod22")


@pytest.mark.pod_clients
@pytest.mark.upstream(
    C + "should be able to preserve UDP traffic when server pod cycles for a ClusterIP"
    " service with InternalTrafficPolicy set to Local"
)
def test_preserve_udp_traffic_when_server_pod_cycles_with_itp_local(e2e: E2E) -> None:
    """The client's node's server pod is replaced by another on that node while an
    endpoint on the other node stays (kubernetes#126934): the client reaches the new local
    pod, never the remote one."""
    a = e2e.allocate("svc-udp")
    e2e.apply(udp_service(a, internalTrafficPolicy="Local"))
    client = client_of(e2e, "client1", f"{a.cluster_ip}:80")
    cycle(e2e, a, client, "pod11", "pod12", others=["pod21"])


@pytest.mark.pod_clients
@pytest.mark.upstream(
    C + "should be able to preserve UDP traffic when initial unready endpoints get ready"
)
def test_preserve_udp_traffic_when_initial_unready_endpoints_get_ready(e2e: E2E) -> None:
    """The only endpoint starts unready (upstream: an init container sleeping 15 s) while
    the client already sends (kubernetes#105657: state kept for the flow then must not
    outlive the endpoint's readiness); once ready, it answers within 60 s. Here the
    unready phase lasts 3 datagrams: what matters is that the flow exists before."""
    a = e2e.allocate("svc-udp")
    e2e.apply(udp_service(a), slice_for(a.name, ["pod21"], UDP, ready=False, serving=False))
    client = client_of(e2e, "client1", f"{a.cluster_ip}:80")
    for _ in range(3):
        started = time.monotonic()
        assert answers([client()]) != ["pod21"], "an unready endpoint served"
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    e2e.apply(slice_for(a.name, ["pod21"], UDP))
    until(client, "pod21")
