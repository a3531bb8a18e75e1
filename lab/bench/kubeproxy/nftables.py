"""kube-proxy's nftables proxier: the nft -f transactions of its first (full) sync, of the
O(changed) partial sync after one endpoint change, and of the later sync that deletes the
stale endpoint chains, as knftables renders them.

The IPv6 proxier (family=Family.IPV6) differs only where proxier.go spells the family
(Syntax): table ip6 kube-proxy, ipv6_addr sets and map keys, ip6 daddr / ip6 saddr
matches, "ip6 daddr != ::1" for match-all NodePorts, and endpoints as [ip]:port.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lab.bench.kubeproxy.naming import (
    MASQ_MARK,
    ServicePort,
    changed,
    nft_affinity_set,
    nft_endpoint_chain,
    nft_external_chain,
    nft_local_chain,
    nft_service_chain,
    service_ports,
)
from lab.bench.scenario import PLANS, BenchService, Family


@dataclass(frozen=True)
class Syntax:
    """What kube-proxy's nftables proxier writes per family (its ipX, ipvX_addr and
    noLocalhost)."""

    table: str
    ipx: str  # the address match: ip daddr, ip6 saddr
    addr_type: str
    no_localhost: str

    @property
    def vmap_key(self) -> str:
        return f"type {self.addr_type} . inet_proto . inet_service : verdict"


SYNTAX = {
    Family.IPV4: Syntax("ip kube-proxy", "ip", "ipv4_addr", "ip daddr != 127.0.0.0/8"),
    Family.IPV6: Syntax("ip6 kube-proxy", "ip6", "ipv6_addr", "ip6 daddr != ::1"),
}

# nftablesBaseChains: name, type, hook, priority (knftables writes the number).
NFT_BASE_CHAINS = (
    ("filter-prerouting-pre-dnat", "filter", "prerouting", -110),  # dstnat - 10
    ("filter-output-pre-dnat", "filter", "output", -110),
    ("filter-input", "filter", "input", 0),
    ("filter-forward", "filter", "forward", 0),
    ("filter-output", "filter", "output", 0),
    ("nat-prerouting", "nat", "prerouting", -100),  # dstnat
    ("nat-output", "nat", "output", -100),
    ("nat-postrouting", "nat", "postrouting", 100),  # srcnat
)
# nftablesJumpChains: (target, source base chain, extra match).
NFT_JUMPS = (
    ("nodeport-endpoints-check", "filter-input", "ct state new"),
    ("service-endpoints-check", "filter-input", "ct state new"),
    ("service-endpoints-check", "filter-forward", "ct state new"),
    ("service-endpoints-check", "filter-output", "ct state new"),
    ("firewall-check", "filter-prerouting-pre-dnat", "ct state new"),
    ("firewall-check", "filter-output-pre-dnat", "ct state new"),
    ("services", "nat-output", ""),
    ("services", "nat-prerouting", ""),
    ("masquerading", "nat-postrouting", ""),
    ("cluster-ips-check", "filter-forward", "ct state new"),
    ("cluster-ips-check", "filter-output", "ct state new"),
)
_PORT_KEY = "type inet_proto . inet_service : verdict"


class _Tx:
    """A knftables transaction rendered as nft -f text."""

    def __init__(self, family: Family) -> None:
        self.syntax = SYNTAX[family]
        self.table = self.syntax.table
        self.statements: list[str] = []
        self.created: set[str] = set()

    def op(self, text: str) -> None:
        self.statements.append(text)

    def ensure_chain(self, chain: str) -> None:
        """ensureChain: add and flush once per transaction."""
        if chain in self.created:
            return
        self.created.add(chain)
        self.op(f"add chain {self.table} {chain}")
        self.op(f"flush chain {self.table} {chain}")

    def rule(self, chain: str, rule: str, comment: str | None = None) -> None:
        self.op(
            f"add rule {self.table} {chain} {rule}" + (f' comment "{comment}"' if comment else "")
        )

    def element(self, container: str, key: str, value: str | None = None) -> None:
        self.op(
            f"add element {self.table} {container} {{ {key}" + (f" : {value} }}" if value else " }")
        )

    def add(self, kind: str, name: str, spec: str, comment: str) -> None:
        """add set/map/chain with knftables' { spec ; comment "..." ; } body."""
        spec = f"{spec} ; " if spec else ""
        self.op(f'add {kind} {self.table} {name} {{ {spec}comment "{comment}" ; }}')

    def text(self) -> str:
        return "\n".join([*self.statements, ""])


