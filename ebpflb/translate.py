"""Kubernetes objects (as the API's JSON dicts) -> model values. Pure: no I/O, no state.

Both sources feed this module: the manifest source (YAML documents) and the Kubernetes
source (the API server's JSON), so the semantics are written once. It follows kube-proxy:
headless, ExternalName, unallocated and other-proxy Services are skipped (not errors);
anything the API server would have rejected raises InvalidObjectError naming the object.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import AddressValueError, IPv4Address, IPv4Network, NetmaskValueError, ip_address
from typing import Any

from ebpflb.errors import InvalidObjectError
from ebpflb.model import (
    Endpoint,
    NamespacedName,
    Proto,
    ServicePort,
    ServicePortName,
    ServiceType,
    TrafficPolicy,
)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SERVICE_PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ServiceTranslation:
    """The ports a Service asks ebpflb to program, or why it asks for none."""

    ref: NamespacedName
    ports: Mapping[ServicePortName, ServicePort] = field(default_factory=dict)
    skipped: str | None = None  # reason the whole Service is not ebpflb's to program
    ipv6_skipped: int = 0  # IPv6 cluster IPs ignored until IPv6 support exists


@dataclass(frozen=True, slots=True)
class SlicePort:
    name: str
    protocol: Proto
    port: int | None  # None: the controller could not resolve a named targetPort


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    address: IPv4Address
    ready: bool
    serving: bool
    terminating: bool
    node_name: str | None
    zone: str | None


@dataclass(frozen=True, slots=True)
class SliceTranslation:
    """One EndpointSlice; `skipped` set for address types ebpflb does not program."""

    ref: NamespacedName
    service: NamespacedName
    ports: tuple[SlicePort, ...] = ()
    endpoints: tuple[SliceEndpoint, ...] = ()
    skipped: str | None = None


def object_ref(obj: Obj) -> NamespacedName:
    meta = obj.get("metadata") or {}
    return NamespacedName(
        shared(str(meta.get("namespace") or "default")), str(meta.get("name") or "")
    )


def shared(text: str) -> str:
    """One copy of a string many objects repeat (namespaces, port and node names): each
    JSON document brings its own, and 100,000 services keep them for their lifetime."""
    return sys.intern(text)


def translate_service(obj: Obj) -> ServiceTranslation:
    ref = object_ref(obj)
    if not ref.name:
        raise InvalidObjectError("Service", str(ref), "metadata.name is missing")
    ref = NamespacedName(ref.namespace, shared(ref.name))  # its slices name it too
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    labels = meta.get("labels") or {}
    if SERVICE_PROXY_NAME_LABEL in labels:
        return ServiceTranslation(
            ref, skipped=f"labelled {SERVICE_PROXY_NAME_LABEL}={labels[SERVICE_PROXY_NAME_LABEL]}"
        )
    try:
        svc_type = ServiceType(spec.get("type") or "ClusterIP")
    except ValueError:
        if spec.get("type") == "ExternalName":
            return ServiceTranslation(ref, skipped="ExternalName service")
        raise InvalidObjectError(
            "Service", str(ref), f"unknown type {spec.get('type')!r}"
        ) from None

    raw_ips = list(spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else []))
    if not raw_ips:
        return ServiceTranslation(ref, skipped="no clusterIP allocated")
    if raw_ips[0] == "None":
        return ServiceTranslation(ref, skipped="headless service (clusterIP: None)")
    cluster_ips, ipv6 = _split_families(raw_ips, ref, "clusterIP")
    if not cluster_ips:
        return ServiceTranslation(ref, skipped="IPv6-only service", ipv6_skipped=ipv6)

    external_ips, _ = _split_families(spec.get("externalIPs") or [], ref, "externalIPs")
    ingress = ((obj.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    lb_ips: tuple[IPv4Address, ...] = ()
    if svc_type == ServiceType.LOAD_BALANCER:
        raw_lb = [i["ip"] for i in ingress if isinstance(i, Mapping) and i.get("ip")]
        lb_ips, _ = _split_families(raw_lb, ref, "status.loadBalancer.ingress.ip")
    source_ranges = tuple(
        _network(r, ref) for r in spec.get("loadBalancerSourceRanges") or [] if ":" not in r
    )
    etp = _policy(spec.get("externalTrafficPolicy"), ref, "externalTrafficPolicy")
    itp = _policy(spec.get("internalTrafficPolicy"), ref, "internalTrafficPolicy")
    hc_port = spec.get("healthCheckNodePort")
    if hc_port is not None:
        hc_port = _port_number(hc_port, ref, "healthCheckNodePort")

    raw_ports = spec.get("ports") or []
    if not isinstance(raw_ports, Sequence) or not raw_ports:
        raise InvalidObjectError("Service", str(ref), "spec.ports is empty")
    ports: dict[ServicePortName, ServicePort] = {}
    for index, raw in enumerate(raw_ports):
        if not isinstance(raw, Mapping):
            raise InvalidObjectError("Service", str(ref), f"spec.ports[{index}] is not a mapping")
        where = f"spec.ports[{index}]"
        port_name = shared(str(raw.get("name") or ""))
        try:
            proto = Proto.parse(raw.get("protocol"))
        except ValueError as exc:
            raise InvalidObjectError("Service", str(ref), f"{where}: {exc}") from None
        port = _port_number(raw.get("port"), ref, f"{where}.port")
        target = raw.get("targetPort", port)
        if isinstance(target, str) and target.isdigit():
            target = int(target)
        if isinstance(target, int):
            target = _port_number(target, ref, f"{where}.targetPort")
        node_port = raw.get("nodePort")
        if node_port is not None:
            node_port = _port_number(node_port, ref, f"{where}.nodePort")
        name = ServicePortName(ref, port_name, proto)
        if name in ports:
            raise InvalidObjectError(
                "Service", str(ref), f"{where}: duplicate port name {port_name!r}/{proto.name}"
            )
        ports[name] = ServicePort(
            name=name,
            type=svc_type,
            cluster_ips=cluster_ips,
            port=port,
            target_port=target,
            node_port=node_port if svc_type != ServiceType.CLUSTER_IP else None,
            external_ips=external_ips,
            load_balancer_ips=lb_ips,
            load_balancer_source_ranges=source_ranges,
            external_traffic_policy=etp,
            internal_traffic_policy=itp,
            health_check_node_port=hc_port,
        )
    return ServiceTranslation(ref, ports, ipv6_skipped=ipv6)


def translate_slice(obj: Obj) -> SliceTranslation:
    ref = object_ref(obj)
    if not ref.name:
        raise InvalidObjectError("EndpointSlice", str(ref), "metadata.name is missing")
    labels = (obj.get("metadata") or {}).get("labels") or {}
    service_name = labels.get(SERVICE_NAME_LABEL)
    if not service_name:
        raise InvalidObjectError("EndpointSlice", str(ref), f"no {SERVICE_NAME_LABEL} label")
    service = NamespacedName(ref.namespace, shared(str(service_name)))
    address_type = obj.get("addressType") or "IPv4"
    if address_type != "IPv4":
        return SliceTranslation(ref, service, skipped=f"addressType {address_type}")

    ports = []
    for index, raw in enumerate(obj.get("ports") or []):
        where = f"ports[{index}]"
        if not isinstance(raw, Mapping):
            raise InvalidObjectError("EndpointSlice", str(ref), f"{where} is not a mapping")
        try:
            proto = Proto.parse(raw.get("protocol"))
        except ValueError:
            continue  # SCTP and others: not ours, and not an error in the object
        number = raw.get("port")
        ports.append(
            SlicePort(
                shared(str(raw.get("name") or "")),
                proto,
                None
                if number is None
                else _port_number(number, ref, f"{where}.port", "EndpointSlice"),
            )
        )

    endpoints = []
    for index, raw in enumerate(obj.get("endpoints") or []):
        if not isinstance(raw, Mapping):
            raise InvalidObjectError(
                "EndpointSlice", str(ref), f"endpoints[{index}] is not a mapping"
            )
        addresses = raw.get("addresses") or []
        if not addresses:
            raise InvalidObjectError(
                "EndpointSlice", str(ref), f"endpoints[{index}] has no address"
            )
        # kube-proxy uses the first address: the others are the same pod's.
        address = _ipv4(addresses[0], ref, f"endpoints[{index}].addresses[0]", "EndpointSlice")
        conditions = raw.get("conditions") or {}
        ready = conditions.get("ready")
        serving = conditions.get("serving")
        # API semantics: nil ready means ready; nil serving follows ready.
        ready_b = True if ready is None else bool(ready)
        endpoints.append(
            SliceEndpoint(
                address=address,
                ready=ready_b,
                serving=ready_b if serving is None else bool(serving),
                terminating=bool(conditions.get("terminating") or False),
                node_name=_shared_optional(raw.get("nodeName")),
                zone=_shared_optional(raw.get("zone")),
            )
        )
    return SliceTranslation(ref, service, tuple(ports), tuple(endpoints))


def endpoints_for_port(
    port_name: ServicePortName, slices: Iterable[SliceTranslation]
) -> tuple[Endpoint, ...]:
    """Merge every slice's endpoints for one service port (joined by port name + protocol).

    An address listed by several slices (during slice churn) is kept once, preferring a
    ready copy, as kube-proxy's EndpointSliceCache does.
    """
    # Keyed and sorted by (address as an int, port): Endpoint's own order for distinct
    # keys, without hashing and comparing ipaddress objects (slow, and 100,000 services
    # go through here at start).
    merged: dict[tuple[int, int], Endpoint] = {}
    wanted_name, wanted_protocol = port_name.port_name, port_name.protocol
    for slice_ in slices:
        if slice_.skipped:
            continue
        for sp in slice_.ports:
            if sp.name != wanted_name or sp.protocol != wanted_protocol or sp.port is None:
                continue
            for ep in slice_.endpoints:
                key = (int(ep.address), sp.port)
                existing = merged.get(key)
                if existing is not None and existing.ready and not ep.ready:
                    continue
                merged[key] = Endpoint(
                    ep.address, sp.port, ep.ready, ep.serving, ep.terminating, ep.node_name, ep.zone
                )
    return tuple(merged[key] for key in sorted(merged))


def _shared_optional(value: Any) -> Any:
    return shared(value) if isinstance(value, str) else value


def _split_families(
    raw: Iterable[Any], ref: NamespacedName, what: str
) -> tuple[tuple[IPv4Address, ...], int]:
    v4: list[IPv4Address] = []
    v6 = 0
    for text in raw:
        addr = parse_ipv4(str(text))
        if addr is not None:
            v4.append(addr)
            continue
        try:
            ip_address(str(text))
        except ValueError:
            raise InvalidObjectError(
                "Service", str(ref), f"{what} {text!r} is not an IP address"
            ) from None
        v6 += 1
    return tuple(v4), v6


def parse_ipv4(text: str) -> IPv4Address | None:
    """IPv4Address(text), or None when `text` is not an IPv4 address. inet_pton is as strict
    (four decimal octets, no leading zeros) and five times faster than ipaddress's parser,
    which 300,000 endpoint addresses would otherwise go through at start."""
    try:
        return IPv4Address(socket.inet_pton(socket.AF_INET, text))
    except (OSError, ValueError):  # ValueError: an embedded NUL
        return None


def _ipv4(text: Any, ref: NamespacedName, what: str, kind: str) -> IPv4Address:
    addr = parse_ipv4(str(text))
    if addr is None:
        raise InvalidObjectError(kind, str(ref), f"{what} {text!r} is not an IPv4 address")
    return addr


def _network(text: str, ref: NamespacedName) -> IPv4Network:
    try:
        return IPv4Network(text.strip(), strict=False)
    except (AddressValueError, NetmaskValueError, ValueError):
        raise InvalidObjectError(
            "Service", str(ref), f"loadBalancerSourceRanges entry {text!r} is not a CIDR"
        ) from None


def _policy(value: Any, ref: NamespacedName, what: str) -> TrafficPolicy:
    if value in (None, ""):
        return TrafficPolicy.CLUSTER
    try:
        return TrafficPolicy(value)
    except ValueError:
        raise InvalidObjectError(
            "Service", str(ref), f"{what} {value!r} is not Cluster or Local"
        ) from None


def _port_number(value: Any, ref: NamespacedName, what: str, kind: str = "Service") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise InvalidObjectError(kind, str(ref), f"{what} {value!r} is not a port in 1-65535")
    return value
