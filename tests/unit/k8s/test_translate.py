from __future__ import annotations

import copy
import re
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Any

import pytest

from ebpflb.errors import Fault, InvalidObjectError
from ebpflb.k8s.fields import parse_ipv4
from ebpflb.k8s.translate import endpoints_for_port, translate_service, translate_slice
from ebpflb.model import NamespacedName, Proto, ServicePortName, ServiceType, TrafficPolicy
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


@pytest.mark.parametrize(
    "label",
    ["service.kubernetes.io/service-proxy-name", "service.kubernetes.io/headless"],
)
def test_either_skip_label_skips_whatever_its_value(label: str) -> None:
    """kube-proxy lists Services with a `!label` selector: present with an empty value
    (the headless label's usual one) is present."""
    obj = service()
    obj["metadata"]["labels"] = {label: ""}
    skipped = translate_service(obj).skipped
    assert skipped is not None and label in skipped
    assert not translate_service(obj).ports


def test_dual_stack_cluster_ips_are_both_programmed() -> None:
    t = translate_service(
        service(
            clusterIPs=["10.96.0.10", "fd00::10"],
            ipFamilies=["IPv4", "IPv6"],
            ipFamilyPolicy="RequireDualStack",
        )
    )
    (port,) = t.ports.values()
    assert port.cluster_ips == (IPv4Address("10.96.0.10"), IPv6Address("fd00::10"))
    assert t.skipped is None
    only6 = translate_service(service(cluster_ip="fd00::10", ipFamilies=["IPv6"]))
    assert only6.skipped is None
    assert next(iter(only6.ports.values())).cluster_ips == (IPv6Address("fd00::10"),)


def test_ipv6_nodeports_ingress_and_external_ips_are_all_programmed() -> None:
    """Every IPv6 nodePort, ingress IP, external IP and source range of a dual-stack
    Service is kept for tc/XDP, next to the IPv4 ones (nothing is left unserved)."""
    obj = service(
        type="LoadBalancer",
        clusterIPs=["10.96.0.10", "fd00::10"],
        externalIPs=["192.0.2.7", "2001:db8::7"],
        loadBalancerSourceRanges=["203.0.113.0/24", " 2001:db8:1::5/48 "],
    )
    obj["spec"]["ports"][0]["nodePort"] = 30080
    obj["status"] = {"loadBalancer": {"ingress": [{"ip": "2001:db8::1"}, {"ip": "192.0.2.1"}]}}
    t = translate_service(obj)
    (port,) = t.ports.values()
    assert port.node_port == 30080
    assert port.load_balancer_ips == (IPv6Address("2001:db8::1"), IPv4Address("192.0.2.1"))
    assert port.external_ips == (IPv4Address("192.0.2.7"), IPv6Address("2001:db8::7"))
    # Host bits cleared, spaces trimmed, as kube-proxy parses them.
    assert port.load_balancer_source_ranges == (
        IPv4Network("203.0.113.0/24"),
        IPv6Network("2001:db8:1::/48"),
    )
    # A family without a cluster IP is not this Service's (kube-proxy's per-family view).
    v4_only = translate_service(service(externalIPs=["2001:db8::7", "192.0.2.7"]))
    assert next(iter(v4_only.ports.values())).external_ips == (IPv4Address("192.0.2.7"),)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"ipFamilies": ["IPv5"]}, "spec.ipFamilies[0]"),
        ({"ipFamilies": ["IPv4", "IPv4"]}, "more than one entry per family"),
        ({"ipFamilyPolicy": "Sometimes"}, "spec.ipFamilyPolicy"),
        (
            {"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4", "IPv6"]},
            "SingleStack",
        ),
        ({"ipFamilies": ["IPv6"]}, "is not of ipFamilies"),  # clusterIP 10.96.0.10
    ],
)
def test_bad_ip_families_are_invalid(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidObjectError, match=re.escape(message)):
        translate_service(service(**spec))


