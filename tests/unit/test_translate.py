from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from ebpflb.errors import InvalidObjectError
from ebpflb.model import NamespacedName, Proto, ServicePortName, ServiceType, TrafficPolicy
from ebpflb.translate import endpoints_for_port, parse_ipv4, translate_service, translate_slice
from tests.factories import endpoint, endpoint_slice, service

WEB = NamespacedName("default", "web")


def test_clusterip_service_ports() -> None:
    t = translate_service(
        service(
            ports=[
                {"name": "http", "port": 80, "targetPort": "web-http"},
                {"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 5353},
            ]
        )
    )
    assert t.skipped is None
    http = t.ports[ServicePortName(WEB, "http", Proto.TCP)]
    assert http.cluster_ips == (IPv4Address("10.96.0.10"),)
    assert (
        http.port == 80 and http.target_port == "web-http" and http.type is ServiceType.CLUSTER_IP
    )
    assert t.ports[ServicePortName(WEB, "dns", Proto.UDP)].target_port == 5353


def test_target_port_defaults_to_port() -> None:
    t = translate_service(service(ports=[{"port": 80}]))
    (port,) = t.ports.values()
    assert port.target_port == 80 and port.name.port_name == ""
    assert str(port.name) == "default/web:"


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"clusterIP": "None"}, "headless"),
        ({"type": "ExternalName", "externalName": "example.com", "clusterIP": ""}, "ExternalName"),
        ({"clusterIP": ""}, "no clusterIP"),
    ],
)
def test_skipped_services(spec: dict[str, str], reason: str) -> None:
    t = translate_service(service(**spec))
    assert t.skipped is not None and reason in t.skipped
    assert not t.ports


def test_other_proxy_label_is_skipped() -> None:
    obj = service()
    obj["metadata"]["labels"] = {"service.kubernetes.io/service-proxy-name": "other"}
    assert "service-proxy-name" in (translate_service(obj).skipped or "")


def test_ipv6_cluster_ips_are_counted_and_ignored() -> None:
    t = translate_service(service(clusterIPs=["10.96.0.10", "fd00::10"]))
    assert t.ipv6_skipped == 1
    (port,) = t.ports.values()
    assert port.cluster_ips == (IPv4Address("10.96.0.10"),)
    only6 = translate_service(service(cluster_ip="fd00::10"))
    assert only6.skipped == "IPv6-only service" and only6.ipv6_skipped == 1


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (service(cluster_ip="10.96.0.300"), "clusterIP '10.96.0.300' is not an IP address"),
        (service(ports=[{"name": "http", "port": 0}]), "spec.ports[0].port 0 is not a port"),
        (service(ports=[{"name": "http", "port": "eighty"}]), "is not a port"),
        (service(ports=[{"name": "h", "port": 80, "targetPort": 70000}]), "targetPort 70000"),
        (service(ports=[]), "spec.ports is empty"),
        (
            service(ports=[{"name": "a", "port": 1}, {"name": "a", "port": 2}]),
            "duplicate port name",
        ),
        (service(ports=[{"name": "s", "port": 1, "protocol": "SCTP"}]), "unsupported protocol"),
        (service(type="Weird"), "unknown type"),
        (service(externalTrafficPolicy="Sometimes"), "not Cluster or Local"),
    ],
)
def test_invalid_services_name_the_object(obj: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidObjectError) as info:
        translate_service(obj)
    assert "default/web" in str(info.value) and message in str(info.value)
    assert info.value.kind == "Service"


