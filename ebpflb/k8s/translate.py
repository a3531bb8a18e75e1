"""Kubernetes objects (as the API's JSON dicts) -> model values. Pure: no I/O, no state.

Both sources feed this module: the manifest source (YAML documents) and the Kubernetes
source (the API server's JSON), so the semantics are written once. It follows kube-proxy:
headless, ExternalName, unallocated and other-proxy Services are skipped (not errors);
anything the API server would have rejected raises InvalidObjectError naming the object and
the field: every field read is type-checked first (`ebpflb.k8s.fields`), whichever source the
object came from. Ports of protocols ebpflb does not program (SCTP) are left out and
listed, never the reason to drop a Service's other ports.

Over 400 lines on purpose: one pass over the Service and EndpointSlice schema, field by
field, with each field's checks; the API's shape is the structure.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ebpflb.errors import Fault
from ebpflb.k8s.fields import Reader, identify, labels, parse_ipv4, parse_ipv6, show
from ebpflb.model import (
    Endpoint,
    IPAddress,
    NamespacedName,
    Proto,
    ServicePort,
    ServicePortName,
    ServiceType,
    TrafficPolicy,
)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SERVICE_PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"
# Set on a Service that no proxy should program (kube-proxy lists Services without it).
HEADLESS_LABEL = "service.kubernetes.io/headless"
# Set by the EndpointSlice controller to when the change it writes was triggered (RFC 3339).
TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ServiceTranslation:
    """The ports a Service asks ebpflb to program, or why it asks for none."""

    ref: NamespacedName
    ports: Mapping[ServicePortName, ServicePort] = field(default_factory=dict)
    skipped: str | None = None  # reason the whole Service is not ebpflb's to program
    skipped_ports: tuple[SkippedPort, ...] = ()  # ports of protocols ebpflb does not program


@dataclass(frozen=True, slots=True)
class SkippedPort:
    """A Service port left out (its protocol is not programmed); the others still are."""

    field: str  # spec.ports[i]
    name: str
    port: int
    protocol: str

    def __str__(self) -> str:
        return f"{self.field} ({self.name or 'unnamed'}, {self.port}/{self.protocol})"


@dataclass(frozen=True, slots=True)
class SlicePort:
    name: str
    protocol: Proto
    port: int | None  # None: the controller could not resolve a named targetPort


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    address: IPAddress  # of the slice's address type
    ready: bool
    serving: bool
    terminating: bool
    node_name: str | None
    zone: str | None
    zone_hints: tuple[str, ...] = ()
    node_hints: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SliceTranslation:
    """One EndpointSlice; `skipped` set for address types ebpflb does not program (FQDN).
    Its endpoints serve the frontends of its own family only (`family`: 4 or 6), as
    kube-proxy runs one proxier per family."""

    ref: NamespacedName
    service: NamespacedName
    family: int = 4
    ports: tuple[SlicePort, ...] = ()
    endpoints: tuple[SliceEndpoint, ...] = ()
    skipped: str | None = None
    # Unix time of its last-change-trigger-time annotation, None without a valid one. Not
    # part of what the slice means (compare=False): a slice differing only here programs
    # nothing new, as in kube-proxy's endpoint slice cache.
    trigger_time: float | None = field(default=None, compare=False)


def object_ref(obj: Obj) -> NamespacedName:
    """The namespace/name a source keys an API server object by (it has one: the API server
    validated it). Translation reads it strictly instead (`fields.identify`)."""
    meta = obj.get("metadata") or {}
    return NamespacedName(
        shared(str(meta.get("namespace") or "default")), str(meta.get("name") or "")
    )


def shared(text: str) -> str:
    """One copy of a string many objects repeat (namespaces, port and node names): each
    JSON document brings its own, and 100,000 services keep them for their lifetime."""
    return sys.intern(text)


_SERVICE_TYPES = {
    "": ServiceType.CLUSTER_IP,  # the API's default
    "ClusterIP": ServiceType.CLUSTER_IP,
    "NodePort": ServiceType.NODE_PORT,
    "LoadBalancer": ServiceType.LOAD_BALANCER,
    "ExternalName": None,  # a DNS alias: nothing for a proxy to program
}
_PROTOCOLS = {"": Proto.TCP, "TCP": Proto.TCP, "UDP": Proto.UDP, "SCTP": None}  # None: skipped
_POLICIES = {
    "": TrafficPolicy.CLUSTER,
    "Cluster": TrafficPolicy.CLUSTER,
    "Local": TrafficPolicy.LOCAL,
}
_ADDRESS_TYPES = ("IPv4", "IPv6", "FQDN")
_FAMILIES = {"IPv4": 4, "IPv6": 6}
_FAMILY_POLICIES = ("", "SingleStack", "PreferDualStack", "RequireDualStack")
# The API server's limits on one EndpointSlice (pkg/apis/discovery/validation).
MAX_SLICE_ENDPOINTS, MAX_SLICE_ADDRESSES, MAX_SLICE_PORTS = 1000, 100, 100


def translate_service(obj: Obj) -> ServiceTranslation:
    """A Service's ports, every field ebpflb reads checked first as the API server would
    (so a skipped Service is as valid as a programmed one), then kube-proxy's skips."""
    ref, r, meta = identify(obj, "Service")
    ref = NamespacedName(shared(ref.namespace), shared(ref.name))  # its slices name it too
    service_labels = labels(r, meta)
    # kube-proxy lists Services with neither label (its selector is "does not exist"):
    # either one, whatever its value (even empty), leaves the Service to someone else.
    proxy_label = (
        service_labels[SERVICE_PROXY_NAME_LABEL] or ""  # null reads as "", as the API's
        if SERVICE_PROXY_NAME_LABEL in service_labels
        else None
    )
    headless_label = HEADLESS_LABEL in service_labels
    spec = r.mapping(obj.get("spec"), "spec")

    type_text = r.string(spec.get("type"), "spec.type")
    if type_text not in _SERVICE_TYPES:
        r.fail(
            "spec.type",
            f"{show(type_text)} is not ClusterIP, NodePort, LoadBalancer or ExternalName",
        )
    svc_type = _SERVICE_TYPES[type_text]
    # clusterIPs (dual-stack) when given, else the older clusterIP; "" is "not allocated".
    cluster_ip = r.string(spec.get("clusterIP"), "spec.clusterIP")
    raw_ips = r.strings(spec.get("clusterIPs"), "spec.clusterIPs")
    if raw_ips:
        if cluster_ip and raw_ips[0] != cluster_ip:
            r.fail("spec.clusterIPs[0]", f"{show(raw_ips[0])} differs from spec.clusterIP")
        headless = raw_ips[0] == "None"
        if headless and len(raw_ips) > 1:
            r.fail("spec.clusterIPs", "lists None (headless) with addresses")
        allocated = True
    else:
        headless, allocated = cluster_ip == "None", bool(cluster_ip)
    cluster_ips: tuple[IPAddress, ...] = ()
    if raw_ips and not headless:
        cluster_ips = r.addresses(raw_ips, "spec.clusterIPs")
    elif allocated and not headless:
        cluster_ips = r.addresses((cluster_ip,), "spec.clusterIP", single=True)
    _check_families(r, spec, cluster_ips)
    external_ips = r.addresses(
        r.strings(spec.get("externalIPs"), "spec.externalIPs"), "spec.externalIPs"
    )
    ranges_field = "spec.loadBalancerSourceRanges"
    # Both families: each family's LoadBalancer IPs are filtered by its own (desired.py).
    source_ranges = tuple(
        r.cidr(text, f"{ranges_field}[{i}]")
        for i, text in enumerate(r.strings(spec.get("loadBalancerSourceRanges"), ranges_field))
    )
    etp = _policy(r, spec.get("externalTrafficPolicy"), "spec.externalTrafficPolicy")
    itp = _policy(r, spec.get("internalTrafficPolicy"), "spec.internalTrafficPolicy")
    hc_port = r.port(spec.get("healthCheckNodePort"), "spec.healthCheckNodePort", zero=True)
    affinity = _affinity_timeout(r, spec)
    lb_ips = _ingress_ips(r, obj.get("status"))
    raw_ports = r.array(spec.get("ports"), "spec.ports")
    ports, skipped_ports = _service_ports(r, ref, raw_ports)

    if not raw_ports and svc_type is not None and not headless:
        r.fail("spec.ports", "is empty", Fault.MISSING)  # as the API server requires

    if proxy_label is not None:
        return ServiceTranslation(ref, skipped=f"labelled {SERVICE_PROXY_NAME_LABEL}={proxy_label}")
    if headless_label:
        return ServiceTranslation(ref, skipped=f"labelled {HEADLESS_LABEL}")
    if svc_type is None:
        return ServiceTranslation(ref, skipped="ExternalName service")
    if headless:
        return ServiceTranslation(ref, skipped="headless service (clusterIP: None)")
    if not allocated:
        return ServiceTranslation(ref, skipped="no clusterIP allocated")
    families = {ip.version for ip in cluster_ips}
    # kube-proxy's proxier of a family programs a Service only with a cluster IP of that
    # family: its external addresses of another family are not programmed (nor counted).
    external_ips = tuple(ip for ip in external_ips if ip.version in families)
    lb_ips = tuple(ip for ip in lb_ips if ip.version in families)
    programmed = {
        name: ServicePort(
            name=name,
            type=svc_type,
            cluster_ips=cluster_ips,
            port=port,
            target_port=target,
            node_port=node_port if svc_type is not ServiceType.CLUSTER_IP else None,
            external_ips=external_ips,
            load_balancer_ips=lb_ips if svc_type is ServiceType.LOAD_BALANCER else (),
            load_balancer_source_ranges=source_ranges,
            external_traffic_policy=etp,
            internal_traffic_policy=itp,
            health_check_node_port=hc_port,
            affinity_timeout=affinity,
        )
        for name, (port, target, node_port) in ports.items()
    }
    return ServiceTranslation(ref, programmed, skipped_ports=skipped_ports)


