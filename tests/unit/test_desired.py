from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network, IPv6Network

from ebpflb.desired import (
    DesiredFrontend,
    ExternalIPPolicy,
    NodeView,
    external_ips,
    frontends_for_port,
    usable_endpoints,
)
from ebpflb.model import (
    BackendFlags,
    Endpoint,
    NamespacedName,
    Proto,
    ServicePort,
    ServicePortName,
    ServiceType,
    SvcFlags,
    TrafficPolicy,
)

NAME = ServicePortName(NamespacedName("default", "web"), "http", Proto.TCP)
PORT = ServicePort(NAME, ServiceType.CLUSTER_IP, (IPv4Address("10.96.0.10"),), 80, 8080)


def ep(last: int, **kw: object) -> Endpoint:
    return Endpoint(IPv4Address(f"10.244.1.{last}"), 8080, **kw)  # type: ignore[arg-type]


def test_ready_endpoints_are_used() -> None:
    chosen, fallback = usable_endpoints([ep(1), ep(2, ready=False, serving=False)])
    assert [str(e.address) for e in chosen] == ["10.244.1.1"] and not fallback


def test_serving_terminating_used_only_when_nothing_is_ready() -> None:
    terminating = ep(2, ready=False, serving=True, terminating=True)
    gone = ep(3, ready=False, serving=False, terminating=True)
    assert usable_endpoints([ep(1), terminating])[0] == (ep(1),)
    chosen, fallback = usable_endpoints([terminating, gone])
    assert chosen == (terminating,) and fallback
    (fe,) = frontends_for_port(PORT, [terminating, gone])
    assert fe.flags == SvcFlags.CLUSTER_IP | SvcFlags.TERMINATING
    assert [b.flags for b in fe.backends] == [BackendFlags.TERMINATING]


def test_no_endpoints_means_a_refusing_frontend() -> None:
    (fe,) = frontends_for_port(PORT, [])
    assert fe.backends == () and not fe.usable and fe.flags == SvcFlags.CLUSTER_IP
    assert str(fe.frontend) == "10.96.0.10:80/TCP"


def test_backends_are_sorted_and_local_is_marked() -> None:
    (fe,) = frontends_for_port(PORT, [ep(3, node_name="n2"), ep(1, node_name="n1")], NodeView("n1"))
    assert [str(b.backend) for b in fe.backends] == ["10.244.1.1:8080", "10.244.1.3:8080"]
    assert [b.flags for b in fe.backends] == [BackendFlags.LOCAL, BackendFlags.NONE]


def lb_port(**kw: object) -> ServicePort:
    base = dict(
        name=NAME,
        type=ServiceType.LOAD_BALANCER,
        cluster_ips=(IPv4Address("10.96.0.10"),),
        port=80,
        target_port=8080,
        node_port=30080,
        load_balancer_ips=(IPv4Address("203.0.113.9"),),
        external_ips=(IPv4Address("192.0.2.7"),),
    )
    base.update(kw)
    return ServicePort(**base)  # type: ignore[arg-type]


NODE = NodeView(
    "n1",
    (IPv4Address("192.168.1.10"), IPv4Address("192.168.2.10")),
    ExternalIPPolicy((IPv4Network("192.0.2.0/24"),)),
)


def by_frontend(port: ServicePort, eps: list[Endpoint]) -> dict[str, DesiredFrontend]:
    return {str(fe.frontend): fe for fe in frontends_for_port(port, eps, NODE)}


def test_every_external_frontend_of_a_loadbalancer() -> None:
    fes = by_frontend(lb_port(), [ep(1, node_name="n1"), ep(2, node_name="n2")])
    assert set(fes) == {
        "10.96.0.10:80/TCP",
        "192.168.1.10:30080/TCP",
        "192.168.2.10:30080/TCP",
        "127.0.0.1:30080/TCP",
        "203.0.113.9:80/TCP",
        "192.0.2.7:80/TCP",
    }
    assert fes["192.168.1.10:30080/TCP"].flags == SvcFlags.NODE_PORT
    assert fes["203.0.113.9:80/TCP"].flags == SvcFlags.LOADBALANCER
    assert fes["192.0.2.7:80/TCP"].flags == SvcFlags.EXTERNAL_IP
    assert all(len(fe.backends) == 2 for fe in fes.values())


def test_local_policy_uses_local_endpoints_for_external_frontends_only() -> None:
    port = lb_port(external_traffic_policy=TrafficPolicy.LOCAL)
    fes = by_frontend(port, [ep(1, node_name="n1"), ep(2, node_name="n2")])
    assert len(fes["10.96.0.10:80/TCP"].backends) == 2  # ClusterIP: the whole cluster
    for name in ("192.168.1.10:30080/TCP", "203.0.113.9:80/TCP", "192.0.2.7:80/TCP"):
        assert [str(b.backend) for b in fes[name].backends] == ["10.244.1.1:8080"]
        assert SvcFlags.ETP_LOCAL in fes[name].flags
    remote_only = by_frontend(port, [ep(2, node_name="n2")])
    assert remote_only["192.168.1.10:30080/TCP"].backends == ()  # refuses, does not forward


def test_source_ranges_apply_to_loadbalancer_ips() -> None:
    ranges = (IPv4Network("198.51.100.0/24"),)
    fes = by_frontend(lb_port(load_balancer_source_ranges=ranges), [ep(1)])
    lb = fes["203.0.113.9:80/TCP"]
    assert lb.source_ranges == ranges and SvcFlags.SOURCE_RANGES in lb.flags
    assert fes["192.168.1.10:30080/TCP"].source_ranges == ()


def test_external_ips_are_refused_unless_allowed() -> None:
    """CVE-2020-8554: by default no externalIP is programmed (DenyServiceExternalIPs)."""
    port = lb_port(external_ips=(IPv4Address("192.0.2.7"), IPv4Address("8.8.8.8")))
    default = NodeView("n1")
    names = {str(fe.frontend) for fe in frontends_for_port(port, [ep(1)], default)}
    assert names == {"10.96.0.10:80/TCP", "127.0.0.1:30080/TCP", "203.0.113.9:80/TCP"}
    allowed = {str(fe.frontend) for fe in frontends_for_port(port, [ep(1)], NODE)}
    assert "192.0.2.7:80/TCP" in allowed and "8.8.8.8:80/TCP" not in allowed
    everything = NodeView("n1", external_ips=ExternalIPPolicy((IPv4Network("0.0.0.0/0"),)))
    restored = {str(fe.frontend) for fe in frontends_for_port(port, [ep(1)], everything)}
    assert {"192.0.2.7:80/TCP", "8.8.8.8:80/TCP"} <= restored  # kube-proxy's behaviour


def test_external_ip_policy() -> None:
    policy = ExternalIPPolicy((IPv4Network("192.0.2.0/24"), IPv6Network("2001:db8::/32")))
    assert policy.allows(IPv4Address("192.0.2.255"))
    assert not policy.allows(IPv4Address("192.0.3.0"))
    port = lb_port(external_ips=(IPv4Address("192.0.2.1"), IPv4Address("10.0.0.1")))
    assert external_ips(port, NodeView("n1", external_ips=policy)) == (
        [IPv4Address("192.0.2.1")],
        [IPv4Address("10.0.0.1")],
    )
    assert not ExternalIPPolicy().allows(IPv4Address("192.0.2.1"))
