"""What kube-proxy's iptables and nftables proxiers write, for the bench's services.

Pure generators (no kernel access; the setup commands come back as argv lists): given the
services of ebpflb.bench.scenario they return the exact input kube-proxy hands to
`iptables-restore -w 5 -W 100000 --noflush --counters` (iptables mode, for both the legacy
and the nf_tables backend of the iptables tool) or to `nft -f -` (nftables mode), for a
full sync and for the partial sync after one service's endpoints dropped to `ready`.

Sources followed (kubernetes/kubernetes, read through the code index; commit ids were not
visible, so the versions are identified by their content):

- iptables: pkg/proxy/iptables/proxier.go of the v1.31-v1.33 line (NewDualStackProxier
  with nfacct counters, largeClusterEndpointsThreshold = 1000, partial syncs) and the
  expected rulesets of pkg/proxy/iptables/proxier_test.go (TestOverallIPTablesRules,
  TestSyncProxyRulesRepeated), which the unit tests compare against line by line.
- nftables: the transaction structure of pkg/proxy/nftables/proxier.go (v1.31: setupNFTables,
  ensureChain = add + flush, nftElementStorage, stale chains flushed now and deleted
  by a later sync) and the ruleset of the newer pkg/proxy/nftables/proxier_test.go
  (TestOverallNFTablesRules baseRules: filter-prerouting-pre-dnat / filter-output-pre-dnat
  at priority -110, filter-input/forward/output at 0, `ip daddr <vip> ip saddr != <pod
  cidr>` masquerade rule, per-endpoint hairpin rule). kube-proxy v1.36 replaced the
  per-endpoint hairpin rule with a hairpin-connections set; that is not modelled.
- nft text as knftables (sigs.k8s.io/knftables objects.go) writes it: numeric priorities,
  `add element ... { key comment "..." : verdict }`.

Choices that match kube-proxy's defaults: masquerade bit 14 formatted "%#08x" (so the mark
is 0x00004000; the upstream tests inject "0x4000"), iptables --random-fully (iptables >=
1.6.2), localhostNodePorts on (KUBE-FIREWALL chain, 127.0.0.0/8 NodePort rule), nfacct
counters present (kernel with xt_nfacct), nf_conntrack_tcp_be_liberal unset (INVALID
drop rule), detect-local by cluster CIDR, iptables --nodeport-addresses unset (addrtype
LOCAL), nftables --nodeport-addresses "primary" (the nodeport-ips set holds node_ip).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ebpflb.bench.scenario import (
    CLUSTER_CIDR,
    NAMESPACE,
    PORT,
    PORT_NAME,
    SERVICE_CIDR,
    TARGET_PORT,
    BenchService,
)

MASQ_MARK = "0x00004000"  # fmt.Sprintf("%#08x", 1<<14): Go counts the 8 digits without 0x
WAIT_FLAGS = ("-w", "5", "-W", "100000")
RESTORE_FLAGS = (*WAIT_FLAGS, "--noflush", "--counters")
NFACCT_INVALID = "ct_state_invalid_dropped_pkts"
NFACCT_LOCALHOST_NODEPORT = "localhost_nps_accepted_pkts"
NFACCT_COUNTERS = (NFACCT_INVALID, NFACCT_LOCALHOST_NODEPORT)
LARGE_CLUSTER_ENDPOINTS = 1000  # above this many endpoints, per-endpoint comments go
NFT_TABLE = "ip kube-proxy"

LEFT_OUT: tuple[str, ...] = (
    "LoadBalancer IPs, externalIPs and loadBalancerSourceRanges (KUBE-FW-*, "
    "KUBE-PROXY-FIREWALL rules, firewall-ips elements)",
    "session affinity (-m recent, affinity-* sets)",
    "externalTrafficPolicy/internalTrafficPolicy Local (KUBE-SVL-*, local-* chains, "
    "healthCheckNodePort), topology hints, terminating-endpoint fallback",
    "services without ready endpoints (REJECT rules, no-endpoint-* elements): ready >= 1",
    "several ports per service, UDP/SCTP, IPv6 and dual-stack",
    "kube-proxy ranges over a Go map, so its service order is random; here it is by index",
    "work outside the restore input / nft transaction: the iptables-save (or nft list) "
    "before each sync, the -C checks before the jump inserts, the canary monitor, sysctls "
    "(route_localnet, conntrack), conntrack cleanup, healthz and metrics, informers",
    "masqueradeAll and --nodeport-addresses other than the defaults",
    "kube-proxy v1.36's hairpin-connections set (the per-endpoint hairpin rule is kept)",
)


# ---- services and chain names --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One TCP service port as the proxiers see it (BenchService, or a kube-proxy test's)."""

    namespace: str
    name: str
    port_name: str
    cluster_ip: str
    endpoints: tuple[str, ...]  # ready endpoint IPs, in EndpointSlice order
    port: int = PORT
    target_port: int = TARGET_PORT
    node_port: int | None = None
    protocol: str = "tcp"

    @classmethod
    def of(cls, svc: BenchService | ServicePort) -> ServicePort:
        if isinstance(svc, ServicePort):
            return svc
        return cls(NAMESPACE, svc.name, PORT_NAME, svc.vip, svc.endpoints, node_port=svc.node_port)

    @property
    def port_name_string(self) -> str:
        """proxy.ServicePortName.String(): namespace/name:port."""
        return f"{self.namespace}/{self.name}:{self.port_name}"

    def with_ready(self, ready: int) -> ServicePort:
        if not 1 <= ready <= len(self.endpoints):
            raise ValueError(f"ready must be between 1 and {len(self.endpoints)}")
        return ServicePort(
            self.namespace,
            self.name,
            self.port_name,
            self.cluster_ip,
            self.endpoints[:ready],
            self.port,
            self.target_port,
            self.node_port,
            self.protocol,
        )


