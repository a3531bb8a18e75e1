"""--nodeport-addresses: the node addresses NodePorts answer on (kube-proxy's flag)."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

from ebpflb.config import Config
from ebpflb.desired import NodeView, frontends_for_port
from ebpflb.model import Endpoint, NamespacedName, Proto, ServicePort, ServicePortName, ServiceType

PORT = ServicePort(
    ServicePortName(NamespacedName("default", "web"), "http", Proto.TCP),
    ServiceType.NODE_PORT,
    (IPv4Address("10.96.0.10"),),
    80,
    8080,
    node_port=30080,
)
EPS = [Endpoint(IPv4Address("10.244.1.1"), 8080)]
ADDRESSES = (IPv4Address("192.168.1.10"), IPv4Address("10.0.0.10"))


def nodeports(*cidrs: str) -> set[str]:
    node = NodeView("n1", ADDRESSES, nodeport_cidrs=tuple(IPv4Network(c) for c in cidrs))
    return {
        str(fe.frontend.address)
        for fe in frontends_for_port(PORT, EPS, node)
        if fe.frontend.port == 30080
    }


def test_default_is_every_address_and_loopback() -> None:
    assert nodeports() == {"192.168.1.10", "10.0.0.10", "127.0.0.1"}


def test_cidrs_restrict_the_addresses() -> None:
    assert nodeports("192.168.1.0/24") == {"192.168.1.10"}
    assert nodeports("192.168.1.0/24", "127.0.0.0/8") == {"192.168.1.10", "127.0.0.1"}
    assert nodeports("172.16.0.0/12") == set()


def test_the_flag_parses_cidrs() -> None:
    assert Config.parse_cidrs("192.168.1.0/24,127.0.0.0/8") == (
        IPv4Network("192.168.1.0/24"),
        IPv4Network("127.0.0.0/8"),
    )