def _nft_setup(tx: _Tx, *, node_ip: str | None, service_cidr: str, mark: str) -> None:
    """setupNFTables, on kube-proxy's first sync (when it also add+deletes the base chains
    so that changed priorities apply)."""
    t, x = tx.table, tx.syntax
    tx.op(f'add table {t} {{ comment "rules for kube-proxy" ; }}')
    for name, *_ in NFT_BASE_CHAINS:
        tx.op(f"add chain {t} {name}")
        tx.op(f"delete chain {t} {name}")
    for name, kind, hook, priority in NFT_BASE_CHAINS:
        tx.op(f"add chain {t} {name} {{ type {kind} hook {hook} priority {priority} ; }}")
        tx.op(f"flush chain {t} {name}")
    for target, source, extra in NFT_JUMPS:
        tx.ensure_chain(target)
        tx.rule(source, f"{extra} jump {target}".strip())
    for chain in ("services", "cluster-ips-check", "masquerading", "mark-for-masquerade"):
        tx.ensure_chain(chain)
    tx.rule("mark-for-masquerade", f"mark set mark or {mark}")
    tx.rule("masquerading", f"mark and {mark} == 0 return")
    tx.rule("masquerading", f"mark set mark xor {mark}")
    tx.rule("masquerading", "masquerade fully-random")
    tx.add("set", "cluster-ips", f"type {x.addr_type}", "Active ClusterIPs")
    tx.rule(
        "cluster-ips-check",
        f"{x.ipx} daddr @cluster-ips reject",
        "Reject traffic to invalid ports of ClusterIPs",
    )
    tx.rule(
        "cluster-ips-check",
        f"{x.ipx} daddr {{ {service_cidr} }} drop",
        "Drop traffic to unallocated ClusterIPs",
    )
    tx.add("set", "nodeport-ips", f"type {x.addr_type}", "IPs that accept NodePort traffic")
    if node_ip is None:  # --nodeport-addresses matching everything: fib daddr type local
        tx.op(f"delete set {t} nodeport-ips")
        nodeport_match = x.no_localhost
        services_nodeport = f"fib daddr type local {x.no_localhost}"
    else:  # the default, "primary": the node's IP
        tx.op(f"flush set {t} nodeport-ips")
        tx.element("nodeport-ips", node_ip)
        nodeport_match = services_nodeport = f"{x.ipx} daddr @nodeport-ips"
    no_endpoints = "vmap to drop or reject packets to {} with no endpoints"
    tx.add("map", "no-endpoint-services", x.vmap_key, no_endpoints.format("services"))
    tx.add("map", "no-endpoint-nodeports", _PORT_KEY, no_endpoints.format("service nodeports"))
    tx.add("chain", "reject-chain", "", "helper for @no-endpoint-services / @no-endpoint-nodeports")
    tx.op(f"flush chain {t} reject-chain")
    tx.rule("reject-chain", "reject")
    tx.rule(
        "service-endpoints-check",
        f"{x.ipx} daddr . meta l4proto . th dport vmap @no-endpoint-services",
    )
    tx.rule(
        "nodeport-endpoints-check",
        f"{nodeport_match} meta l4proto . th dport vmap @no-endpoint-nodeports",
    )
    firewall = "destinations that are subject to LoadBalancerSourceRanges"
    tx.add("map", "firewall-ips", x.vmap_key, firewall)
    tx.ensure_chain("firewall-check")
    tx.rule("firewall-check", f"{x.ipx} daddr . meta l4proto . th dport vmap @firewall-ips")
    tx.add("map", "service-ips", x.vmap_key, "ClusterIP, ExternalIP and LoadBalancer IP traffic")
    tx.add("map", "service-nodeports", _PORT_KEY, "NodePort traffic")
    tx.rule("services", f"{x.ipx} daddr . meta l4proto . th dport vmap @service-ips")
    tx.rule("services", f"{services_nodeport} meta l4proto . th dport vmap @service-nodeports")
    # nftElementStorage.reset: a full sync re-adds every element.
    tx.op(f"flush set {t} cluster-ips")
    for name in (
        "service-ips",
        "firewall-ips",
        "no-endpoint-services",
        "no-endpoint-nodeports",
        "service-nodeports",
    ):
        tx.op(f"flush map {t} {name}")