def _b32sha(text: str) -> str:
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()


def portproto_hash(port_name_string: str, protocol: str) -> str:
    """iptables portProtoHash: base32(sha256(servicePortName + protocol))[:16]."""
    return _b32sha(port_name_string + protocol)[:16]


def endpoint_hash(port_name_string: str, protocol: str, endpoint: str) -> str:
    """iptables servicePortEndpointChainName's hash; endpoint is "ip:port"."""
    return _b32sha(port_name_string + protocol + endpoint)[:16]


def nft_name_base(name: str) -> str:
    """nftables hashAndTruncate: base32(sha256(name))[:8] + "-" + name (never truncated
    here: names stay far below knftables' 256-16 characters)."""
    return _b32sha(name)[:8] + "-" + name


def svc_chain(svc: ServicePort) -> str:
    return "KUBE-SVC-" + portproto_hash(svc.port_name_string, svc.protocol)


def ext_chain(svc: ServicePort) -> str:
    return "KUBE-EXT-" + portproto_hash(svc.port_name_string, svc.protocol)


def sep_chain(svc: ServicePort, ip: str) -> str:
    endpoint = f"{ip}:{svc.target_port}"
    return "KUBE-SEP-" + endpoint_hash(svc.port_name_string, svc.protocol, endpoint)


def _nft_base(svc: ServicePort) -> str:
    return nft_name_base(f"{svc.namespace}/{svc.name}/{svc.protocol}/{svc.port_name}")


def nft_service_chain(svc: ServicePort) -> str:
    return "service-" + _nft_base(svc)


def nft_external_chain(svc: ServicePort) -> str:
    return "external-" + _nft_base(svc)


def nft_endpoint_chain(svc: ServicePort, ip: str) -> str:
    name = f"{svc.namespace}/{svc.name}/{svc.protocol}/{svc.port_name}__{ip}/{svc.target_port}"
    return "endpoint-" + nft_name_base(name)


