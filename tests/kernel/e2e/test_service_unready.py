"""Upstream `[sig-network] Services ...` (test/e2e/network/service.go) on unready,
terminating and evicted endpoints, ported. The slices carry what the EndpointSlice
controller writes: ready = publishNotReadyAddresses or the pod is ready; serving = the pod
is ready; terminating = the pod is being deleted; an evicted (Failed) pod is dropped."""

from __future__ import annotations

import time
from typing import Any

import pytest

from lab.harness.agentproc import TIMEOUT_SCALE
from tests.factories import service
from tests.kernel.e2e.harness import (
    E2E,
    NODE_IPS,
    Allocation,
    Result,
    answers,
    eventually,
    slice_for,
)

S = "[sig-network] Services "
ROUNDS, ROUND_INTERVAL = 5, 5.0  # upstream: 5 tries over 25 s


def tolerating(a: Allocation, publish: bool) -> dict[str, Any]:
    port = {
        "name": "http",
        "protocol": "TCP",
        "port": 80,
        "targetPort": 8080,
        "nodePort": a.node_ports[0],
    }
    return service(
        a.name,
        cluster_ip=a.cluster_ip,
        type="NodePort",
        ports=[port],
        publishNotReadyAddresses=publish,
    )


def every_path(e2e: E2E, a: Allocation) -> list[Result]:
    """One request from a pod on each node to the ClusterIP and to both nodes' nodePort."""
    targets = [f"{a.cluster_ip}:80", *(f"{ip}:{a.node_ports[0]}" for ip in NODE_IPS.values())]
    return [
        r
        for client in ("client1", "client2")
        for target in targets
        for r in e2e.from_pod(client, "tcp", target, 1, timeout=1.0)
    ]


def rounds(e2e: E2E, a: Allocation, check: Any, what: str) -> None:
    """Upstream's steady check: every path, ROUNDS times, ROUND_INTERVAL apart."""
    for index in range(ROUNDS):
        results = every_path(e2e, a)
        assert check(results), (what, index, answers(results))
        if index + 1 < ROUNDS:
            time.sleep(ROUND_INTERVAL)


@pytest.mark.upstream(
    S + "should be able to connect to terminating and unready endpoints if"
    " PublishNotReadyAddresses is true"
)
def test_connect_to_terminating_and_unready_endpoints_if_publish_not_ready(e2e: E2E) -> None:
    a = e2e.allocate("publish-not-ready")
    e2e.apply(tolerating(a, True), slice_for(a.name, ["pod21"], ready=True, serving=False))
    eventually(lambda: answers(every_path(e2e, a)) == ["pod21"] * 6, "unready pod served")
    # Deleted (a long grace period), still unready: the flag keeps it ready.
    e2e.apply(slice_for(a.name, ["pod21"], ready=True, serving=False, terminating=True))
    rounds(e2e, a, lambda rs: answers(rs) == ["pod21"] * 6, "terminating pod served")


@pytest.mark.upstream(
    S + "should not be able to connect to terminating and unready endpoints if"
    " PublishNotReadyAddresses is false"
)
def test_not_connect_to_terminating_and_unready_endpoints_if_not_published(e2e: E2E) -> None:
    a = e2e.allocate("no-publish-not-ready")
    e2e.apply(tolerating(a, False), slice_for(a.name, ["pod21"]))
    eventually(lambda: answers(every_path(e2e, a)) == ["pod21"] * 6, "ready pod served")
    e2e.apply(slice_for(a.name, ["pod21"], ready=False, serving=False, terminating=True))
    eventually(lambda: not any(r["ok"] for r in every_path(e2e, a)), "terminating pod left")
    rounds(e2e, a, lambda rs: not any(r["ok"] for r in rs), "terminating pod not served")


@pytest.mark.pod_clients
@pytest.mark.upstream(S + "should be rejected for evicted pods (no endpoints exist)")
def test_rejected_for_evicted_pods(e2e: E2E) -> None:
    """The only pod evicted (publishNotReadyAddresses on): the controller drops it, and
    agnhost connect --timeout=3s says REFUSED (kubernetes#109414, #109718)."""
    a = e2e.allocate("evicted-pods")
    e2e.apply(tolerating(a, True), slice_for(a.name, ["pod12"]))
    vip = f"{a.cluster_ip}:80"
    eventually(lambda: answers(e2e.from_pod("client2", "tcp", vip)) == ["pod12"], "served")
    e2e.apply(slice_for(a.name, []))
    refusal = e2e.shared.refusal
    eventually(lambda: answers(e2e.from_pod("client2", "tcp", vip)) == [refusal], "refused")
    started = time.monotonic()
    assert answers(e2e.from_pod("client2", "tcp", vip, 3, timeout=3.0)) == [refusal] * 3
    assert time.monotonic() - started < 3.0 * TIMEOUT_SCALE  # not a timeout
