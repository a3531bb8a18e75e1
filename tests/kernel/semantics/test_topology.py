"""EndpointSlice zone hints on two real nodes in two zones (--zone): each node's in-node
clients reach the endpoints hinted for its zone; a hint missing on one endpoint makes
both nodes use every endpoint (kube-proxy's fallback). The same cluster shows
--nodeport-addresses: node2 serves NodePorts only on addresses inside 10.0.0.0/8."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kernel.conftest import wait_backends
from tests.kernel.twonode import (
    HTTP,
    NODE1,
    NODE2,
    POD_IPS,
    POD_NODE,
    Env,
    servers,
    two_node_cluster,
)

SERVICE = """\
apiVersion: v1
kind: Service
metadata: {name: zonal, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.5.1
  trafficDistribution: PreferClose
  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30400}]
"""
ZONES = {"pod11": "zone-a", "pod12": "zone-a", "pod21": "zone-b", "pod22": "zone-b"}


def hinted_slice(hinted: set[str]) -> str:
    """The four pods, those in `hinted` with a zone hint for their own zone."""
    endpoints = "".join(
        f'  - addresses: ["{POD_IPS[pod]}"]\n    nodeName: {POD_NODE[pod]}\n'
        f"    zone: {ZONES[pod]}\n    conditions: {{ready: true}}\n"
        + (f"    hints: {{forZones: [{{name: {ZONES[pod]}}}]}}\n" if pod in hinted else "")
        for pod in ZONES
    )
    return (
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
        "metadata: {name: zonal-1, namespace: default, "
        "labels: {kubernetes.io/service-name: zonal}}\n"
        f"addressType: IPv4\nports: {HTTP}\nendpoints:\n{endpoints}"
    )


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    documents = {"services.yaml": SERVICE, "slices.yaml": hinted_slice(set(ZONES))}
    with two_node_cluster(
        tmp_path_factory.mktemp("topology"),
        documents,
        node_args={
            "node1": ["--zone", "zone-a"],
            "node2": ["--zone", "zone-b", "--nodeport-addresses", "10.0.0.0/8"],
        },
    ) as environment:
        yield environment


def test_zone_hints_keep_traffic_in_the_zone_and_fall_back_when_incomplete(
    env: Env,
) -> None:
    assert servers(env.requests("node1", "tcp", "10.96.5.1:80", 20)) == {"pod11", "pod12"}
    assert servers(env.requests("node2", "tcp", "10.96.5.1:80", 20)) == {"pod21", "pod22"}
    env.write({"slices.yaml": hinted_slice(set(ZONES) - {"pod22"})})
    everything = {f"{ip}:8080" for ip in POD_IPS.values()}
    for node in env.nodes.values():
        wait_backends(node.bpffs, "10.96.5.1:80/TCP", everything)
    assert len(servers(env.requests("node1", "tcp", "10.96.5.1:80", 40))) >= 3


def test_nodeport_addresses_restrict_where_nodeports_answer(env: Env) -> None:
    assert len(servers(env.cluster.requests(env.client, "tcp", f"{NODE1}:30400", 3, None))) >= 1
    refused = env.cluster.requests(env.client, "tcp", f"{NODE2}:30400", 2, None)
    assert [r.get("error") for r in refused] == ["ECONNREFUSED"] * 2  # node2's own stack
    frontends = {s["frontend"] for s in env.nodes["node2"].dump()["services"]}
    assert not any(":30400/" in frontend for frontend in frontends)
    node1 = {s["frontend"] for s in env.nodes["node1"].dump()["services"]}
    assert {f"{NODE1}:30400/TCP", "127.0.0.1:30400/TCP"} <= node1  # the default: all