# kube-proxy's (and the API's) default and limit for sessionAffinityConfig.clientIP.timeoutSeconds.
DEFAULT_AFFINITY_TIMEOUT, MAX_AFFINITY_TIMEOUT = 10800, 86400


def _affinity_timeout(r: Reader, spec: Mapping[str, Any]) -> int:
    """spec.sessionAffinity ("None" or "ClientIP") and its timeout; 0 for no affinity."""
    mode = r.string(spec.get("sessionAffinity"), "spec.sessionAffinity")
    if mode not in ("", "None", "ClientIP"):
        r.fail("spec.sessionAffinity", f"{show(mode)} is not None or ClientIP")
    config = r.mapping(spec.get("sessionAffinityConfig"), "spec.sessionAffinityConfig")
    client_ip = r.mapping(config.get("clientIP"), "spec.sessionAffinityConfig.clientIP")
    where = "spec.sessionAffinityConfig.clientIP.timeoutSeconds"
    raw = client_ip.get("timeoutSeconds")
    timeout = DEFAULT_AFFINITY_TIMEOUT if raw is None else (r.integer(raw, where) or 0)
    if mode != "ClientIP":
        return 0
    if not 0 < timeout <= MAX_AFFINITY_TIMEOUT:
        r.fail(where, f"{timeout} is not in 1-{MAX_AFFINITY_TIMEOUT}")
    return timeout


