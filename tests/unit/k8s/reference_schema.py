"""An independent statement of what ebpflb accepts: the fields it reads, as a table in the
manner of a JSON schema (the API server's OpenAPI types and its validation of those
fields), plus the few cross-field rules the API server applies to them.

The fuzz tests check that translation accepts exactly what this accepts. It shares no
code with ebpflb: addresses are parsed with `ipaddress`, not with inet_pton.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

SERVICE_NAME = "kubernetes.io/service-name"
PROXY_NAME = "service.kubernetes.io/service-proxy-name"
HEADLESS = "service.kubernetes.io/headless"


# ---- the schema language: a node checks one JSON value (null always passes: absent) ------


@dataclass(frozen=True)
class Str:
    enum: frozenset[str] | None = None
    check: Callable[[str], bool] | None = None

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and (
            (self.enum is None or value in self.enum) and (self.check is None or self.check(value))
        )


@dataclass(frozen=True)
class Int:
    low: int
    high: int

    def ok(self, value: Any) -> bool:
        return type(value) is int and self.low <= value <= self.high


@dataclass(frozen=True)
class Bool:
    def ok(self, value: Any) -> bool:
        return type(value) is bool


@dataclass(frozen=True)
class IntOrString:
    """Kubernetes' IntOrString port: 0-65535, or a string of digits meaning that number,
    or any other string (a port name)."""

    def ok(self, value: Any) -> bool:
        if isinstance(value, str):
            if not re.fullmatch(r"[0-9]+", value):
                return True
            digits = value.lstrip("0") or "0"
            return len(digits) <= 5 and int(digits) <= 65535
        return Int(0, 65535).ok(value)


@dataclass(frozen=True)
class Arr:
    """An array. A null item of an array of objects is an empty object (Go's JSON decoding
    gives the zero struct); in an array of strings it is not a string."""

    item: Any
    max_items: int | None = None

    def ok(self, value: Any) -> bool:
        return (
            isinstance(value, list)
            and (self.max_items is None or len(value) <= self.max_items)
            and all(self._item_ok(v) for v in value)
        )

    def _item_ok(self, value: Any) -> bool:
        if value is None:
            return isinstance(self.item, Obj) and self.item.ok({})
        return bool(self.item.ok(value))


@dataclass(frozen=True)
class Obj:
    fields: Mapping[str, Any]
    required: frozenset[str] = field(default_factory=frozenset)

    def ok(self, value: Any) -> bool:
        return (
            isinstance(value, dict)
            and all(_ok(node, value.get(name)) for name, node in self.fields.items())
            and all(value.get(name) not in (None, "", []) for name in self.required)
        )


@dataclass(frozen=True)
class StringMap:
    def ok(self, value: Any) -> bool:
        return isinstance(value, dict) and all(
            v is None or isinstance(v, str) for v in value.values()
        )


def _ok(node: Any, value: Any) -> bool:
    return value is None or bool(node.ok(value))


# ---- formats ----------------------------------------------------------------------------


def is_ip(text: str) -> bool:
    if "%" in text:  # an IPv6 zone: not an address the API server accepts
        return False
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_ipv6(text: str) -> bool:
    if "%" in text:  # a zone: ipaddress takes it, the API server does not
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def is_cidr(text: str) -> bool:
    """ADDRESS/PREFIX with a decimal prefix; surrounding whitespace is trimmed."""
    match = re.fullmatch(r"(.+)/([0-9]{1,3})", text.strip())
    if not match or not is_ip(match[1]):
        return False
    return int(match[2]) <= (32 if is_ipv4(match[1]) else 128)


# ---- Service ----------------------------------------------------------------------------

PROTOCOLS = frozenset({"", "TCP", "UDP", "SCTP"})
METADATA = Obj({"name": Str(), "namespace": Str(), "labels": StringMap()}, frozenset({"name"}))
SERVICE = Obj(
    {
        "metadata": METADATA,
        "spec": Obj(
            {
                "type": Str(
                    frozenset({"", "ClusterIP", "NodePort", "LoadBalancer", "ExternalName"})
                ),
                "clusterIP": Str(check=lambda s: s in ("", "None") or is_ip(s)),
                "clusterIPs": Arr(Str(check=lambda s: s == "None" or is_ip(s))),
                "externalIPs": Arr(Str(check=is_ip)),
                "loadBalancerSourceRanges": Arr(Str(check=is_cidr)),
                "externalTrafficPolicy": Str(frozenset({"", "Cluster", "Local"})),
                "internalTrafficPolicy": Str(frozenset({"", "Cluster", "Local"})),
                "healthCheckNodePort": Int(0, 65535),
                "ports": Arr(
                    Obj(
                        {
                            "name": Str(),
                            "protocol": Str(PROTOCOLS),
                            "port": Int(1, 65535),
                            "targetPort": IntOrString(),
                            "nodePort": Int(0, 65535),
                        },
                        frozenset({"port"}),
                    )
                ),
            }
        ),
        "status": Obj(
            {
                "loadBalancer": Obj(
                    {"ingress": Arr(Obj({"ip": Str(check=lambda s: s == "" or is_ip(s))}))}
                )
            }
        ),
    },
    frozenset({"metadata"}),
)


@dataclass(frozen=True)
class Verdict:
    valid: bool
    skipped: bool = False  # valid, but nothing for ebpflb to program
    ports: frozenset[tuple[str, str]] = frozenset()  # (name, protocol) programmed


INVALID = Verdict(False)


def service_verdict(obj: Any) -> Verdict:
    if not SERVICE.ok(obj):
        return INVALID
    spec = obj.get("spec") or {}
    cluster_ip = spec.get("clusterIP") or ""
    cluster_ips = spec.get("clusterIPs") or []
    if cluster_ips and cluster_ip and cluster_ips[0] != cluster_ip:
        return INVALID  # clusterIPs[0] must be clusterIP
    if "None" in cluster_ips and cluster_ips != ["None"]:
        return INVALID  # "None" (headless) stands alone
    if "" in cluster_ips:
        return INVALID
    headless = (cluster_ips or [cluster_ip])[0] == "None"
    external_name = spec.get("type") == "ExternalName"
    ports = spec.get("ports") or []
    if not ports and not headless and not external_name:
        return INVALID  # ports are required but of headless and ExternalName Services
    keys = [(p.get("name") or "", p.get("protocol") or "TCP") for p in ports]
    programmable = [k for k in keys if k[1] != "SCTP"]
    if len(set(programmable)) != len(programmable):
        return INVALID  # two ports with one name and protocol
    labels = (obj.get("metadata") or {}).get("labels") or {}
    allocated = [ip for ip in (cluster_ips or [cluster_ip]) if ip and ip != "None"]
    # kube-proxy's selector: either label present, whatever its value, skips the Service.
    if PROXY_NAME in labels or HEADLESS in labels or external_name or headless or not allocated:
        return Verdict(True, skipped=True)
    return Verdict(True, ports=frozenset(programmable))


# ---- EndpointSlice ----------------------------------------------------------------------

SLICE = Obj(
    {
        "metadata": METADATA,
        "addressType": Str(frozenset({"IPv4", "IPv6", "FQDN"})),
        "ports": Arr(
            Obj({"name": Str(), "protocol": Str(PROTOCOLS), "port": Int(1, 65535)}),
            max_items=100,
        ),
        "endpoints": Arr(
            Obj(
                {
                    "addresses": Arr(Str(), max_items=100),
                    "conditions": Obj({"ready": Bool(), "serving": Bool(), "terminating": Bool()}),
                    "nodeName": Str(),
                    "zone": Str(),
                },
                frozenset({"addresses"}),
            ),
            max_items=1000,
        ),
    },
    frozenset({"metadata", "addressType"}),
)


@dataclass(frozen=True)
class SliceVerdict:
    valid: bool
    skipped: bool = False
    # Per endpoint: (first address, ready, serving, terminating) as kube-proxy reads them.
    endpoints: tuple[tuple[str, bool, bool, bool], ...] = ()


def slice_verdict(obj: Any) -> SliceVerdict:
    if not SLICE.ok(obj):
        return SliceVerdict(False)
    labels = obj["metadata"].get("labels") or {}
    if not labels.get(SERVICE_NAME):
        return SliceVerdict(False)
    family = {"IPv4": is_ipv4, "IPv6": is_ipv6}.get(obj["addressType"])
    endpoints = []
    for ep in obj.get("endpoints") or []:
        addresses = ep["addresses"]
        if family is not None and not all(family(a) for a in addresses):
            return SliceVerdict(False)
        conditions = ep.get("conditions") or {}
        endpoints.append(
            (
                addresses[0],
                conditions.get("ready") is not False,
                conditions.get("serving") is not False,
                conditions.get("terminating") is True,
            )
        )
    if family is None:
        return SliceVerdict(True, skipped=True)
    return SliceVerdict(True, endpoints=tuple(endpoints))
