"""Upstream `[sig-network] Services should work after restarting apiserver [Disruptive]`
(test/e2e/network/service.go), ported: a Service up; the API server restarted (here: the
fake API server stops serving, every watch and connection cut, and comes back on its
address with its objects, as one restarted over the same etcd); the Service still up, and
a Service created after the restart served too, from every node's network as upstream's
host-exec pod checks them."""

from __future__ import annotations

import time

import pytest

from lab.harness.agentproc import TIMEOUT_SCALE
from lab.harness.nshttp import thread_in_netns
from tests.factories import service
from tests.kernel.e2e.harness import E2E, answers, eventually, slice_for

S = "[sig-network] Services "
DOWN_S = 3.0  # the API server's outage: more than one retry of the agents' watches
# Each request's limit: the Service staying up is the point, not its latency, and under
# emulation the agents relisting after the restart hold the guest's one host thread.
REQUEST_TIMEOUT_S = 0.5 * TIMEOUT_SCALE
PODS = [["pod11", "pod21", "pod12"], ["pod13", "pod22"]]


@pytest.mark.upstream(S + "should work after restarting apiserver [Disruptive]")
def test_work_after_restarting_apiserver(e2e: E2E) -> None:
    a = e2e.allocate("service-apiserver")

    def create(i: int) -> None:
        name = f"{a.name}-{i}"
        e2e.apply(service(name, cluster_ip=a.ip(i)), slice_for(name, PODS[i]))

    def answered(i: int) -> dict[str, list[str]]:
        vip = f"{a.ip(i)}:80"
        return {
            node: answers(e2e.from_host(node, "tcp", vip, 15, timeout=REQUEST_TIMEOUT_S))
            for node in e2e.shared.nodes
        }

    def up(i: int) -> bool:
        return all(set(got) == set(PODS[i]) for got in answered(i).values())

    def assert_up(i: int, when: str) -> None:
        got = answered(i)
        assert all(set(g) == set(PODS[i]) for g in got.values()), (when, got)

    create(0)
    eventually(lambda: up(0), "service 0 up")
    api = e2e.api
    watches = api.open_watches()
    with thread_in_netns(e2e.shared.cluster.wire_ns):  # where it listens
        api.close()
        outage_started = time.monotonic()
        assert_up(0, "while the API server is down")
        time.sleep(max(0.0, DOWN_S - (time.monotonic() - outage_started)))
        api.restart_stopped()
    api.wait_for_watches(watches, timeout=30 * TIMEOUT_SCALE)  # every agent watches again
    assert_up(0, "after the restart")
    create(1)
    eventually(lambda: up(1), "a Service created after the restart up")
    assert_up(0, "with the new Service")
