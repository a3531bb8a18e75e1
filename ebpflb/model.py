"""Pure value types shared by every layer: what a Service means, not its API shape.

Addresses are ``ipaddress`` objects (``IPAddress``: IPv4Address or IPv6Address, the family
being the object's type) and ports host-order ints everywhere in Python; conversion to the
kernel's byte order happens only in ``ebpflb.datapath.maps.layout``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import TypeAlias

IPAddress: TypeAlias = IPv4Address | IPv6Address
IPNetwork: TypeAlias = IPv4Network | IPv6Network


def family_of(address: IPAddress) -> int:
    """4 or 6: which family's maps and endpoints an address belongs to."""
    return address.version


def host_port(address: IPAddress, port: int) -> str:
    """An address and port as text, unambiguous for IPv6: 10.0.0.1:80, [fd00::1]:80."""
    return f"{address}:{port}" if address.version == 4 else f"[{address}]:{port}"


class Proto(enum.IntEnum):
    """L4 protocols ebpflb balances; values are IPPROTO_* numbers as the datapath uses them."""

    TCP = 6
    UDP = 17

    @classmethod
    def parse(cls, text: str | None) -> Proto:
        """Kubernetes protocol string (default TCP) -> Proto; ValueError for SCTP and others."""
        name = (text or "TCP").upper()
        try:
            return cls[name]
        except KeyError:
            raise ValueError(f"unsupported protocol {text!r} (TCP and UDP are)") from None


class ServiceType(enum.Enum):
    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    LOAD_BALANCER = "LoadBalancer"


class TrafficPolicy(enum.Enum):
    CLUSTER = "Cluster"
    LOCAL = "Local"


class Scope(enum.IntEnum):
    """Which backend set a frontend entry describes: LB_SCOPE_* in bpf/lib/consts.h
    (checked against the header by tests/unit/datapath/test_contract.py, as the flags below)."""

    EXTERNAL = 0
    INTERNAL = 1


class SvcFlags(enum.IntFlag):
    """SVC_F_* in bpf/lib/consts.h."""

    NONE = 0
    CLUSTER_IP = 1 << 0
    NODE_PORT = 1 << 1
    LOADBALANCER = 1 << 2
    EXTERNAL_IP = 1 << 3
    TERMINATING = 1 << 4
    ETP_LOCAL = 1 << 5
    SOURCE_RANGES = 1 << 6
    ITP_LOCAL = 1 << 7
    INTERNAL_SCOPE = 1 << 8
    AFFINITY = 1 << 9
    REJECT = 1 << 10
    EXTERNAL = NODE_PORT | LOADBALANCER | EXTERNAL_IP  # frontends the tc/xdp programs serve

    def type_name(self) -> str:
        """The frontend's service type as `maps dump` prints it."""
        for flag, name in _TYPE_NAMES:
            if self & flag:
                return name
        return "Unknown"


_TYPE_NAMES = (
    (SvcFlags.CLUSTER_IP, "ClusterIP"),
    (SvcFlags.NODE_PORT, "NodePort"),
    (SvcFlags.LOADBALANCER, "LoadBalancer"),
    (SvcFlags.EXTERNAL_IP, "ExternalIP"),
)


class BackendFlags(enum.IntFlag):
    """BE_F_* in bpf/lib/consts.h."""

    NONE = 0
    LOCAL = 1 << 0
    TERMINATING = 1 << 1


@dataclass(frozen=True, slots=True, order=True)
class NamespacedName:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True, order=True)
class ServicePortName:
    """One port of one Service: the unit kube-proxy (and ebpflb) programs."""

    service: NamespacedName
    port_name: str
    protocol: Proto

    def __str__(self) -> str:
        # kube-proxy's spelling: "ns/name:port" (":" even when the port is unnamed).
        return f"{self.service}:{self.port_name}"


@dataclass(frozen=True, slots=True)
class ServicePort:
    """What one Service port asks of the proxy, translated from the API object."""

    name: ServicePortName
    type: ServiceType
    cluster_ips: tuple[IPAddress, ...]  # both families on a dual-stack Service
    port: int
    target_port: int | str
    node_port: int | None = None
    external_ips: tuple[IPAddress, ...] = ()
    load_balancer_ips: tuple[IPAddress, ...] = ()
    # Both families; each family's frontends are filtered by that family's ranges only.
    load_balancer_source_ranges: tuple[IPNetwork, ...] = ()
    external_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    internal_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    health_check_node_port: int | None = None
    # sessionAffinity=ClientIP: seconds a client keeps its backend after its last new
    # connection (sessionAffinityConfig.clientIP.timeoutSeconds); 0: no affinity.
    affinity_timeout: int = 0

    @property
    def protocol(self) -> Proto:
        return self.name.protocol


@dataclass(frozen=True, slots=True, order=True)
class Endpoint:
    """One endpoint address of one Service port, with kube-proxy's conditions."""

    address: IPAddress
    port: int
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    node_name: str | None = None
    zone: str | None = None
    # EndpointSlice hints (endpoints[].hints.forZones[].name, .forNodes[].name): where the
    # EndpointSlice controller wants this endpoint used (topology-aware routing,
    # trafficDistribution); empty: no hint.
    zone_hints: tuple[str, ...] = ()
    node_hints: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, order=True)
class Frontend:
    """An address clients use to reach a service port: the key of ebpflb_svc4 (IPv4) or
    ebpflb_svc6 (IPv6). Do not sort mixed families with `<` (ipaddress refuses to compare
    them): sort keys put the family first (reconcile.state.frontend_order)."""

    address: IPAddress
    port: int
    protocol: Proto
    scope: Scope = Scope.EXTERNAL

    def __str__(self) -> str:
        suffix = "" if self.scope == Scope.EXTERNAL else "/internal"
        return f"{host_port(self.address, self.port)}/{self.protocol.name}{suffix}"


@dataclass(frozen=True, slots=True, order=True)
class Backend:
    """Where a frontend is translated to; shared by every service using it. Its family is
    its frontend's: an IPv6 frontend's table names IPv6 backends only."""

    address: IPAddress
    port: int
    protocol: Proto

    def __str__(self) -> str:
        # The Maglev name: identical on every node for the same endpoint.
        return host_port(self.address, self.port)
