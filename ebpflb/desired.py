"""Service state -> the frontends and weighted backends the maps should hold. Pure.

Endpoint choice follows kube-proxy: ready endpoints serve; when none is ready, endpoints
that are still serving while terminating do (so a rolling update of a one-replica
Deployment does not refuse connections); with neither, the frontend refuses.

A Service's externalIPs are programmed only inside the node's allow-list
(`ExternalIPPolicy`, --external-ip-cidrs; empty by default): CVE-2020-8554.

About 400 lines: the node's view (NodeView, the externalIP policy) and the frontends it
yields share kube-proxy's categorization; split, each half would import the other's.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace
from ipaddress import IPv4Address, IPv4Network, IPv6Network

from ebpflb.config import Config
from ebpflb.k8s.trackers import ServiceState
from ebpflb.model import (
    Backend,
    BackendFlags,
    Endpoint,
    Frontend,
    IPAddress,
    IPNetwork,
    Scope,
    ServicePort,
    ServicePortName,
    SvcFlags,
    TrafficPolicy,
)

DEFAULT_WEIGHT = 1


@dataclass(frozen=True, slots=True, order=True)
class WeightedBackend:
    backend: Backend
    weight: int = DEFAULT_WEIGHT
    flags: BackendFlags = BackendFlags.NONE


@dataclass(frozen=True, slots=True)
class DesiredFrontend:
    """One entry of ebpflb_svc4 as it should be, with the backends its table spreads over."""

    frontend: Frontend
    service: ServicePortName
    flags: SvcFlags
    backends: tuple[WeightedBackend, ...]  # sorted: equal sets compare equal
    # loadBalancerSourceRanges of the frontend's family (LB IPs only)
    source_ranges: tuple[IPNetwork, ...] = ()
    affinity_timeout: int = 0  # sessionAffinity=ClientIP seconds (with SvcFlags.AFFINITY)

    @property
    def usable(self) -> bool:
        return any(b.weight > 0 for b in self.backends)


@dataclass(frozen=True, slots=True)
class ExternalIPPolicy:
    """Which `spec.externalIPs` may be programmed: those inside `cidrs`; none by default.

    CVE-2020-8554: anybody allowed to create a Service can name any address as an external
    IP, and kube-proxy then captures every packet to it, from pods and from the node, so
    a tenant intercepts traffic meant for, say, a public DNS server. Kubernetes' answer is
    an admission plugin (DenyServiceExternalIPs) that clusters may not run; the filter
    sits here so that no path to the maps bypasses it (the desired state is the only
    thing written), whatever the source: `external_ips` applies it, for the frontends and
    for the agent, which reports each refusal once.
    """

    cidrs: tuple[IPv4Network | IPv6Network, ...] = ()

    def allows(self, address: IPAddress) -> bool:
        return any(address in network for network in self.cidrs)


@dataclass(frozen=True, slots=True)
class NodeView:
    """What "local" and "this node's addresses" mean for the frontends of one node, and
    which externalIPs it programs. Addresses of both families: IPv4 and global IPv6 ones."""

    name: str = ""
    addresses: tuple[IPAddress, ...] = ()
    external_ips: ExternalIPPolicy = ExternalIPPolicy()
    zone: str = ""  # topology.kubernetes.io/zone of this node (--zone); "": unknown
    # --nodeport-addresses: NodePorts answer only on node addresses inside these (and on
    # 127.0.0.1 only when one holds it), per family: a family none of them is of answers
    # on all its addresses; empty: on every address and 127.0.0.1.
    nodeport_cidrs: tuple[IPv4Network | IPv6Network, ...] = ()
    # --nodeport-addresses=primary: NodePorts answer only on the node's primary addresses
    # (those of each family's default route's interface; not 127.0.0.1), as kube-proxy's
    # value.
    nodeport_primary: bool = False
    primary: tuple[IPAddress, ...] = ()

    @classmethod
    def of(
        cls,
        config: Config,
        addresses: tuple[IPAddress, ...] = (),
        primary: tuple[IPAddress, ...] = (),
    ) -> NodeView:
        """This node's view from the agent's configuration (its name and zone, the
        externalIP allow-list, where NodePorts answer) and its addresses now."""
        return cls(
            config.node_name,
            addresses,
            ExternalIPPolicy(config.external_ip_cidrs),
            config.zone,
            config.nodeport_addresses,
            config.nodeport_primary,
            primary,
        )

    def with_addresses(
        self, addresses: tuple[IPAddress, ...], primary: tuple[IPAddress, ...]
    ) -> NodeView:
        """This view after the node's addresses changed (ebpflb.datapath.addrwatch)."""
        return replace(self, addresses=addresses, primary=primary)

    def nodeport_addresses(self) -> tuple[IPAddress, ...]:
        """The addresses NodePorts answer on, both families. 127.0.0.1 is one (for host
        processes, through socket-LB), ::1 is not: kube-proxy reaches NodePorts on
        localhost through route_localnet, which only IPv4 has, so it has no ::1 NodePort."""
        if self.nodeport_primary:
            return self.primary
        candidates = (*self.addresses, LOOPBACK)
        if not self.nodeport_cidrs:
            return candidates
        # kube-proxy's NewNodePortAddresses, per family: the CIDRs of the family, or all
        # of the family's addresses (0.0.0.0/0, ::/0) when none is of it.
        families = {net.version for net in self.nodeport_cidrs}
        return tuple(
            a
            for a in candidates
            if a.version not in families or any(a in net for net in self.nodeport_cidrs)
        )