def _nft_service(
    tx: _Tx, p: ServicePort, *, elements: bool, chains: bool, cluster_cidr: str
) -> None:
    """One service's part of syncProxyRules (>= 1 endpoint, >= 1 local one for a Local
    policy)."""
    x = tx.syntax
    svc, local, ext = nft_service_chain(p), nft_local_chain(p), nft_external_chain(p)
    internal = local if p.internal_local else svc  # internalTrafficChain
    if chains:
        for ip in p.reachable:
            tx.ensure_chain(nft_endpoint_chain(p, ip))
        if p.uses_cluster:
            tx.ensure_chain(svc)
        if p.uses_local:
            tx.ensure_chain(local)
        if p.node_port is not None:
            tx.ensure_chain(ext)
    if elements:  # nftElementStorage.ensureElem adds only new or changed elements
        tx.element("cluster-ips", p.cluster_ip)
        tx.element("service-ips", f"{p.cluster_ip} . {p.protocol} . {p.port}", f"goto {internal}")
        if p.node_port is not None:
            tx.element("service-nodeports", f"{p.protocol} . {p.node_port}", f"goto {ext}")
    if not chains:
        return
    tx.rule(
        internal,
        f"{x.ipx} daddr {p.cluster_ip} {x.ipx} saddr != {cluster_cidr} jump mark-for-masquerade",
    )
    if p.node_port is not None and not p.external_local:  # masquerade, then the service
        tx.rule(ext, "jump mark-for-masquerade")
        tx.rule(ext, f"goto {svc}")
    elif p.node_port is not None:  # keep the client's address; pods and the node reach all
        tx.rule(ext, f"{x.ipx} saddr {cluster_cidr} goto {svc}", "short-circuit pod traffic")
        tx.rule(ext, "fib saddr type local jump mark-for-masquerade", "masquerade local traffic")
        tx.rule(ext, f"fib saddr type local goto {svc}", "short-circuit local traffic")
        tx.rule(ext, f"goto {local}")
    if p.affinity_seconds is not None:  # one timeout set per endpoint: its clients
        for ip in p.reachable:
            tx.op(
                f"add set {tx.table} {nft_affinity_set(p, ip)} {{ type {x.addr_type} ;"
                f" flags dynamic,timeout ; timeout {p.affinity_seconds}s ; }}"
            )
    if p.uses_cluster:
        _to_endpoints(tx, p, svc, p.endpoints)
    if p.uses_local:
        _to_endpoints(tx, p, local, p.local_endpoints)
    for ip in p.reachable:
        chain = nft_endpoint_chain(p, ip)
        tx.rule(chain, f"{x.ipx} saddr {ip} jump mark-for-masquerade")
        if p.affinity_seconds is not None:
            tx.rule(chain, f"update @{nft_affinity_set(p, ip)} {{ {x.ipx} saddr }}")
        tx.rule(chain, f"meta l4proto {p.protocol} dnat to {p.endpoint_string(ip)}")