def _service_ports(
    r: Reader, ref: NamespacedName, raw_ports: Sequence[Any]
) -> tuple[dict[ServicePortName, tuple[int, int | str, int | None]], tuple[SkippedPort, ...]]:
    """spec.ports: (port, targetPort, nodePort) by name, and the ports left out (SCTP)."""
    ports: dict[ServicePortName, tuple[int, int | str, int | None]] = {}
    skipped: list[SkippedPort] = []
    for index, raw in enumerate(raw_ports):
        where = f"spec.ports[{index}]"
        raw = r.mapping(raw, where)
        port_name = shared(r.string(raw.get("name"), f"{where}.name"))
        protocol_text = r.string(raw.get("protocol"), f"{where}.protocol")
        if protocol_text not in _PROTOCOLS:
            r.fail(f"{where}.protocol", f"{show(protocol_text)} is not TCP, UDP or SCTP")
        port = r.port(raw.get("port"), f"{where}.port")
        if port is None:
            r.fail(f"{where}.port", "is missing", Fault.MISSING)
        target = _target_port(r, raw.get("targetPort"), f"{where}.targetPort") or port
        node_port = r.port(raw.get("nodePort"), f"{where}.nodePort", zero=True)
        proto = _PROTOCOLS[protocol_text]
        if proto is None:
            skipped.append(SkippedPort(where, port_name, port, protocol_text))
            continue
        name = ServicePortName(ref, port_name, proto)
        if name in ports:
            r.fail(where, f"duplicate port name {port_name!r}/{proto.name}")
        ports[name] = (port, target, node_port)
    return ports, tuple(skipped)