LOOPBACK = IPv4Address("127.0.0.1")


def external_ips(port: ServicePort, node: NodeView) -> tuple[list[IPAddress], list[IPAddress]]:
    """`port`'s externalIPs split by the node's allow-list: (programmed, refused). The one
    place the policy is applied: the frontends take the first, the agent reports the
    second."""
    programmed: list[IPAddress] = []
    refused: list[IPAddress] = []
    for ip in port.external_ips:
        (programmed if node.external_ips.allows(ip) else refused).append(ip)
    return programmed, refused


def usable_endpoints(endpoints: Iterable[Endpoint]) -> tuple[tuple[Endpoint, ...], bool]:
    """(endpoints to use, whether they are the terminating fallback)."""
    endpoints = tuple(endpoints)
    ready = tuple(ep for ep in endpoints if ep.ready)
    if ready:
        return ready, False
    return tuple(ep for ep in endpoints if ep.serving and ep.terminating), True


class TopologyMode(enum.Enum):
    """How the hints restrict a service's cluster-wide endpoints on this node (kube-proxy's
    topologyModeFromHints: v1.ServiceTrafficDistributionPreferSameNode/Zone)."""

    NONE = ""
    SAME_NODE = "PreferSameNode"
    SAME_ZONE = "PreferSameZone"


def topology_mode(endpoints: Iterable[Endpoint], node: NodeView) -> TopologyMode:
    """kube-proxy's choice, from the ready endpoints' hints alone (the EndpointSlice
    controller writes them for trafficDistribution and topology-aware routing): same
    node when every ready endpoint has a node hint and one names this node; else same zone
    when every ready endpoint has a zone hint and one names this node's zone; else none,
    so incomplete hints fall back to every endpoint."""
    ready = False
    all_node_hints = all_zone_hints = True
    for_node = for_zone = False
    for ep in endpoints:
        if not ep.ready:
            continue
        ready = True
        if not ep.node_hints:
            all_node_hints = False
        elif node.name in ep.node_hints:
            for_node = True
        if not ep.zone_hints:
            all_zone_hints = False
        elif node.zone in ep.zone_hints:
            for_zone = True
    if not ready:
        return TopologyMode.NONE
    if all_node_hints and for_node:
        return TopologyMode.SAME_NODE
    if all_zone_hints and for_zone:
        return TopologyMode.SAME_ZONE
    return TopologyMode.NONE


def _available(ep: Endpoint, mode: TopologyMode, node: NodeView) -> bool:
    if mode is TopologyMode.NONE:
        return True
    if mode is TopologyMode.SAME_NODE:
        return node.name in ep.node_hints
    return node.zone in ep.zone_hints


def cluster_endpoints(
    endpoints: Iterable[Endpoint], node: NodeView
) -> tuple[tuple[Endpoint, ...], bool]:
    """The endpoints Cluster traffic policy uses (kube-proxy's CategorizeEndpoints): the
    ready ones the topology mode allows; with none ready anywhere, the serving terminating
    ones, whatever their hints. (endpoints, whether they are that fallback)."""
    endpoints = tuple(endpoints)
    if not any(ep.node_hints or ep.zone_hints for ep in endpoints):
        return usable_endpoints(endpoints)  # the usual case: no hints, no topology
    mode = topology_mode(endpoints, node)
    ready = tuple(ep for ep in endpoints if ep.ready and _available(ep, mode, node))
    if ready:
        return ready, False
    return tuple(ep for ep in endpoints if ep.serving and ep.terminating), True