def _to_endpoints(tx: _Tx, p: ServicePort, chain: str, endpoints: Sequence[str]) -> None:
    """writeServiceToEndpointRules: a client in an endpoint's affinity set goes back to it;
    the others get a random endpoint."""
    if p.affinity_seconds is not None:
        for ip in endpoints:
            affinity = f"{tx.syntax.ipx} saddr @{nft_affinity_set(p, ip)}"
            tx.rule(chain, f"{affinity} goto {nft_endpoint_chain(p, ip)}")
    vmap = " , ".join(f"{i} : goto {nft_endpoint_chain(p, ip)}" for i, ip in enumerate(endpoints))
    tx.rule(chain, f"numgen random mod {len(endpoints)} vmap {{ {vmap} }}")


def full_sync(
    services: Sequence[BenchService | ServicePort],
    *,
    family: Family = Family.IPV4,
    node_ip: str | None = None,
    cluster_cidr: str | None = None,
    service_cidr: str | None = None,
    mark: str = MASQ_MARK,
) -> str:
    """nft -f input of kube-proxy's first (full) sync of `family`'s proxier: table ip (ip6)
    kube-proxy, base chains, sets and verdict maps, and every service's chains and
    elements. The pod and service CIDRs default to the bench's of `family`.

    node_ip: kube-proxy's default --nodeport-addresses "primary" puts the node's primary IP
    in @nodeport-ips; None renders the match-all variant (fib daddr type local)."""
    plan = PLANS[family]
    tx = _Tx(family)
    service_cidr = service_cidr if service_cidr is not None else str(plan.service_cidr)
    _nft_setup(tx, node_ip=node_ip, service_cidr=service_cidr, mark=mark)
    cluster_cidr = cluster_cidr if cluster_cidr is not None else plan.cluster_cidr
    for p in service_ports(services, family):
        _nft_service(tx, p, elements=True, chains=True, cluster_cidr=cluster_cidr)
    return tx.text()


def partial_sync(
    services: Sequence[BenchService | ServicePort],
    changed_index: int,
    ready: int,
    *,
    family: Family = Family.IPV4,
    cluster_cidr: str | None = None,
) -> str:
    """The partial-sync transaction after service changed_index kept only its first `ready`
    endpoints: O(changed). Its service (and external) chain and remaining endpoint chains
    are re-added, flushed and refilled; no map element changes (the service-ips and
    service-nodeports verdicts still point at the same chains, and endpoint chains are only
    referenced from the service chain's anonymous numgen vmap); the stale endpoint chains
    are flushed. kube-proxy deletes them in a later sync, once they have been stale for a
    second (kernels before 6.2 notice unreferenced chains late): stale_cleanup. A stale
    affinity set is deleted in this transaction, after the chains naming it are flushed."""
    ports = service_ports(services, family)
    _ports_after, before, after = changed(ports, changed_index, ready)
    tx = _Tx(family)
    cluster_cidr = cluster_cidr if cluster_cidr is not None else PLANS[family].cluster_cidr
    _nft_service(tx, after, elements=False, chains=True, cluster_cidr=cluster_cidr)
    stale = _stale(before, after)
    for ip in stale:
        tx.op(f"flush chain {tx.table} {nft_endpoint_chain(before, ip)}")
    if before.affinity_seconds is not None:  # unlike chains, stale sets go at once
        for ip in stale:
            tx.op(f"delete set {tx.table} {nft_affinity_set(before, ip)}")
    return tx.text()


def _stale(before: ServicePort, after: ServicePort) -> list[str]:
    return [ip for ip in before.reachable if ip not in after.reachable]


def stale_cleanup(
    services: Sequence[BenchService | ServicePort],
    changed_index: int,
    ready: int,
    *,
    family: Family = Family.IPV4,
) -> str:
    """The separate transaction a later sync (>= 1 s after partial_sync) sends first:
    deleting the stale endpoint chains."""
    ports = service_ports(services, family)
    _ports_after, before, after = changed(ports, changed_index, ready)
    table = SYNTAX[family].table
    return "".join(
        f"delete chain {table} {nft_endpoint_chain(before, ip)}\n" for ip in _stale(before, after)
    )