def _ports(services: Iterable[BenchService | ServicePort]) -> list[ServicePort]:
    return [ServicePort.of(s) for s in services]


def _changed(
    ports: list[ServicePort], changed_index: int, ready: int
) -> tuple[list[ServicePort], ServicePort, ServicePort]:
    """(services after the change, the changed service before, and after)."""
    before = ports[changed_index]
    after = before.with_ready(ready)
    return [*ports[:changed_index], after, *ports[changed_index + 1 :]], before, after


# ---- iptables mode -------------------------------------------------------------------------

# iptablesJumpChains then iptablesKubeletJumpChains: (table, source, target, comment, extra).
_CT_NEW = ("-m", "conntrack", "--ctstate", "NEW")
IPTABLES_JUMPS: tuple[tuple[str, str, str, str, tuple[str, ...]], ...] = (
    (
        "filter",
        "INPUT",
        "KUBE-EXTERNAL-SERVICES",
        "kubernetes externally-visible service portals",
        _CT_NEW,
    ),
    (
        "filter",
        "FORWARD",
        "KUBE-EXTERNAL-SERVICES",
        "kubernetes externally-visible service portals",
        _CT_NEW,
    ),
    ("filter", "INPUT", "KUBE-NODEPORTS", "kubernetes health check service ports", ()),
    ("filter", "FORWARD", "KUBE-SERVICES", "kubernetes service portals", _CT_NEW),
    ("filter", "OUTPUT", "KUBE-SERVICES", "kubernetes service portals", _CT_NEW),
    ("filter", "FORWARD", "KUBE-FORWARD", "kubernetes forwarding rules", ()),
    ("filter", "INPUT", "KUBE-PROXY-FIREWALL", "kubernetes load balancer firewall", _CT_NEW),
    ("filter", "OUTPUT", "KUBE-PROXY-FIREWALL", "kubernetes load balancer firewall", _CT_NEW),
    ("filter", "FORWARD", "KUBE-PROXY-FIREWALL", "kubernetes load balancer firewall", _CT_NEW),
    ("nat", "OUTPUT", "KUBE-SERVICES", "kubernetes service portals", ()),
    ("nat", "PREROUTING", "KUBE-SERVICES", "kubernetes service portals", ()),
    ("nat", "POSTROUTING", "KUBE-POSTROUTING", "kubernetes postrouting rules", ()),
    ("filter", "INPUT", "KUBE-FIREWALL", "", ()),
    ("filter", "OUTPUT", "KUBE-FIREWALL", "", ()),
)


def iptables_setup_argv(binary: str = "iptables") -> list[list[str]]:
    """The single iptables calls kube-proxy makes before its first restore, in order: the
    canary chains of its monitor, then per jump EnsureChain (-N) and EnsureRule(Prepend)
    (-I). Each chain is created once here; kube-proxy repeats -N and ignores "exists"."""
    commands = [
        [binary, *WAIT_FLAGS, "-N", "KUBE-PROXY-CANARY", "-t", t]
        for t in ("mangle", "nat", "filter")
    ]
    created: set[tuple[str, str]] = set()
    for table, source, target, comment, extra in IPTABLES_JUMPS:
        if (table, target) not in created:
            created.add((table, target))
            commands.append([binary, *WAIT_FLAGS, "-N", target, "-t", table])
        args = [*extra, *(("-m", "comment", "--comment", comment) if comment else ()), "-j", target]
        commands.append([binary, *WAIT_FLAGS, "-I", source, "-t", table, *args])
    return commands