@pytest.mark.parametrize(
    ("obj", "message", "fault"),
    [
        (
            service(cluster_ip="10.96.0.300"),
            "spec.clusterIP '10.96.0.300' is not an IP address",
            Fault.VALUE,
        ),
        (
            service(ports=[{"name": "http", "port": 0}]),
            "spec.ports[0].port 0 is not a port",
            Fault.VALUE,
        ),
        (
            service(ports=[{"name": "http", "port": "eighty"}]),
            "spec.ports[0].port must be an integer, not string 'eighty'",
            Fault.TYPE,
        ),
        (
            service(ports=[{"name": "h", "port": 80, "targetPort": 70000}]),
            "targetPort 70000",
            Fault.VALUE,
        ),
        (service(ports=[]), "spec.ports is empty", Fault.MISSING),
        (
            service(ports=[{"name": "a", "port": 1}, {"name": "a", "port": 2}]),
            "duplicate port name",
            Fault.VALUE,
        ),
        (service(type="Weird"), "spec.type 'Weird' is not ClusterIP", Fault.VALUE),
        (service(externalTrafficPolicy="Sometimes"), "not Cluster or Local", Fault.VALUE),
    ],
)
def test_invalid_services_name_the_object(
    obj: dict[str, object], message: str, fault: Fault
) -> None:
    with pytest.raises(InvalidObjectError) as info:
        translate_service(obj)
    assert "default/web" in str(info.value) and message in str(info.value)
    assert info.value.kind == "Service" and info.value.fault is fault


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
    # kube-proxy: an unset serving is true, whatever ready says (not "same as ready").
    assert (c.ready, c.serving, c.terminating) == (False, True, False)
    assert s.service == WEB


def test_slice_without_service_label_is_invalid() -> None:
    obj = endpoint_slice()
    obj["metadata"]["labels"] = {}
    with pytest.raises(
        InvalidObjectError,
        match=r"default/web-1: metadata.labels has no kubernetes\.io/service-name",
    ) as info:
        translate_slice(obj)
    assert info.value.fault is Fault.MISSING


def test_slice_with_bad_address_is_invalid() -> None:
    with pytest.raises(InvalidObjectError, match="not an IPv4 address"):
        translate_slice(endpoint_slice(endpoints=[endpoint("10.244.1.300")]))


def test_ipv6_slices_are_translated_and_fqdn_skipped() -> None:
    six = translate_slice(endpoint_slice(address_type="IPv6", endpoints=[endpoint("fd00::1")]))
    assert six.skipped is None and six.family == 6
    assert [ep.address for ep in six.endpoints] == [IPv6Address("fd00::1")]
    with pytest.raises(InvalidObjectError, match="not an IPv6 address"):
        translate_slice(endpoint_slice(address_type="IPv6", endpoints=[endpoint("10.0.0.1")]))
    assert (
        translate_slice(endpoint_slice(address_type="FQDN", endpoints=[])).skipped
        == "addressType FQDN"
    )


def test_each_family_keeps_its_own_endpoints() -> None:
    """An IPv4 and an IPv6 endpoint of equal numbers stay two endpoints."""
    four = translate_slice(endpoint_slice("web-4", endpoints=[endpoint("0.0.0.1")]))
    six = translate_slice(endpoint_slice("web-6", address_type="IPv6", endpoints=[endpoint("::1")]))
    name = ServicePortName(NamespacedName("default", "web"), "http", Proto.TCP)
    merged = endpoints_for_port(name, [four, six])
    assert [ep.address for ep in merged] == [IPv4Address("0.0.0.1"), IPv6Address("::1")]


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