def _backends(
    port: ServicePort, chosen_fallback: tuple[tuple[Endpoint, ...], bool], node: NodeView
) -> tuple[tuple[WeightedBackend, ...], SvcFlags]:
    chosen, fallback = chosen_fallback
    protocol = port.protocol
    backends = tuple(
        sorted(
            (
                WeightedBackend(
                    Backend(ep.address, ep.port, protocol), DEFAULT_WEIGHT, _flags(ep, node)
                )
                for ep in chosen
            ),
            key=_order,
        )
    )
    return backends, SvcFlags.TERMINATING if fallback and backends else SvcFlags.NONE


def _flags(ep: Endpoint, node: NodeView) -> BackendFlags:
    local = _is_local(ep, node)
    if not local and not ep.terminating:
        return BackendFlags.NONE  # the usual case, without IntFlag arithmetic (slow)
    return (BackendFlags.LOCAL if local else BackendFlags.NONE) | (
        BackendFlags.TERMINATING if ep.terminating else BackendFlags.NONE
    )


def _order(wb: WeightedBackend) -> tuple[int, int, int, int, int, int]:
    """WeightedBackend's own order, in ints (its dataclass comparisons are slow, and
    refuse to compare addresses of two families), the family first."""
    backend = wb.backend
    address = backend.address
    return (address.version, int(address), backend.port, backend.protocol, wb.weight, wb.flags)


def _is_local(ep: Endpoint, node: NodeView) -> bool:
    return bool(node.name) and ep.node_name == node.name


def frontends_for_port(
    port: ServicePort, endpoints: Iterable[Endpoint], node: NodeView | None = None
) -> list[DesiredFrontend]:
    """Every frontend of one service port on this node, with kube-proxy's traffic policies
    (pkg/proxy/topology.go CategorizeEndpoints; ServicePort.UsesClusterEndpoints/Local).

    Internal traffic (the ClusterIP, socket-LB only) spreads over all endpoints, or under
    internalTrafficPolicy=Local over this node's only; with none local the ClusterIP
    refuses at once (ECONNREFUSED) where kube-proxy drops: a socket-LB connect() cannot be
    dropped, and an immediate error beats a client waiting for its timeout.

    External frontends: node addresses on the nodePort (and 127.0.0.1:nodePort, for host
    processes through socket-LB), LoadBalancer ingress IPs and the external IPs the node's
    policy allows. Under externalTrafficPolicy=Cluster they spread over all endpoints.
    Under Local, traffic from outside the node (tc/XDP) uses only this node's endpoints
    (none: the node drops rather than forwards, so a cloud load balancer's health check
    takes it out) and keeps the client's source address, while in-node clients
    (socket-LB) reach all endpoints through a second, LB_SCOPE_INTERNAL entry of the same
    frontend: kube-proxy sends in-cluster traffic to external destinations to the cluster
    chain ("pod traffic for ... external destinations"), as if it had gone out to the load
    balancer and come back.
    """
    node = node or NodeView()
    endpoints = tuple(endpoints)
    # A port without cluster IPs (built directly, never from a Service) is IPv4's, as the
    # node addresses its NodePorts live on.
    families = sorted({ip.version for ip in port.cluster_ips}) or [4]
    if len(families) == 1 and all(ep.address.version == families[0] for ep in endpoints):
        return with_affinity(port, _family_frontends(port, families[0], endpoints, node))
    # Dual-stack (or endpoints of another family): each family's frontends spread over
    # that family's endpoints only, as kube-proxy's per-family proxiers do.
    result: list[DesiredFrontend] = []
    for family in families:
        mine = tuple(ep for ep in endpoints if ep.address.version == family)
        result += _family_frontends(port, family, mine, node)
    return with_affinity(port, result)