def _iptables_sync(
    ports: list[ServicePort],
    write: set[int] | None,
    stale: list[str],
    *,
    total_endpoints: int,
    nfacct: bool,
    cluster_cidr: str,
    mark: str,
    random_fully: bool,
) -> str:
    """One syncProxyRules output. write: indexes whose SVC/EXT/SEP chains are written
    (None = all, a full sync). stale: chains to flush and delete (-X). total_endpoints:
    kube-proxy's count for large-cluster mode, which includes not-ready endpoints."""
    large = total_endpoints > LARGE_CLUSTER_ENDPOINTS
    q = '"'  # iptables-restore takes a quoted comment as one argument
    filter_chains = [
        ":KUBE-SERVICES - [0:0]",
        ":KUBE-EXTERNAL-SERVICES - [0:0]",
        ":KUBE-FORWARD - [0:0]",
        ":KUBE-NODEPORTS - [0:0]",
        ":KUBE-PROXY-FIREWALL - [0:0]",
        ":KUBE-FIREWALL - [0:0]",
    ]
    filter_rules = [
        '-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections"'
        " -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT"
        " -j DROP",
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID"
        + (f" -m nfacct --nfacct-name {NFACCT_INVALID}" if nfacct else "")
        + " -j DROP",
        f'-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark'
        f" {mark}/{mark} -j ACCEPT",
        '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack'
        " --ctstate RELATED,ESTABLISHED -j ACCEPT",
    ]
    nat_chains = [
        ":KUBE-SERVICES - [0:0]",
        ":KUBE-NODEPORTS - [0:0]",
        ":KUBE-POSTROUTING - [0:0]",
        ":KUBE-MARK-MASQ - [0:0]",
    ]
    nat = [
        f"-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN",
        f"-A KUBE-POSTROUTING -j MARK --xor-mark {mark}",
        '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT"'
        " -j MASQUERADE" + (" --random-fully" if random_fully else ""),
        f"-A KUBE-MARK-MASQ -j MARK --or-mark {mark}",
    ]
    for i, p in enumerate(ports):
        name, proto, svc, ext = p.port_name_string, p.protocol, svc_chain(p), ext_chain(p)
        cluster_ip = (
            f"-m comment --comment {q}{name} cluster IP{q} -m {proto} -p {proto}"
            f" -d {p.cluster_ip} --dport {p.port}"
        )
        nat.append(f"-A KUBE-SERVICES {cluster_ip} -j {svc}")
        if p.node_port is not None:
            np_match = f"-A KUBE-NODEPORTS -m comment --comment {name} -m {proto} -p {proto}"
            if nfacct:  # localhostNodePorts with its counter
                nat.append(
                    f"{np_match} -d 127.0.0.0/8 --dport {p.node_port}"
                    f" -m nfacct --nfacct-name {NFACCT_LOCALHOST_NODEPORT} -j {ext}"
                )
            nat.append(f"{np_match} --dport {p.node_port} -j {ext}")
        if write is not None and i not in write:
            continue  # partial sync: this service's chains are unchanged
        nat.append(f"-A {svc} {cluster_ip} ! -s {cluster_cidr} -j KUBE-MARK-MASQ")
        if p.node_port is not None:  # externalTrafficPolicy Cluster
            nat_chains.append(f":{ext} - [0:0]")
            nat.append(
                f"-A {ext} -m comment --comment {q}masquerade traffic for {name} external"
                f" destinations{q} -j KUBE-MARK-MASQ"
            )
            nat.append(f"-A {ext} -j {svc}")
        nat_chains.append(f":{svc} - [0:0]")
        count = len(p.endpoints)
        for e, ip in enumerate(p.endpoints):
            comment = "" if large else f" -m comment --comment {q}{name} -> {ip}:{p.target_port}{q}"
            statistic = (
                f" -m statistic --mode random --probability {1.0 / (count - e):0.10f}"
                if e < count - 1
                else ""
            )
            nat.append(f"-A {svc}{comment}{statistic} -j {sep_chain(p, ip)}")
        for ip in p.endpoints:
            sep = sep_chain(p, ip)
            nat_chains.append(f":{sep} - [0:0]")
            comment = "" if large else f" -m comment --comment {name}"
            nat.append(f"-A {sep}{comment} -s {ip} -j KUBE-MARK-MASQ")
            nat.append(
                f"-A {sep}{comment} -m {proto} -p {proto} -j DNAT --to-destination"
                f" {ip}:{p.target_port}"
            )
    for chain in stale:  # a chain line flushes it; then it can go
        nat_chains.append(f":{chain} - [0:0]")
        nat.append(f"-X {chain}")
    nat.append(
        '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be'
        ' the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS'
    )
    return "\n".join(
        [
            "*filter",
            *filter_chains,
            *filter_rules,
            "COMMIT",
            "*nat",
            *nat_chains,
            *nat,
            "COMMIT",
            "",
        ]
    )