def _target_port(r: Reader, value: Any, field: str) -> int | str | None:
    """IntOrString: a number, a number as a string, or a container port's name; None
    (meaning "the port itself") when absent, 0 or empty, as the API defaults it."""
    if isinstance(value, str):
        if not value:
            return None
        if not value.isascii() or not value.isdigit():
            return value  # a name, resolved by the EndpointSlice controller
        if len(value.lstrip("0")) > 5:  # not a port (and int() refuses 4,300 digits)
            r.fail(field, f"{show(value)} is not a port in 1-65535")
        value = int(value)
    if r.integer(value, field) == 0:
        return None
    return r.port(value, field)


def _check_families(r: Reader, spec: Mapping[str, Any], cluster_ips: Sequence[IPAddress]) -> None:
    """spec.ipFamilies and spec.ipFamilyPolicy, checked as the API server does. What is
    programmed follows the cluster IPs themselves (kube-proxy's GetClusterIPByFamily): the
    API server allocated them in ipFamilies' order."""
    policy = r.string(spec.get("ipFamilyPolicy"), "spec.ipFamilyPolicy")
    if policy not in _FAMILY_POLICIES:
        r.fail(
            "spec.ipFamilyPolicy",
            f"{show(policy)} is not SingleStack, PreferDualStack or RequireDualStack",
        )
    families = r.strings(spec.get("ipFamilies"), "spec.ipFamilies")
    for i, name in enumerate(families):
        if name not in _FAMILIES:
            r.fail(f"spec.ipFamilies[{i}]", f"{show(name)} is not IPv4 or IPv6")
    if len(families) > 2 or len(set(families)) != len(families):
        r.fail("spec.ipFamilies", "holds more than one entry per family")
    if policy == "SingleStack" and len(families) > 1:
        r.fail("spec.ipFamilies", "lists two families for ipFamilyPolicy SingleStack")
    for i, (name, ip) in enumerate(zip(families, cluster_ips, strict=False)):
        if _FAMILIES[name] != ip.version:
            r.fail(f"spec.clusterIPs[{i}]", f"{ip} is not of ipFamilies[{i}] {name}")


def _ingress_ips(r: Reader, status: Any) -> tuple[IPAddress, ...]:
    """status.loadBalancer.ingress[].ip: both families (a hostname-only ingress has none)
    whose ipMode is VIP (the default). With ipMode Proxy the load balancer proxies to the
    nodePorts itself, and kube-proxy (serviceport.go, 1.30+) leaves the IP alone: traffic
    from inside the cluster goes out to the load balancer rather than being short-circuited
    to the endpoints, so the load balancer's features (TLS, PROXY protocol) still apply."""
    balancer = r.mapping(r.mapping(status, "status").get("loadBalancer"), "status.loadBalancer")
    found = []
    for i, ingress in enumerate(r.array(balancer.get("ingress"), "status.loadBalancer.ingress")):
        where = f"status.loadBalancer.ingress[{i}]"
        entry = r.mapping(ingress, where)
        text = r.string(entry.get("ip"), f"{where}.ip")
        mode = r.string(entry.get("ipMode"), f"{where}.ipMode")
        if mode not in ("", "VIP", "Proxy"):
            r.fail(f"{where}.ipMode", f"{show(mode)} is not VIP or Proxy")
        if text:  # "": a hostname-only ingress
            address = r.ip(text, f"{where}.ip")
            if mode != "Proxy":
                found.append(address)
    return tuple(found)