def _family_frontends(
    port: ServicePort, family: int, endpoints: tuple[Endpoint, ...], node: NodeView
) -> list[DesiredFrontend]:
    """frontends_for_port for the addresses of one family (4 or 6), over endpoints of
    that family: NodePorts on the node addresses of the family, the LoadBalancer IPs and
    external IPs of the family, source ranges of the family (kube-proxy's proxier of a
    family sees its own family's only: a family without ranges of its own is open)."""
    cluster = _backends(port, cluster_endpoints(endpoints, node), node)
    local: tuple[tuple[WeightedBackend, ...], SvcFlags] | None = None
    if (
        port.internal_traffic_policy is TrafficPolicy.LOCAL
        or port.external_traffic_policy is TrafficPolicy.LOCAL
    ):
        # Local endpoints ignore topology, as kube-proxy's.
        mine = (ep for ep in endpoints if _is_local(ep, node))
        local = _backends(port, usable_endpoints(mine), node)

    if port.internal_traffic_policy is TrafficPolicy.LOCAL and local is not None:
        internal_backends, internal_flags = local[0], local[1] | SvcFlags.ITP_LOCAL
    else:
        internal_backends, internal_flags = cluster
    result = [
        DesiredFrontend(
            Frontend(ip, port.port, port.protocol),
            port.name,
            SvcFlags.CLUSTER_IP | internal_flags,
            internal_backends,
        )
        for ip in port.cluster_ips
        if ip.version == family
    ]
    external: list[tuple[Frontend, SvcFlags, tuple[IPNetwork, ...]]] = []
    if port.node_port:
        for address in node.nodeport_addresses():
            if address.version == family:
                frontend = Frontend(address, port.node_port, port.protocol)
                external.append((frontend, SvcFlags.NODE_PORT, ()))
    ranges = tuple(n for n in port.load_balancer_source_ranges if n.version == family)
    for ip in port.load_balancer_ips:
        if ip.version != family:
            continue
        flags = SvcFlags.LOADBALANCER | (SvcFlags.SOURCE_RANGES if ranges else SvcFlags.NONE)
        external.append((Frontend(ip, port.port, port.protocol), flags, ranges))
    for ip in external_ips(port, node)[0]:
        if ip.version == family:
            external.append((Frontend(ip, port.port, port.protocol), SvcFlags.EXTERNAL_IP, ()))
    if not external:
        return result
    cluster_backends, cluster_flags = cluster
    if port.external_traffic_policy is TrafficPolicy.LOCAL and local is not None:
        ext_backends = local[0]
        ext_flags = local[1] | SvcFlags.ETP_LOCAL | SvcFlags.INTERNAL_SCOPE
    else:
        ext_backends, ext_flags = cluster_backends, cluster_flags
    if not cluster_backends:
        # No usable endpoint anywhere: kube-proxy REJECTs external traffic (a TCP RST
        # here); with endpoints elsewhere only, an eTP=Local node drops it, as kube-proxy.
        ext_flags |= SvcFlags.REJECT
    for frontend, flags, ranges in external:
        result.append(DesiredFrontend(frontend, port.name, flags | ext_flags, ext_backends, ranges))
        if ext_flags & SvcFlags.INTERNAL_SCOPE:
            # Socket-LB only: no source ranges (they apply to traffic from outside).
            inside = Frontend(frontend.address, frontend.port, frontend.protocol, Scope.INTERNAL)
            result.append(
                DesiredFrontend(inside, port.name, flags | cluster_flags, cluster_backends)
            )
    return result


def with_affinity(port: ServicePort, frontends: list[DesiredFrontend]) -> list[DesiredFrontend]:
    """sessionAffinity=ClientIP on every frontend of the port. Per frontend, as Cilium
    keys it (kube-proxy's `recent` lists are per service port, shared by its ClusterIP and
    nodePorts; a client reaches them through different hooks here anyway: socket-LB knows
    it by network namespace, tc by source address)."""
    timeout = port.affinity_timeout
    if not timeout:
        return frontends
    return [
        DesiredFrontend(
            fe.frontend,
            fe.service,
            fe.flags | SvcFlags.AFFINITY,
            fe.backends,
            fe.source_ranges,
            timeout,
        )
        for fe in frontends
    ]


def frontends_for_service(
    state: ServiceState, node: NodeView | None = None
) -> dict[Frontend, DesiredFrontend]:
    result: dict[Frontend, DesiredFrontend] = {}
    for name, port in sorted(state.ports.items()):
        for desired in frontends_for_port(port, state.endpoints.get(name, ()), node):
            result.setdefault(desired.frontend, desired)
    return result