def iptables_full(
    services: Sequence[BenchService | ServicePort],
    *,
    nfacct: bool = True,
    cluster_cidr: str = CLUSTER_CIDR,
    mark: str = MASQ_MARK,
    random_fully: bool = True,
) -> str:
    """iptables-restore input of a full sync (filter and nat tables). Load it with
    RESTORE_FLAGS after iptables_setup_argv(); nfacct=True needs the NFACCT_COUNTERS to
    exist (create_nfacct_counters), as kube-proxy creates them first."""
    ports = _ports(services)
    return _iptables_sync(
        ports,
        None,
        [],
        total_endpoints=sum(len(p.endpoints) for p in ports),
        nfacct=nfacct,
        cluster_cidr=cluster_cidr,
        mark=mark,
        random_fully=random_fully,
    )


def iptables_partial(
    services: Sequence[BenchService | ServicePort],
    changed_index: int,
    ready: int,
    *,
    cleanup: bool | None = None,
    nfacct: bool = True,
    cluster_cidr: str = CLUSTER_CIDR,
    mark: str = MASQ_MARK,
    random_fully: bool = True,
) -> str:
    """The partial sync (kube-proxy >= 1.26) after service changed_index kept only its first
    `ready` endpoints: filter and the nat base chains rewritten whole, only that service's
    SVC/EXT/SEP chains rewritten, its stale SEP chains flushed and deleted.

    cleanup: whether stale chains are deleted in this sync. kube-proxy always does it below
    LARGE_CLUSTER_ENDPOINTS; above, at most once per syncPeriod (30 s), so None (the
    default) assumes the last cleanup was recent and keeps them there."""
    before_ports = _ports(services)
    ports, before, after = _changed(before_ports, changed_index, ready)
    total = sum(len(p.endpoints) for p in before_ports)  # the not-ready one still counts
    if cleanup is None:
        cleanup = total <= LARGE_CLUSTER_ENDPOINTS
    stale = [sep_chain(before, ip) for ip in before.endpoints[len(after.endpoints) :]]
    return _iptables_sync(
        ports,
        {changed_index},
        stale if cleanup else [],
        total_endpoints=total,
        nfacct=nfacct,
        cluster_cidr=cluster_cidr,
        mark=mark,
        random_fully=random_fully,
    )


# ---- nftables mode -------------------------------------------------------------------------

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
_VMAP_KEY = "type ipv4_addr . inet_proto . inet_service : verdict"
_PORT_KEY = "type inet_proto . inet_service : verdict"


class _Tx:
    """A knftables transaction rendered as nft -f text."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.created: set[str] = set()

    def op(self, text: str) -> None:
        self.lines.append(text)

    def ensure_chain(self, chain: str) -> None:
        """ensureChain: add and flush once per transaction."""
        if chain in self.created:
            return
        self.created.add(chain)
        self.op(f"add chain {NFT_TABLE} {chain}")
        self.op(f"flush chain {NFT_TABLE} {chain}")

    def rule(self, chain: str, rule: str, comment: str | None = None) -> None:
        self.op(
            f"add rule {NFT_TABLE} {chain} {rule}" + (f' comment "{comment}"' if comment else "")
        )

    def element(self, container: str, key: str, value: str | None = None) -> None:
        self.op(
            f"add element {NFT_TABLE} {container} {{ {key}" + (f" : {value} }}" if value else " }")
        )

    def add(self, kind: str, name: str, spec: str, comment: str) -> None:
        """add set/map/chain with knftables' { spec ; comment "..." ; } body."""
        spec = f"{spec} ; " if spec else ""
        self.op(f'add {kind} {NFT_TABLE} {name} {{ {spec}comment "{comment}" ; }}')

    def text(self) -> str:
        return "\n".join([*self.lines, ""])


