"""The per-packet ClusterIP path across two nodes, both families (twonode.py's dual-stack
cluster, each node's agent with --pod-interfaces naming its pods' links and NodePort on
eth0): the client is pod11, outside its node's agent cgroup, so no socket hook sees its
connections. Backends on the other node are reached through the wire and their replies
get the ClusterIP back on pod11's own interface; the Service semantics socket-LB applies
(affinity by the client's address, internalTrafficPolicy=Local, hairpin) hold here too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.kernel.conftest import served_by
from tests.kernel.twonode import (
    ALL_PODS,
    ALL_PODS6,
    DUAL_STACK,
    NODE1,
    NODE1_6,
    POD_IPS,
    SERVICES,
    SLICES,
    Env,
    seen_ip,
    slice_yaml,
    two_node_cluster,
)

pytestmark = pytest.mark.kernel

HTTP4, HTTP6 = "10.96.1.1:80", "[fd00:96::1:1]:80"
DNS4, DNS6 = "10.96.1.1:53", "[fd00:96::1:1]:53"
POD11_6 = "fd00:244:1::11"
HTTP = "[{name: http, protocol: TCP, port: 8080}]"

EXTRA = f"""\
apiVersion: v1
kind: Service
metadata: {{name: sticky, namespace: default}}
spec:
  clusterIP: 10.96.1.7
  clusterIPs: [10.96.1.7, "fd00:96::1:7"]
  {DUAL_STACK}
  sessionAffinity: ClientIP
  ports: [{{name: http, protocol: TCP, port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: itp, namespace: default}}
spec:
  clusterIP: 10.96.1.8
  internalTrafficPolicy: Local
  ports: [{{name: http, protocol: TCP, port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: self6, namespace: default}}
spec:
  clusterIP: "fd00:96::1:6"
  clusterIPs: ["fd00:96::1:6"]
  ipFamilies: [IPv6]
  ports: [{{name: http, protocol: TCP, port: 80, targetPort: 8080}}]
"""
DOCUMENTS = {
    "services.yaml": SERVICES + "---\n" + EXTRA,
    **{f"{name}.yaml": text for name, text in SLICES.items()},
    "sticky.yaml": slice_yaml("sticky-1", "sticky", HTTP, ALL_PODS),
    "sticky6.yaml": slice_yaml("sticky-6", "sticky", HTTP, ALL_PODS6, 6),
    "itp.yaml": slice_yaml("itp-1", "itp", HTTP, ALL_PODS[2:]),  # node2's pods only
    "self6.yaml": slice_yaml("self6-1", "self6", HTTP, ALL_PODS6[:1], 6),  # pod11 alone
}
ALL = {"pod11", "pod12", "pod21", "pod22"}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("podpath2")
    with two_node_cluster(tmp, DOCUMENTS, "--pod-interfaces=p*", ipv6=True) as env_:
        yield env_


def from_pod(env: Env, pod: str, mode: str, target: str, count: int, *extra: str) -> Any:
    """Requests from a pod, outside its node's agent cgroup."""
    node = "node1" if pod.startswith("pod1") else "node2"
    netns = env.cluster.nodes[node].pods[pod].netns
    return env.cluster.requests(netns, mode, target, count, None, *extra)


@pytest.mark.parametrize(
    ("target", "client", "node"), [(HTTP4, POD_IPS["pod11"], NODE1), (HTTP6, POD11_6, NODE1_6)]
)
def test_tcp_reaches_pods_on_both_nodes_keeping_the_clients_address(
    env: Env, target: str, client: str, node: str
) -> None:
    results = from_pod(env, "pod11", "tcp", target, 40)
    assert set(served_by(results)) == ALL
    assert {r["peer"] for r in results} == {target}  # replies from the ClusterIP
    for r in results:
        # No SNAT, local or remote backend; but pod11 is a backend too, and a connection
        # that lands on itself is SNATed to its node's address (hairpin).
        assert seen_ip(r) == (node if r["server"] == "pod11" else client), r


@pytest.mark.parametrize("target", [DNS4, DNS6])
def test_udp_replies_come_from_the_clusterip_across_nodes(env: Env, target: str) -> None:
    results = from_pod(env, "pod11", "udp", target, 30)
    assert len(served_by(results)) > 2
    assert {r["peer"] for r in results} == {target}


@pytest.mark.parametrize("target", ["10.96.1.7:80", "[fd00:96::1:7]:80"])
def test_session_affinity_keeps_a_client_on_one_pod(env: Env, target: str) -> None:
    """upstream's AffinityConfirmCount: 15 requests in a row, one pod."""
    assert len(served_by(from_pod(env, "pod11", "tcp", target, 15))) == 1


def test_internal_traffic_policy_local_serves_only_the_clients_node(env: Env) -> None:
    on_node2 = from_pod(env, "pod21", "tcp", "10.96.1.8:80", 10)
    assert set(served_by(on_node2)) <= {"pod21", "pod22"}
    on_node1 = from_pod(env, "pod11", "tcp", "10.96.1.8:80", 3)
    assert [r.get("error") for r in on_node1] == ["ECONNREFUSED"] * 3  # no local endpoint


def test_ipv6_hairpin_is_snated_to_the_nodes_address(env: Env) -> None:
    results = from_pod(env, "pod11", "tcp", "[fd00:96::1:6]:80", 5)
    assert served_by(results) == {"pod11": 5}
    assert {r["peer"] for r in results} == {"[fd00:96::1:6]:80"}
    assert {seen_ip(r) for r in results} == {NODE1_6}


def test_a_node_clients_nodeport_path_is_unchanged(env: Env) -> None:
    """The node's own programs still serve NodePort from outside, next to the pod path."""
    results = env.cluster.requests(env.client, "tcp", f"{NODE1}:30080", 20, None)
    assert set(served_by(results)) <= ALL and {r["peer"] for r in results} == {f"{NODE1}:30080"}


def test_the_pod_links_are_attached_on_each_node(env: Env) -> None:
    for name, node in env.nodes.items():
        assert node.agent is not None
        status = node.agent.status()["pod_interfaces"]
        expected = {f"p{pod}" for pod in env.cluster.nodes[name].pods}
        assert set(status["attached"]) == expected, name