def _with(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of `obj` with the value at a dotted path (numbers index lists) set."""
    obj = copy.deepcopy(obj)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    target: Any = obj
    for key in parents:
        target = target[key]
    target[last] = value
    return obj


# Each was an AttributeError, TypeError or ValueError escaping translation (which stopped
# the agent at start, or a reload part-way), or a wrong meaning taken silently.
@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("spec.ports.0.protocol", 6, "spec.ports[0].protocol"),  # was AttributeError
        ("spec", [1, 2], "spec"),  # was AttributeError
        ("metadata.labels", 5, "metadata.labels"),  # was TypeError
        ("metadata.labels", "service.kubernetes.io/service-proxy-name", "metadata.labels"),
        ("metadata.name", 5, "metadata.name"),  # was taken as the name "5"
        ("spec.ports.0.name", ["http"], "spec.ports[0].name"),  # was taken as "['http']"
        ("spec.clusterIPs", "10.96.0.10", "spec.clusterIPs"),  # was read letter by letter
        ("spec.ports", {"port": 80}, "spec.ports"),  # was "spec.ports is empty"
        ("spec.externalIPs", [None], "spec.externalIPs[0]"),  # was the address 'None'
        ("spec.ports.0.port", 80.0, "spec.ports[0].port"),
        ("spec.ports.0.port", True, "spec.ports[0].port"),
        ("spec.healthCheckNodePort", "32000", "spec.healthCheckNodePort"),
        ("status", "ready", "status"),  # was AttributeError
    ],
)
def test_a_service_field_of_the_wrong_type_is_invalid(path: str, value: Any, field: str) -> None:
    with pytest.raises(InvalidObjectError) as info:
        translate_service(_with(service(), path, value))
    assert info.value.fault is Fault.TYPE and info.value.field == field
    assert field in str(info.value)


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("ports.0.protocol", 6, "ports[0].protocol"),  # was AttributeError
        ("endpoints.0.conditions", [True], "endpoints[0].conditions"),  # was AttributeError
        ("endpoints.0.conditions.ready", "false", "endpoints[0].conditions.ready"),  # truthy!
        ("endpoints.0.conditions.ready", 0, "endpoints[0].conditions.ready"),
        ("endpoints.0.conditions.serving", "yes", "endpoints[0].conditions.serving"),
        ("endpoints.0.conditions.terminating", 1, "endpoints[0].conditions.terminating"),
        ("endpoints.0.addresses", "10.244.1.11", "endpoints[0].addresses"),  # was '1'
        ("endpoints.0.addresses.0", 167772171, "endpoints[0].addresses[0]"),
        ("endpoints.0.nodeName", 7, "endpoints[0].nodeName"),
        ("endpoints", {"addresses": ["10.244.1.11"]}, "endpoints"),
        ("addressType", 4, "addressType"),
        ("ports.0.port", "8080", "ports[0].port"),
    ],
)
def test_a_slice_field_of_the_wrong_type_is_invalid(path: str, value: Any, field: str) -> None:
    with pytest.raises(InvalidObjectError) as info:
        translate_slice(_with(endpoint_slice(), path, value))
    assert info.value.fault is Fault.TYPE and info.value.field == field


def test_a_string_false_is_not_ready() -> None:
    """`ready: "false"` made an address with no pod a Service's only backend."""
    obj = endpoint_slice(
        endpoints=[{"addresses": ["10.244.1.11"], "conditions": {"ready": "false"}}]
    )
    with pytest.raises(InvalidObjectError, match=r"conditions\.ready must be a boolean"):
        translate_slice(obj)


def test_a_unicode_digit_target_port_is_a_name_not_a_crash() -> None:
    """ "²".isdigit() is true and int("²") a ValueError: it escaped translation."""
    (port,) = translate_service(service(ports=[{"port": 80, "targetPort": "²"}])).ports.values()
    assert port.target_port == "²"
    with pytest.raises(InvalidObjectError, match="is not a port"):
        translate_service(service(ports=[{"port": 80, "targetPort": "9" * 5000}]))


@pytest.mark.parametrize(
    ("change", "message", "fault"),
    [
        ({"metadata": {"namespace": "default"}}, "metadata.name is missing", Fault.MISSING),
        ({"metadata": {"name": ""}}, "metadata.name is missing", Fault.MISSING),
        ({"spec": {"clusterIP": "10.96.0.10"}}, "spec.ports is empty", Fault.MISSING),
        (
            {"spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "x"}]}},
            "spec.ports[0].port is missing",
            Fault.MISSING,
        ),
        (
            {"spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 1, "protocol": "tcp"}]}},
            "spec.ports[0].protocol 'tcp' is not TCP, UDP or SCTP",  # the API is case-exact
            Fault.VALUE,
        ),
        (
            {
                "spec": {
                    "clusterIP": "10.96.0.10",
                    "clusterIPs": ["10.96.0.11"],
                    "ports": [{"port": 1}],
                }
            },
            "spec.clusterIPs[0] '10.96.0.11' differs from spec.clusterIP",
            Fault.VALUE,
        ),
        (
            {"spec": {"clusterIPs": ["None", "10.96.0.11"], "ports": [{"port": 1}]}},
            "lists None (headless) with addresses",
            Fault.VALUE,
        ),
        (
            {"spec": {"clusterIP": "fe80::1%eth0", "ports": [{"port": 1}]}},
            "is not an IP address",
            Fault.VALUE,
        ),
    ],
)
def test_missing_and_bad_values(change: dict[str, Any], message: str, fault: Fault) -> None:
    obj = {"metadata": {"name": "web"}, **change}
    with pytest.raises(InvalidObjectError) as info:
        translate_service(obj)
    assert message in str(info.value) and info.value.fault is fault


def test_api_defaults_for_empty_and_zero_values() -> None:
    """As the API server defaults them: type "" is ClusterIP, protocol "" TCP, targetPort
    0 or "" the port itself, nodePort and healthCheckNodePort 0 unallocated."""
    t = translate_service(
        service(
            type="",
            ports=[{"port": 80, "protocol": "", "targetPort": 0, "nodePort": 0}],
            healthCheckNodePort=0,
        )
    )
    (port,) = t.ports.values()
    assert port.type is ServiceType.CLUSTER_IP and port.protocol is Proto.TCP
    assert (port.target_port, port.node_port, port.health_check_node_port) == (80, None, None)
    (named,) = translate_service(service(ports=[{"port": 80, "targetPort": ""}])).ports.values()
    assert named.target_port == 80


def test_an_sctp_port_is_left_out_and_the_others_stay() -> None:
    """One SCTP port made the whole Service invalid: its TCP and UDP ports were lost."""
    t = translate_service(
        service(
            ports=[
                {"name": "http", "port": 80},
                {"name": "sig", "port": 3868, "protocol": "SCTP"},
                {"name": "dns", "port": 53, "protocol": "UDP"},
            ]
        )
    )
    assert sorted(str(p) for p in t.ports) == ["default/web:dns", "default/web:http"]
    (skipped,) = t.skipped_ports
    assert str(skipped) == "spec.ports[1] (sig, 3868/SCTP)"
    only = translate_service(service(ports=[{"name": "sig", "port": 1, "protocol": "SCTP"}]))
    assert only.skipped is None and not only.ports and len(only.skipped_ports) == 1


def test_sctp_slice_ports_are_left_out() -> None:
    s = translate_slice(
        endpoint_slice(ports=[{"name": "sig", "protocol": "SCTP", "port": 3868}, {"port": 80}])
    )
    assert [(p.name, p.protocol, p.port) for p in s.ports] == [("", Proto.TCP, 80)]


@pytest.mark.parametrize(
    ("ranges", "expected"),
    [
        ([" 198.51.100.0/24 "], [IPv4Network("198.51.100.0/24")]),  # kube-proxy trims
        (["198.51.100.7/24"], [IPv4Network("198.51.100.0/24")]),  # host bits: tolerated
        # Both families (each filters its own family's LoadBalancer IPs).
        (
            ["2001:db8::1/32", "10.0.0.0/8"],
            [IPv6Network("2001:db8::/32"), IPv4Network("10.0.0.0/8")],
        ),
        (["198.51.100.0"], None),  # a bare address is no CIDR to the API server
        (["198.51.100.0/255.255.255.0"], None),
        (["198.51.100.0/33"], None),
        (["2001:db8::/129"], None),
        (["/8"], None),
    ],
)
def test_source_ranges_are_cidrs(
    ranges: list[str], expected: list[IPv4Network | IPv6Network] | None
) -> None:
    obj = service(type="LoadBalancer", loadBalancerSourceRanges=ranges)
    if expected is None:
        with pytest.raises(InvalidObjectError, match=r"spec\.loadBalancerSourceRanges"):
            translate_service(obj)
        return
    (port,) = translate_service(obj).ports.values()
    assert list(port.load_balancer_source_ranges) == expected


def test_slice_limits_and_required_fields() -> None:
    too_many = endpoint_slice(endpoints=[endpoint("10.244.1.1")] * 1001)
    with pytest.raises(
        InvalidObjectError, match="endpoints has 1001 items, more than the API's 1000"
    ):
        translate_slice(too_many)
    no_type = endpoint_slice()
    del no_type["addressType"]
    with pytest.raises(InvalidObjectError, match="addressType is missing"):
        translate_slice(no_type)
    empty = endpoint_slice(endpoints=[{"addresses": []}])
    with pytest.raises(InvalidObjectError, match=r"endpoints\[0\].addresses is empty"):
        translate_slice(empty)
    second = endpoint_slice(endpoints=[{"addresses": ["10.244.1.1", "10.244.1.300"]}])
    with pytest.raises(InvalidObjectError, match=r"endpoints\[0\].addresses\[1\]"):
        translate_slice(second)


def test_unread_fields_are_not_checked() -> None:
    """Extra and unknown fields are the API server's business (it prunes them), not ours."""
    obj = service(selector=[1, 2], allocateLoadBalancerNodePorts=7)
    obj["spec"]["ports"][0]["appProtocol"] = {"x": 1}
    obj["extra"] = {"deep": [[[[{}]]]]}
    assert translate_service(obj).ports