def _nft_setup(tx: _Tx, *, node_ip: str | None, service_cidr: str, mark: str) -> None:
    """setupNFTables, on kube-proxy's first sync (when it also add+deletes the base chains
    so that changed priorities apply)."""
    t = NFT_TABLE
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
    tx.add("set", "cluster-ips", "type ipv4_addr", "Active ClusterIPs")
    tx.rule(
        "cluster-ips-check",
        "ip daddr @cluster-ips reject",
        "Reject traffic to invalid ports of ClusterIPs",
    )
    tx.rule(
        "cluster-ips-check",
        f"ip daddr {{ {service_cidr} }} drop",
        "Drop traffic to unallocated ClusterIPs",
    )
    tx.add("set", "nodeport-ips", "type ipv4_addr", "IPs that accept NodePort traffic")
    if node_ip is None:  # --nodeport-addresses matching everything: fib daddr type local
        tx.op(f"delete set {t} nodeport-ips")
        nodeport_match = "ip daddr != 127.0.0.0/8"
        services_nodeport = "fib daddr type local ip daddr != 127.0.0.0/8"
    else:  # the default, "primary": the node's IP
        tx.op(f"flush set {t} nodeport-ips")
        tx.element("nodeport-ips", node_ip)
        nodeport_match = services_nodeport = "ip daddr @nodeport-ips"
    no_endpoints = "vmap to drop or reject packets to {} with no endpoints"
    tx.add("map", "no-endpoint-services", _VMAP_KEY, no_endpoints.format("services"))
    tx.add("map", "no-endpoint-nodeports", _PORT_KEY, no_endpoints.format("service nodeports"))
    tx.add("chain", "reject-chain", "", "helper for @no-endpoint-services / @no-endpoint-nodeports")
    tx.op(f"flush chain {t} reject-chain")
    tx.rule("reject-chain", "reject")
    tx.rule(
        "service-endpoints-check", "ip daddr . meta l4proto . th dport vmap @no-endpoint-services"
    )
    tx.rule(
        "nodeport-endpoints-check",
        f"{nodeport_match} meta l4proto . th dport vmap @no-endpoint-nodeports",
    )
    firewall = "destinations that are subject to LoadBalancerSourceRanges"
    tx.add("map", "firewall-ips", _VMAP_KEY, firewall)
    tx.ensure_chain("firewall-check")
    tx.rule("firewall-check", "ip daddr . meta l4proto . th dport vmap @firewall-ips")
    tx.add("map", "service-ips", _VMAP_KEY, "ClusterIP, ExternalIP and LoadBalancer IP traffic")
    tx.add("map", "service-nodeports", _PORT_KEY, "NodePort traffic")
    tx.rule("services", "ip daddr . meta l4proto . th dport vmap @service-ips")
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
    """One service's part of syncProxyRules (Cluster traffic policies, >= 1 endpoint)."""
    svc, ext = nft_service_chain(p), nft_external_chain(p)
    endpoints = [(ip, nft_endpoint_chain(p, ip)) for ip in p.endpoints]
    if chains:
        for _ip, chain in endpoints:
            tx.ensure_chain(chain)
        tx.ensure_chain(svc)
        if p.node_port is not None:
            tx.ensure_chain(ext)
    if elements:  # nftElementStorage.ensureElem adds only new or changed elements
        tx.element("cluster-ips", p.cluster_ip)
        tx.element("service-ips", f"{p.cluster_ip} . {p.protocol} . {p.port}", f"goto {svc}")
        if p.node_port is not None:
            tx.element("service-nodeports", f"{p.protocol} . {p.node_port}", f"goto {ext}")
    if not chains:
        return
    tx.rule(svc, f"ip daddr {p.cluster_ip} ip saddr != {cluster_cidr} jump mark-for-masquerade")
    if p.node_port is not None:  # externalTrafficPolicy Cluster: masquerade, then the service
        tx.rule(ext, "jump mark-for-masquerade")
        tx.rule(ext, f"goto {svc}")
    vmap = " , ".join(f"{i} : goto {chain}" for i, (_ip, chain) in enumerate(endpoints))
    tx.rule(svc, f"numgen random mod {len(endpoints)} vmap {{ {vmap} }}")
    for ip, chain in endpoints:
        tx.rule(chain, f"ip saddr {ip} jump mark-for-masquerade")
        tx.rule(chain, f"meta l4proto {p.protocol} dnat to {ip}:{p.target_port}")


