"""status.loadBalancer.ingress[].ipMode: Proxy IPs are left to the load balancer."""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Any

import pytest

from ebpflb.errors import InvalidObjectError
from ebpflb.k8s.translate import translate_service
from tests.factories import service


def lb_ips(*ingress: dict[str, Any]) -> tuple[IPv4Address, ...]:
    obj = service(type="LoadBalancer", ports=[{"name": "http", "port": 80, "nodePort": 30080}])
    obj["status"] = {"loadBalancer": {"ingress": list(ingress)}}
    (port,) = translate_service(obj).ports.values()
    return port.load_balancer_ips


def test_vip_mode_is_programmed_proxy_mode_is_not() -> None:
    assert lb_ips({"ip": "203.0.113.1"}, {"ip": "203.0.113.2", "ipMode": "VIP"}) == (
        IPv4Address("203.0.113.1"),
        IPv4Address("203.0.113.2"),
    )
    assert lb_ips({"ip": "203.0.113.3", "ipMode": "Proxy"}, {"ip": "203.0.113.4"}) == (
        IPv4Address("203.0.113.4"),
    )


def test_an_unknown_mode_names_the_field() -> None:
    with pytest.raises(InvalidObjectError, match=r"ingress\[0\]\.ipMode"):
        lb_ips({"ip": "203.0.113.1", "ipMode": "Tunnel"})
