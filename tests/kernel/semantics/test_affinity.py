"""sessionAffinity: ClientIP on two real nodes (issue 13): socket-LB keys the client by its
network namespace, the NodePort path by its source address; a backend leaving, a new
timeout and switching affinity off take effect for the next connection."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from ebpflb.datapath.maps.kernel import KernelMapSet
from tests.kernel.conftest import wait_backends, wait_until
from tests.kernel.twonode import (
    NODE1,
    POD_IPS,
    Env,
    pods_slice,
    servers,
    two_node_cluster,
)

ALL = ["pod11", "pod12", "pod21", "pod22"]
PORTS = "[{name: http, protocol: TCP, port: 8080}, {name: dns, protocol: UDP, port: 5353}]"


def service(affinity: str = "ClientIP", timeout: int = 3600) -> str:
    return f"""\
apiVersion: v1
kind: Service
metadata: {{name: sticky, namespace: default}}
spec:
  type: NodePort
  clusterIP: 10.96.3.1
  sessionAffinity: {affinity}
  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {timeout}}}}}
  ports:
    - {{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30200}}
    - {{name: dns, protocol: UDP, port: 53, targetPort: 5353, nodePort: 30201}}
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    documents = {"services.yaml": service(), "slices.yaml": pods_slice("sticky", PORTS, ALL)}
    with two_node_cluster(tmp_path_factory.mktemp("affinity"), documents) as environment:
        yield environment


def wait_matches(env: Env, want: Callable[[dict[int, int]], bool], what: str) -> None:
    """Until node1's ebpflb_affpair4 (backend id -> timeout) satisfies `want`."""
    with KernelMapSet(env.nodes["node1"].bpffs) as maps:
        wait_until(
            lambda: want({key.backend_id: t for key, t in maps.affinity_match.items()}), what
        )


def test_in_node_clients_keep_their_backend(env: Env) -> None:
    assert len(servers(env.requests("node1", "tcp", "10.96.3.1:80", 20))) == 1
    # Datagrams of new UDP sockets (sendmsg), each a flow of its own: one backend too
    # (affinity is per service port, as kube-proxy's).
    assert len(servers(env.requests("node1", "udp", "10.96.3.1:53", 10))) == 1
    # Each pod (network namespace) is a client of its own.
    for pod in ("pod11", "pod12"):
        netns = env.cluster.nodes["node1"].pods[pod].netns
        assert len(servers(env.requests("node1", "tcp", "10.96.3.1:80", 10, netns=netns))) == 1
    assert (
        env.nodes["node1"].counter("affinity_hit") == 19 + 9 + 9 + 9
    )  # every connection but the first of each client


def test_external_clients_keep_their_backend_through_the_nodeport(env: Env) -> None:
    results = env.cluster.requests(env.client, "tcp", f"{NODE1}:30200", 20, None)
    assert len(servers(results)) == 1  # 20 connections, 20 source ports, one backend


def test_backend_leaving_timeout_and_switching_off_apply_at_once(env: Env) -> None:
    (first,) = servers(env.requests("node1", "tcp", "10.96.3.1:80", 5))
    # Its backend leaves: the next connections stick to one other backend.
    rest = [pod for pod in ALL if pod != first]
    env.write({"slices.yaml": pods_slice("sticky", PORTS, rest)})
    wait_backends(
        env.nodes["node1"].bpffs, "10.96.3.1:80/TCP", {f"{POD_IPS[p]}:8080" for p in rest}
    )
    wait_matches(env, lambda m: len(m) == 3 * 2, "the leaving backend's pairs deleted")
    (second,) = servers(env.requests("node1", "tcp", "10.96.3.1:80", 10))
    assert second != first

    # A 1-second timeout applies to the existing entry: after it, the choice is Maglev's
    # again (a uniformly random slot per connect), so some idle gap lands elsewhere.
    env.write({"services.yaml": service(timeout=1)})
    wait_matches(env, lambda m: set(m.values()) == {1}, "the new timeout written")
    after_gaps = set()
    for _ in range(8):
        time.sleep(1.3)
        after_gaps |= servers(env.requests("node1", "tcp", "10.96.3.1:80", 1))
    assert len(after_gaps) >= 2

    # Affinity off: connections spread again.
    env.write({"services.yaml": service(affinity="None")})
    wait_matches(env, lambda m: not m, "affinity switched off")
    assert len(servers(env.requests("node1", "tcp", "10.96.3.1:80", 20))) >= 2