def test_loadbalancer_fields() -> None:
    obj = service(
        type="LoadBalancer",
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
        externalIPs=["192.0.2.7"],
        loadBalancerSourceRanges=["198.51.100.0/24"],
        externalTrafficPolicy="Local",
        healthCheckNodePort=32000,
    )
    obj["status"] = {"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}, {"hostname": "x"}]}}
    (port,) = translate_service(obj).ports.values()
    assert port.node_port == 30080
    assert port.load_balancer_ips == (IPv4Address("203.0.113.9"),)
    assert port.external_ips == (IPv4Address("192.0.2.7"),)
    assert port.load_balancer_source_ranges == (IPv4Network("198.51.100.0/24"),)
    assert port.external_traffic_policy is TrafficPolicy.LOCAL
    assert port.health_check_node_port == 32000


def test_slice_conditions_default_like_the_api() -> None:
    s = translate_slice(
        endpoint_slice(
            endpoints=[
                endpoint("10.244.1.11", ready=None),
                endpoint("10.244.1.12", ready=False, serving=True, terminating=True),
                endpoint("10.244.1.13", ready=False),
            ]
        )
    )
    a, b, c = s.endpoints
    assert (a.ready, a.serving, a.terminating) == (True, True, False)
    assert (b.ready, b.serving, b.terminating) == (False, True, True)
    assert (c.ready, c.serving, c.terminating) == (False, False, False)
    assert s.service == WEB


def test_slice_without_service_label_is_invalid() -> None:
    obj = endpoint_slice()
    obj["metadata"]["labels"] = {}
    with pytest.raises(InvalidObjectError, match=r"default/web-1: no kubernetes\.io/service-name"):
        translate_slice(obj)


def test_slice_with_bad_address_is_invalid() -> None:
    with pytest.raises(InvalidObjectError, match="not an IPv4 address"):
        translate_slice(endpoint_slice(endpoints=[endpoint("10.244.1.300")]))


def test_ipv6_and_fqdn_slices_are_skipped() -> None:
    assert (
        translate_slice(endpoint_slice(address_type="IPv6", endpoints=[])).skipped
        == "addressType IPv6"
    )
    assert (
        translate_slice(endpoint_slice(address_type="FQDN", endpoints=[])).skipped
        == "addressType FQDN"
    )


def test_endpoints_join_by_port_name_and_protocol_across_slices() -> None:
    one = translate_slice(
        endpoint_slice(
            "web-1",
            ports=[
                {"name": "http", "protocol": "TCP", "port": 8080},
                {"name": "dns", "protocol": "UDP", "port": 5353},
            ],
            endpoints=[endpoint("10.244.1.11")],
        )
    )
    two = translate_slice(
        endpoint_slice(
            "web-2",
            ports=[
                {"name": "http", "protocol": "TCP", "port": 8080},
            ],
            endpoints=[endpoint("10.244.2.21"), endpoint("10.244.1.11", ready=False)],
        )
    )
    http = endpoints_for_port(ServicePortName(WEB, "http", Proto.TCP), [one, two])
    assert [(str(e.address), e.port, e.ready) for e in http] == [
        ("10.244.1.11", 8080, True),  # the ready copy wins over the not-ready duplicate
        ("10.244.2.21", 8080, True),
    ]
    dns = endpoints_for_port(ServicePortName(WEB, "dns", Proto.UDP), [one, two])
    assert [(str(e.address), e.port) for e in dns] == [("10.244.1.11", 5353)]
    assert endpoints_for_port(ServicePortName(WEB, "dns", Proto.TCP), [one, two]) == ()


def test_unresolved_named_port_has_no_endpoints() -> None:
    s = translate_slice(endpoint_slice(ports=[{"name": "http", "protocol": "TCP", "port": None}]))
    assert endpoints_for_port(ServicePortName(WEB, "http", Proto.TCP), [s]) == ()


@pytest.mark.parametrize(
    "text",
    [
        "10.0.0.1",
        "0.0.0.0",
        "255.255.255.255",
        "01.2.3.4",
        "1.2.3",
        "256.1.1.1",
        " 1.2.3.4",
        "1.2.3.4 ",
        "0x1.2.3.4",
        "1..2.3",
        "1.2.3.4\x00",
        "::1",
        "",
        "1.2.3.04",
    ],
)
def test_ipv4_parsing_is_as_strict_as_ipaddress(text: str) -> None:
    try:
        expected: IPv4Address | None = IPv4Address(text)
    except ValueError:
        expected = None
    assert parse_ipv4(text) == expected


def test_merged_endpoints_come_in_address_order() -> None:
    ips = ["10.244.1.9", "10.244.1.10", "10.244.0.200", "9.1.1.1"]
    slice_ = translate_slice(endpoint_slice(endpoints=[endpoint(ip) for ip in ips]))
    merged = endpoints_for_port(ServicePortName(WEB, "http", Proto.TCP), [slice_])
    assert [str(e.address) for e in merged] == sorted(ips, key=IPv4Address)
    assert list(merged) == sorted(merged)
