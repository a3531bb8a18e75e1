"""Topology-aware routing and trafficDistribution as kube-proxy applies them: a table
mirroring pkg/proxy/topology_test.go TestCategorizeEndpoints (cases that concern the
hints; its annotation cases date from before kube-proxy stopped reading the annotation),
and the same-node cases of PreferSameNode (KEP-3015)."""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Any

import pytest

from ebpflb.desired import (
    NodeView,
    TopologyMode,
    cluster_endpoints,
    frontends_for_port,
    topology_mode,
)
from ebpflb.k8s.translate import endpoints_for_port, translate_slice
from ebpflb.model import (
    Endpoint,
    NamespacedName,
    Proto,
    ServicePort,
    ServicePortName,
    ServiceType,
    TrafficPolicy,
)
from tests.factories import endpoint_slice


def ep(last: int, zones: str = "", nodes: str = "", **kw: Any) -> Endpoint:
    return Endpoint(
        IPv4Address(f"10.1.2.{last}"),
        80,
        zone_hints=tuple(zones.split()),
        node_hints=tuple(nodes.split()),
        **kw,
    )


@dataclass
class Row:
    name: str
    zone: str
    endpoints: list[Endpoint]
    cluster: set[int]  # last octets
    node: str = "node-1"


TABLE = [
    Row(
        "normal endpoint filtering",
        "zone-a",
        [ep(3, "zone-a"), ep(4, "zone-b"), ep(5, "zone-c"), ep(6, "zone-a")],
        {3, 6},
    ),
    Row("empty node labels (no zone)", "", [ep(3, "zone-a")], {3}),
    Row("node in different zone, no endpoint filtering", "zone-b", [ep(3, "zone-a")], {3}),
    Row(
        "unready endpoint",
        "zone-a",
        [ep(3, "zone-a"), ep(4, "zone-b"), ep(5, "zone-c"), ep(6, "zone-a", ready=False)],
        {3},
    ),
    Row(
        "only unready endpoints in same zone (should not filter)",
        "zone-a",
        [
            ep(3, "zone-a", ready=False),
            ep(4, "zone-b"),
            ep(5, "zone-c"),
            ep(6, "zone-a", ready=False),
        ],
        {4, 5},
    ),
    Row(
        "missing hints, no filtering applied",
        "zone-a",
        [ep(3, "zone-a"), ep(4, "zone-b"), ep(5), ep(6, "zone-a")],
        {3, 4, 5, 6},
    ),
    Row(
        "multiple hints per endpoint, filtering includes any endpoint with zone included",
        "zone-c",
        [
            ep(3, "zone-a zone-b zone-c"),
            ep(4, "zone-b zone-c"),
            ep(5, "zone-b zone-d"),
            ep(6, "zone-c"),
        ],
        {3, 4, 6},
    ),
    Row(
        "no ready endpoints: serving terminating ones, whatever their hints",
        "zone-a",
        [
            ep(3, "zone-b", ready=False, serving=True, terminating=True),
            ep(4, "zone-a", ready=False, serving=False, terminating=True),
        ],
        {3},
    ),
    Row(
        "PreferSameNode: node hints for this node",
        "zone-a",
        [ep(3, "zone-a", "node-1"), ep(4, "zone-a", "node-2"), ep(5, "zone-b", "node-3")],
        {3},
    ),
    Row(
        "PreferSameNode: no endpoint for this node falls back to the zone",
        "zone-a",
        [ep(4, "zone-a", "node-2"), ep(5, "zone-b", "node-3"), ep(6, "zone-a", "node-4")],
        {4, 6},
    ),
    Row(
        "PreferSameNode: an endpoint without node hint falls back to the zone",
        "zone-a",
        [ep(3, "zone-a", "node-1"), ep(4, "zone-a"), ep(5, "zone-b", "node-3")],
        {3, 4},
    ),
    Row(
        "node hints only, none for this node: every endpoint",
        "zone-a",
        [ep(4, "", "node-2"), ep(5, "", "node-3")],
        {4, 5},
    ),
]


@pytest.mark.parametrize("row", TABLE, ids=lambda row: row.name)
def test_cluster_endpoints_as_kube_proxy(row: Row) -> None:
    chosen, _ = cluster_endpoints(row.endpoints, NodeView(row.node, zone=row.zone))
    assert {int(e.address.packed[3]) for e in chosen} == row.cluster


def test_topology_mode() -> None:
    node = NodeView("node-1", zone="zone-a")
    assert topology_mode([ep(1, "zone-a", "node-1")], node) is TopologyMode.SAME_NODE
    assert topology_mode([ep(1, "zone-a", "node-2")], node) is TopologyMode.SAME_ZONE
    assert topology_mode([ep(1, "zone-b")], node) is TopologyMode.NONE
    assert topology_mode([ep(1, "zone-a", ready=False)], node) is TopologyMode.NONE


NAME = ServicePortName(NamespacedName("default", "web"), "http", Proto.TCP)


def port(**kw: Any) -> ServicePort:
    return ServicePort(
        NAME,
        ServiceType.NODE_PORT,
        (IPv4Address("10.96.0.10"),),
        80,
        80,
        node_port=30080,
        **kw,
    )


def test_local_endpoints_ignore_topology_and_cluster_ones_use_it() -> None:
    """kube-proxy's "externalTrafficPolicy: Local, topology ignored for Local endpoints"."""
    node = NodeView("node-1", (IPv4Address("192.168.1.10"),), zone="zone-a")
    eps = [
        ep(3, "zone-a", node_name="node-1"),
        ep(4, "zone-b", node_name="node-1"),
        ep(5, "zone-c"),
        ep(6, "zone-a"),
    ]
    fes = {
        str(fe.frontend): {int(b.backend.address.packed[3]) for b in fe.backends}
        for fe in frontends_for_port(port(external_traffic_policy=TrafficPolicy.LOCAL), eps, node)
    }
    assert fes["10.96.0.10:80/TCP"] == {3, 6}  # cluster endpoints: topology
    assert fes["192.168.1.10:30080/TCP"] == {3, 4}  # local endpoints: no topology
    assert fes["192.168.1.10:30080/TCP/internal"] == {3, 6}


def test_hints_are_read_from_the_slice() -> None:
    raw = endpoint_slice()
    raw["endpoints"][0]["hints"] = {
        "forZones": [{"name": "zone-b"}, {"name": "zone-a"}],
        "forNodes": [{"name": "node-1"}],
    }
    translated = translate_slice(raw)
    first = translated.endpoints[0]
    assert (first.zone_hints, first.node_hints) == (("zone-a", "zone-b"), ("node-1",))
    (name,) = {ServicePortName(translated.service, p.name, p.protocol) for p in translated.ports}
    merged = endpoints_for_port(name, [translated])
    assert any(e.zone_hints == ("zone-a", "zone-b") for e in merged)