def translate_slice(obj: Obj) -> SliceTranslation:
    """An EndpointSlice's ports and endpoints, every field ebpflb reads checked first."""
    ref, r, meta = identify(obj, "EndpointSlice")
    ref = NamespacedName(shared(ref.namespace), ref.name)
    service_name = labels(r, meta).get(SERVICE_NAME_LABEL)
    if not service_name:
        r.fail("metadata.labels", f"has no {SERVICE_NAME_LABEL} label", Fault.MISSING)
    service = NamespacedName(ref.namespace, shared(service_name))
    trigger_time = _trigger_time(r, meta)
    address_type = r.string(obj.get("addressType"), "addressType")
    if not address_type:
        r.fail("addressType", "is missing", Fault.MISSING)
    if address_type not in _ADDRESS_TYPES:
        r.fail("addressType", f"{show(address_type)} is not IPv4, IPv6 or FQDN")
    family = _FAMILIES.get(address_type, 0)  # 0: FQDN, not programmed
    parse = parse_ipv4 if family == 4 else parse_ipv6

    ports = []
    for index, raw in enumerate(r.array(obj.get("ports"), "ports", MAX_SLICE_PORTS)):
        where = f"ports[{index}]"
        raw = r.mapping(raw, where)
        name = r.string(raw.get("name"), f"{where}.name")
        protocol_text = r.string(raw.get("protocol"), f"{where}.protocol")
        if protocol_text not in _PROTOCOLS:
            r.fail(f"{where}.protocol", f"{show(protocol_text)} is not TCP, UDP or SCTP")
        number = r.port(raw.get("port"), f"{where}.port")  # None: a name not resolved
        proto = _PROTOCOLS[protocol_text]
        if proto is not None:  # SCTP: ebpflb programs no SCTP port (the Service says so)
            ports.append(SlicePort(shared(name), proto, number))

    # The loop below runs for every endpoint of the cluster (300,000 at 100,000 services):
    # each check is a type test, and a field's path is only spelled out for its error.
    endpoints = []
    raw_endpoints = r.array(obj.get("endpoints"), "endpoints", MAX_SLICE_ENDPOINTS)
    for index, raw in enumerate(raw_endpoints):
        if type(raw) is not dict:
            raw = r.mapping(raw, f"endpoints[{index}]")
        addresses = raw.get("addresses")
        if type(addresses) is not list or not 0 < len(addresses) <= MAX_SLICE_ADDRESSES:
            where = f"endpoints[{index}].addresses"
            if not r.array(addresses, where, MAX_SLICE_ADDRESSES):
                r.fail(where, "is empty", Fault.MISSING)
        first: IPAddress | None = None
        for i, text in enumerate(addresses):
            if not isinstance(text, str):
                r.wrong_type(f"endpoints[{index}].addresses[{i}]", text, "a string")
            if family:
                address = parse(text)
                if address is None:
                    where = f"endpoints[{index}].addresses[{i}]"
                    r.fail(where, f"{show(text)} is not an {address_type} address")
                if first is None:
                    first = address
        conditions = raw.get("conditions")
        if type(conditions) is not dict:
            conditions = r.mapping(conditions, f"endpoints[{index}].conditions")
        ready = conditions.get("ready")
        serving = conditions.get("serving")
        terminating = conditions.get("terminating")
        for condition, value in (
            ("ready", ready),
            ("serving", serving),
            ("terminating", terminating),
        ):
            if value is not None and type(value) is not bool:
                r.wrong_type(f"endpoints[{index}].conditions.{condition}", value, "a boolean")
        node_name = raw.get("nodeName")
        zone = raw.get("zone")
        if node_name is not None and not isinstance(node_name, str):
            r.wrong_type(f"endpoints[{index}].nodeName", node_name, "a string")
        if zone is not None and not isinstance(zone, str):
            r.wrong_type(f"endpoints[{index}].zone", zone, "a string")
        zone_hints, node_hints = _hints(r, raw.get("hints"), f"endpoints[{index}].hints")
        if first is None:
            continue  # an FQDN slice: checked, not programmed
        # kube-proxy (endpointslicecache.go): unset ready and serving mean true, unset
        # terminating false. The first address is the endpoint; the others are the same pod's.
        endpoints.append(
            SliceEndpoint(
                address=first,
                ready=ready is not False,
                serving=serving is not False,
                terminating=terminating is True,
                node_name=shared(node_name) if node_name else None,
                zone=shared(zone) if zone else None,
                zone_hints=zone_hints,
                node_hints=node_hints,
            )
        )
    if not family:
        return SliceTranslation(ref, service, skipped=f"addressType {address_type}")
    return SliceTranslation(
        ref, service, family, tuple(ports), tuple(endpoints), None, trigger_time
    )