def nftables_full(
    services: Sequence[BenchService | ServicePort],
    *,
    node_ip: str | None = None,
    cluster_cidr: str = CLUSTER_CIDR,
    service_cidr: str = str(SERVICE_CIDR),
    mark: str = MASQ_MARK,
) -> str:
    """nft -f input of kube-proxy's first (full) sync: table ip kube-proxy, base chains,
    sets and verdict maps, and every service's chains and elements.

    node_ip: kube-proxy's default --nodeport-addresses "primary" puts the node's primary IP
    in @nodeport-ips; None renders the match-all variant (fib daddr type local)."""
    tx = _Tx()
    _nft_setup(tx, node_ip=node_ip, service_cidr=service_cidr, mark=mark)
    for p in _ports(services):
        _nft_service(tx, p, elements=True, chains=True, cluster_cidr=cluster_cidr)
    return tx.text()


def nftables_partial(
    services: Sequence[BenchService | ServicePort],
    changed_index: int,
    ready: int,
    *,
    cluster_cidr: str = CLUSTER_CIDR,
) -> str:
    """The partial-sync transaction after service changed_index kept only its first `ready`
    endpoints: O(changed). Its service (and external) chain and remaining endpoint chains
    are re-added, flushed and refilled; no map element changes (the service-ips and
    service-nodeports verdicts still point at the same chains, and endpoint chains are only
    referenced from the service chain's anonymous numgen vmap); the stale endpoint chains
    are flushed. kube-proxy deletes them in a later sync, once they have been stale for a
    second (kernels before 6.2 notice unreferenced chains late): nftables_stale_cleanup."""
    _ports_after, before, after = _changed(_ports(services), changed_index, ready)
    tx = _Tx()
    _nft_service(tx, after, elements=False, chains=True, cluster_cidr=cluster_cidr)
    for ip in before.endpoints[len(after.endpoints) :]:
        tx.op(f"flush chain {NFT_TABLE} {nft_endpoint_chain(before, ip)}")
    return tx.text()


def nftables_stale_cleanup(
    services: Sequence[BenchService | ServicePort], changed_index: int, ready: int
) -> str:
    """The separate transaction a later sync (>= 1 s after nftables_partial) sends first:
    deleting the stale endpoint chains."""
    _ports_after, before, after = _changed(_ports(services), changed_index, ready)
    return "".join(
        f"delete chain {NFT_TABLE} {nft_endpoint_chain(before, ip)}\n"
        for ip in before.endpoints[len(after.endpoints) :]
    )


# ---- nfacct (kube-proxy's nfacct.Ensure, for the counters the iptables rules name) ---------


def nfacct_argv(names: Iterable[str] = NFACCT_COUNTERS) -> list[list[str]]:
    """The nfacct objects kube-proxy creates before its first sync (its iptables rules
    match them where the kernel has xt_nfacct), as `nfacct add` commands (Debian package
    nfacct) to run in the node's network namespace. An existing object is not an error
    for kube-proxy; run these in a fresh namespace."""
    return [["nfacct", "add", name] for name in names]
