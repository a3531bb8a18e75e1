"""Stale UDP (issue 13): a long-lived UDP flow through a NodePort whose backend leaves
moves to a live backend at its next datagram, because the agent deletes the flow's
conntrack entry (kube-proxy deletes the kernel's). The removed pod keeps running here, so
a flow left on it would go on being answered by it: the test would see that."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from lab.harness.netns import Cgroup
from tests.kernel.conftest import wait_backends
from tests.kernel.twonode import (
    DNS,
    NODE1,
    POD_IPS,
    Env,
    pods_slice,
    two_node_cluster,
)

SERVICE = """\
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.4.1
  ports: [{name: dns, protocol: UDP, port: 53, targetPort: 5353, nodePort: 30300}]
"""
PODS = ["pod21", "pod22"]  # on node2: the flow is SNATed by node1


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    documents = {"services.yaml": SERVICE, "slices.yaml": pods_slice("dns", DNS, PODS)}
    with two_node_cluster(tmp_path_factory.mktemp("udp"), documents) as environment:
        yield environment


def hold_while_removing(
    env: Env, netns: str, target: str, frontend: str, cgroup: Cgroup | None
) -> dict[str, Any]:
    """Run a udp-hold client; once it has its first answer, remove that backend; its
    result. Restores both endpoints after."""
    argv = [sys.executable, "-m", "lab.harness.echo", "udp-hold", target]
    argv += ["--pings", "40", "--interval", "0.1", "--timeout", "0.5"]
    proc = env.cluster.spawn(netns, argv, cgroup)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())["connected"]
        assert first in PODS
        other = next(pod for pod in PODS if pod != first)
        env.write({"slices.yaml": pods_slice("dns", DNS, [other])})
        wait_backends(env.nodes["node1"].bpffs, frontend, {f"{POD_IPS[other]}:5353"})
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        env.write({"slices.yaml": pods_slice("dns", DNS, PODS)})
        wait_backends(env.nodes["node1"].bpffs, frontend, {f"{POD_IPS[pod]}:5353" for pod in PODS})
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    result.update(first=first, other=other)
    return result


def test_nodeport_udp_flow_leaves_a_removed_backend(env: Env) -> None:
    result = hold_while_removing(env, env.client, f"{NODE1}:30300", f"{NODE1}:30300/UDP", None)
    answers, first, other = result["answers"], result["first"], result["other"]
    switched = answers.index(other)  # it moved ...
    assert set(answers[:switched]) == {first}
    assert set(answers[switched:]) == {other}, answers  # ... for good, with no gap
    assert len(answers[switched:]) >= 5


def test_connected_udp_socket_of_an_in_node_client_recovers(env: Env) -> None:
    """connect() was translated once; the agent aborts the socket (SOCK_DESTROY), and the
    client's new socket is translated to the live backend."""
    node1 = env.nodes["node1"]
    result = hold_while_removing(env, node1.netns, "10.96.4.1:53", "10.96.4.1:53/UDP", node1.cgroup)
    answers, first, other = result["answers"], result["first"], result["other"]
    assert result["sockets"] == 2, answers  # one abort, one new socket
    switched = answers.index(other)
    assert set(answers[:switched]) <= {first, "ECONNABORTED", "EDESTADDRREQ"}
    assert set(answers[switched:]) == {other}, answers
    assert len(answers[switched:]) >= 5
