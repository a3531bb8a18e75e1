"""Upstream `[sig-network] Services should work after restarting apiserver [Disruptive]`
(test/e2e/network/service.go), ported: a Service up; the API server restarted (here: the
fake API server stops serving, every watch and connection cut, and comes back on its
address with its objects, as one restarted over the same etcd); the Service still up, and
a Service created after the restart served too, from every node's network as upstream's
host-exec pod checks them."""

from __future__ import annotations

import time

import pytest

from lab.harness.nshttp import thread_in_netns
from tests.factories import service
from tests.kernel.e2e.harness import E2E, Result, eventually, slice_for

S = "[sig-network] Services "
DOWN_S = 3.0  # the API server's outage: more than one retry of the agents' watches
PODS = [["pod11", "pod21", "pod12"], ["pod13", "pod22"]]


def served_by(results: list[Result], pods: list[str]) -> bool:
    return all(r["ok"] for r in results) and {r["server"] for r in results} == set(pods)


@pytest.mark.upstream(S + "should work after restarting apiserver [Disruptive]")
def test_work_after_restarting_apiserver(e2e: E2E) -> None:
    a = e2e.allocate("service-apiserver")

    def create(i: int) -> None:
        name = f"{a.name}-{i}"
        e2e.apply(service(name, cluster_ip=a.ip(i)), slice_for(name, PODS[i]))

    def up(i: int) -> bool:
        vip = f"{a.ip(i)}:80"
        return all(
            served_by(e2e.from_host(node, "tcp", vip, 15, timeout=0.5), PODS[i])
            for node in e2e.shared.nodes
        )

    create(0)
    eventually(lambda: up(0), "service 0 up")
    api = e2e.api
    watches = api.open_watches()
    with thread_in_netns(e2e.shared.cluster.wire_ns):  # where it listens
        api.close()
        outage_started = time.monotonic()
        assert up(0), "service 0 served while the API server is down"
        time.sleep(max(0.0, DOWN_S - (time.monotonic() - outage_started)))
        api.restart_stopped()
    api.wait_for_watches(watches, timeout=30)  # every agent watches again
    assert up(0)
    create(1)
    eventually(lambda: up(1), "a Service created after the restart up")
    assert up(0)