def parse_trigger_time(text: str) -> float | None:
    """An RFC 3339 time (the controller writes Go's RFC3339Nano) as unix time; None when it
    is not one: kube-proxy ignores such a value (getLastChangeTriggerTime), the slice stays."""
    if not _RFC3339.fullmatch(text):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _trigger_time(r: Reader, meta: Mapping[Any, Any]) -> float | None:
    annotations = r.mapping(meta.get("annotations"), "metadata.annotations")
    value = annotations.get(TRIGGER_TIME_ANNOTATION)
    return parse_trigger_time(value) if isinstance(value, str) else None


def endpoints_for_port(
    port_name: ServicePortName, slices: Iterable[SliceTranslation]
) -> tuple[Endpoint, ...]:
    """Merge every slice's endpoints for one service port (joined by port name + protocol).

    An address listed by several slices (during slice churn) is kept once, preferring a
    ready copy, as kube-proxy's EndpointSliceCache does.
    """
    # Keyed and sorted by (family, address as an int, port): Endpoint's own order for
    # distinct keys of one family, without hashing and comparing ipaddress objects (slow,
    # and 100,000 services go through here at start). The family keeps an IPv4 endpoint
    # and an IPv6 one of the same number apart.
    merged: dict[tuple[int, int, int], Endpoint] = {}
    wanted_name, wanted_protocol = port_name.port_name, port_name.protocol
    for slice_ in slices:
        if slice_.skipped:
            continue
        for sp in slice_.ports:
            if sp.name != wanted_name or sp.protocol != wanted_protocol or sp.port is None:
                continue
            for ep in slice_.endpoints:
                key = (slice_.family, int(ep.address), sp.port)
                existing = merged.get(key)
                if existing is not None and existing.ready and not ep.ready:
                    continue
                merged[key] = Endpoint(
                    ep.address,
                    sp.port,
                    ep.ready,
                    ep.serving,
                    ep.terminating,
                    ep.node_name,
                    ep.zone,
                    ep.zone_hints,
                    ep.node_hints,
                )
    return tuple(merged[key] for key in sorted(merged))


def _hints(r: Reader, value: Any, field: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """endpoints[].hints: (forZones names, forNodes names), each sorted."""
    if value is None:
        return (), ()
    hints = r.mapping(value, field)
    found: list[tuple[str, ...]] = []
    for key in ("forZones", "forNodes"):
        names = set()
        for i, item in enumerate(r.array(hints.get(key), f"{field}.{key}")):
            where = f"{field}.{key}[{i}]"
            name = r.string(r.mapping(item, where).get("name"), f"{where}.name")
            if not name:
                r.fail(f"{where}.name", "is empty", Fault.MISSING)
            names.add(shared(name))
        found.append(tuple(sorted(names)))
    return found[0], found[1]


def _policy(r: Reader, value: Any, field: str) -> TrafficPolicy:
    text = r.string(value, field)
    if text not in _POLICIES:
        r.fail(field, f"{show(text)} is not Cluster or Local")
    return _POLICIES[text]
