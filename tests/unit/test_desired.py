from __future__ import annotations

from ipaddress import IPv4Address

from ebpflb.desired import NodeView, frontends_for_port, usable_endpoints
from ebpflb.model import (
    BackendFlags,
    Endpoint,
    NamespacedName,
    Proto,
    ServicePort,
    ServicePortName,
    ServiceType,
    SvcFlags,
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
