"""internalTrafficPolicy and externalTrafficPolicy as kube-proxy applies them
(pkg/proxy/topology.go CategorizeEndpoints, the iptables proxier's KUBE-EXT chains)."""

from __future__ import annotations

from ipaddress import IPv4Address

from ebpflb.desired import DesiredFrontend, NodeView, frontends_for_port
from ebpflb.model import (
    Endpoint,
    NamespacedName,
    Proto,
    Scope,
    ServicePort,
    ServicePortName,
    ServiceType,
    SvcFlags,
    TrafficPolicy,
)

NAME = ServicePortName(NamespacedName("default", "web"), "http", Proto.TCP)
NODE = NodeView("n1", (IPv4Address("192.168.1.10"),))


def port(**kw: object) -> ServicePort:
    base: dict[str, object] = dict(
        name=NAME,
        type=ServiceType.LOAD_BALANCER,
        cluster_ips=(IPv4Address("10.96.0.10"),),
        port=80,
        target_port=8080,
        node_port=30080,
        load_balancer_ips=(IPv4Address("203.0.113.9"),),
    )
    base.update(kw)
    return ServicePort(**base)  # type: ignore[arg-type]


def ep(last: int, node: str, **kw: object) -> Endpoint:
    return Endpoint(IPv4Address(f"10.244.1.{last}"), 8080, node_name=node, **kw)  # type: ignore[arg-type]


def frontends(p: ServicePort, eps: list[Endpoint]) -> dict[str, DesiredFrontend]:
    return {str(fe.frontend): fe for fe in frontends_for_port(p, eps, NODE)}


def addresses(fe: DesiredFrontend) -> list[str]:
    return [str(b.backend.address) for b in fe.backends]


MIXED = [ep(1, "n1"), ep(2, "n2"), ep(3, "n2")]


def test_internal_local_limits_the_clusterip_to_local_endpoints() -> None:
    fes = frontends(port(internal_traffic_policy=TrafficPolicy.LOCAL), MIXED)
    cluster_ip = fes["10.96.0.10:80/TCP"]
    assert addresses(cluster_ip) == ["10.244.1.1"]
    assert cluster_ip.flags == SvcFlags.CLUSTER_IP | SvcFlags.ITP_LOCAL
    # External traffic follows externalTrafficPolicy (Cluster): every endpoint.
    assert len(fes["192.168.1.10:30080/TCP"].backends) == 3
    assert len(fes["203.0.113.9:80/TCP"].backends) == 3


def test_internal_local_without_local_endpoints_refuses() -> None:
    fes = frontends(port(internal_traffic_policy=TrafficPolicy.LOCAL), MIXED[1:])
    assert not fes["10.96.0.10:80/TCP"].usable
    assert fes["192.168.1.10:30080/TCP"].usable


def test_internal_local_falls_back_to_local_serving_terminating_endpoints() -> None:
    eps = [ep(1, "n1", ready=False, serving=True, terminating=True), ep(2, "n2")]
    fes = frontends(port(internal_traffic_policy=TrafficPolicy.LOCAL), eps)
    cluster_ip = fes["10.96.0.10:80/TCP"]
    assert addresses(cluster_ip) == ["10.244.1.1"]
    assert SvcFlags.TERMINATING in cluster_ip.flags  # kube-proxy: only local ones considered


def test_external_local_gives_in_node_clients_every_endpoint() -> None:
    fes = frontends(port(external_traffic_policy=TrafficPolicy.LOCAL), MIXED)
    for name in ("192.168.1.10:30080/TCP", "127.0.0.1:30080/TCP", "203.0.113.9:80/TCP"):
        outside = fes[name]
        assert addresses(outside) == ["10.244.1.1"]
        assert SvcFlags.ETP_LOCAL | SvcFlags.INTERNAL_SCOPE in outside.flags
        inside = fes[name + "/internal"]
        assert inside.frontend.scope is Scope.INTERNAL
        assert len(inside.backends) == 3
        assert not inside.flags & (SvcFlags.ETP_LOCAL | SvcFlags.INTERNAL_SCOPE)
        assert inside.flags & SvcFlags.EXTERNAL == outside.flags & SvcFlags.EXTERNAL
    assert len(fes["10.96.0.10:80/TCP"].backends) == 3
    assert "10.96.0.10:80/TCP/internal" not in fes


def test_external_local_without_local_endpoints_still_serves_in_node_clients() -> None:
    fes = frontends(port(external_traffic_policy=TrafficPolicy.LOCAL), MIXED[1:])
    assert not fes["192.168.1.10:30080/TCP"].usable
    assert fes["192.168.1.10:30080/TCP/internal"].usable


def test_both_local_policies_are_independent() -> None:
    fes = frontends(
        port(
            external_traffic_policy=TrafficPolicy.LOCAL,
            internal_traffic_policy=TrafficPolicy.LOCAL,
        ),
        MIXED,
    )
    assert addresses(fes["10.96.0.10:80/TCP"]) == ["10.244.1.1"]
    # In-cluster traffic to an external destination is subject to neither policy.
    assert len(fes["203.0.113.9:80/TCP/internal"].backends) == 3


def test_cluster_policies_make_no_internal_entries() -> None:
    fes = frontends(port(), MIXED)
    assert all(fe.frontend.scope is Scope.EXTERNAL for fe in fes.values())
    assert all(not fe.flags & SvcFlags.INTERNAL_SCOPE for fe in fes.values())


def test_external_frontends_reject_only_when_no_endpoint_exists_anywhere() -> None:
    for policy in TrafficPolicy:
        fes = frontends(port(external_traffic_policy=policy), [])
        for name in ("192.168.1.10:30080/TCP", "203.0.113.9:80/TCP"):
            assert SvcFlags.REJECT in fes[name].flags, (policy, name)
        assert SvcFlags.REJECT not in fes["10.96.0.10:80/TCP"].flags  # socket-LB refuses
    remote_only = frontends(port(external_traffic_policy=TrafficPolicy.LOCAL), MIXED[1:])
    assert not remote_only["192.168.1.10:30080/TCP"].usable
    assert SvcFlags.REJECT not in remote_only["192.168.1.10:30080/TCP"].flags  # dropped
    assert all(SvcFlags.REJECT not in fe.flags for fe in frontends(port(), MIXED).values())
