"""kube-proxy's iptables proxier: the iptables-restore input of a full sync and of the
partial sync after one endpoint change, and the single commands (nfacct counters, chains,
jump rules) it runs before its first restore. Loaded with RESTORE_FLAGS through either
backend of the iptables tool (iptables-legacy-restore, iptables-nft-restore).

The IPv6 proxier (family=Family.IPV6) writes the same chains through ip6tables (tool()),
with IPv6 addresses, endpoints as [ip]:port, and what proxier.go does only per family:
localhost NodePorts are IPv4-only (no KUBE-FIREWALL chain and rule in the restore input,
no 127.0.0.0/8 NodePort rule), and the KUBE-NODEPORTS jump excludes ::1/128.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lab.bench.kubeproxy.naming import (
    MASQ_MARK,
    ServicePort,
    changed,
    ext_chain,
    sep_chain,
    service_ports,
    svc_chain,
    svl_chain,
)
from lab.bench.scenario import PLANS, BenchService, Family

WAIT_FLAGS = ("-w", "5", "-W", "100000")
RESTORE_FLAGS = (*WAIT_FLAGS, "--noflush", "--counters")
NFACCT_INVALID = "ct_state_invalid_dropped_pkts"
NFACCT_LOCALHOST_NODEPORT = "localhost_nps_accepted_pkts"
NFACCT_COUNTERS = (NFACCT_INVALID, NFACCT_LOCALHOST_NODEPORT)
LARGE_CLUSTER_ENDPOINTS = 1000  # above this many endpoints, per-endpoint comments go

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


def tool(backend: str, family: Family) -> str:
    """The iptables tool of `family` for a backend named as the IPv4 one (iptables-legacy,
    iptables-nft): ip6tables-legacy, ip6tables-nft for IPv6; add -restore for restores."""
    return backend.replace("iptables", "ip6tables", 1) if family is Family.IPV6 else backend


def setup_argv(binary: str = "iptables") -> list[list[str]]:
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
    cluster_cidr: str | None,
    mark: str,
    random_fully: bool,
    family: Family,
) -> str:
    """One syncProxyRules output. write: indexes whose SVC/SVL/EXT/SEP chains are written
    (None = all, a full sync). stale: chains to flush and delete (-X). total_endpoints:
    kube-proxy's count for large-cluster mode, which includes not-ready endpoints.
    cluster_cidr None: no local-traffic detector (kube-proxy's NoOpLocalDetector), so
    no "! -s <pod CIDR>" masquerade and no pod short-circuit rules."""
    large = total_endpoints > LARGE_CLUSTER_ENDPOINTS
    localhost_node_ports = family is Family.IPV4  # route_localnet exists for IPv4 only
    q = '"'  # iptables-restore takes a quoted comment as one argument
    filter_chains = [
        ":KUBE-SERVICES - [0:0]",
        ":KUBE-EXTERNAL-SERVICES - [0:0]",
        ":KUBE-FORWARD - [0:0]",
        ":KUBE-NODEPORTS - [0:0]",
        ":KUBE-PROXY-FIREWALL - [0:0]",
    ]
    filter_rules: list[str] = []
    if localhost_node_ports:  # the mitigation of route_localnet's hole (issue 90259)
        filter_chains.append(":KUBE-FIREWALL - [0:0]")
        filter_rules.append(
            '-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections"'
            " -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate"
            " RELATED,ESTABLISHED,DNAT -j DROP"
        )
    filter_rules += [
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
        name, proto, ext = p.port_name_string, p.protocol, ext_chain(p)
        svc, svl = svc_chain(p), svl_chain(p)
        internal = svl if p.internal_local else svc  # internalTrafficChain
        cluster_ip = (
            f"-m comment --comment {q}{name} cluster IP{q} -m {proto} -p {proto}"
            f" -d {p.cluster_ip} --dport {p.port}"
        )
        nat.append(f"-A KUBE-SERVICES {cluster_ip} -j {internal}")
        if p.node_port is not None:
            np_match = f"-A KUBE-NODEPORTS -m comment --comment {name} -m {proto} -p {proto}"
            if nfacct and localhost_node_ports:  # kube-proxy writes it with its counter only
                nat.append(
                    f"{np_match} -d 127.0.0.0/8 --dport {p.node_port}"
                    f" -m nfacct --nfacct-name {NFACCT_LOCALHOST_NODEPORT} -j {ext}"
                )
            nat.append(f"{np_match} --dport {p.node_port} -j {ext}")
        if write is not None and i not in write:
            continue  # partial sync: this service's chains are unchanged
        if cluster_cidr is not None:
            nat.append(f"-A {internal} {cluster_ip} ! -s {cluster_cidr} -j KUBE-MARK-MASQ")
        if p.node_port is not None:
            nat_chains.append(f":{ext} - [0:0]")
            if not p.external_local:  # masquerade: the endpoint may be on another node
                nat.append(
                    f"-A {ext} -m comment --comment {q}masquerade traffic for {name} external"
                    f" destinations{q} -j KUBE-MARK-MASQ"
                )
                nat.append(f"-A {ext} -j {svc}")
            else:  # keep the client's address; pods and the node itself reach every endpoint
                if cluster_cidr is not None:
                    nat.append(
                        f"-A {ext} -m comment --comment {q}pod traffic for {name} external"
                        f" destinations{q} -s {cluster_cidr} -j {svc}"
                    )
                nat += [
                    f"-A {ext} -m comment --comment {q}masquerade LOCAL traffic for {name}"
                    f" external destinations{q} -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ",
                    f"-A {ext} -m comment --comment {q}route LOCAL traffic for {name} external"
                    f" destinations{q} -m addrtype --src-type LOCAL -j {svc}",
                    f"-A {ext} -j {svl}",
                ]
        if p.uses_cluster:
            nat_chains.append(f":{svc} - [0:0]")
            nat += _to_endpoints(p, svc, p.endpoints, large)
        if p.uses_local:
            nat_chains.append(f":{svl} - [0:0]")
            nat += _to_endpoints(p, svl, p.local_endpoints, large)
        for ip in p.reachable:
            sep = sep_chain(p, ip)
            nat_chains.append(f":{sep} - [0:0]")
            comment = "" if large else f" -m comment --comment {name}"
            recent = f" -m recent --name {sep} --set" if p.affinity_seconds is not None else ""
            nat.append(f"-A {sep}{comment} -s {ip} -j KUBE-MARK-MASQ")
            nat.append(
                f"-A {sep}{comment}{recent} -m {proto} -p {proto} -j DNAT --to-destination"
                f" {p.endpoint_string(ip)}"
            )
    for chain in stale:  # a chain line flushes it; then it can go
        nat_chains.append(f":{chain} - [0:0]")
        nat.append(f"-X {chain}")
    # NodePorts on ::1 never work (and make the kernel warn): kube-proxy excludes it.
    no_localhost = "" if localhost_node_ports else " ! -d ::1/128"
    nat.append(
        '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be'
        f' the last rule in this chain" -m addrtype --dst-type LOCAL{no_localhost}'
        " -j KUBE-NODEPORTS"
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


def _to_endpoints(p: ServicePort, chain: str, endpoints: Sequence[str], large: bool) -> list[str]:
    """writeServiceToEndpointRules: with affinity, first a `recent` check per endpoint (a
    client seen within the timeout goes back to its endpoint), then the random choice: rule
    i of n matches with probability 1/(n-i), the last always."""
    q = '"'
    rules = []

    def comment(ip: str) -> str:
        target = f"{p.port_name_string} -> {p.endpoint_string(ip)}"
        return "" if large else f" -m comment --comment {q}{target}{q}"

    if p.affinity_seconds is not None:
        for ip in endpoints:
            sep = sep_chain(p, ip)
            rules.append(
                f"-A {chain}{comment(ip)} -m recent --name {sep} --rcheck --seconds"
                f" {p.affinity_seconds} --reap -j {sep}"
            )
    count = len(endpoints)
    for e, ip in enumerate(endpoints):
        statistic = (
            f" -m statistic --mode random --probability {1.0 / (count - e):0.10f}"
            if e < count - 1
            else ""
        )
        rules.append(f"-A {chain}{comment(ip)}{statistic} -j {sep_chain(p, ip)}")
    return rules


def full_sync(
    services: Sequence[BenchService | ServicePort],
    *,
    family: Family = Family.IPV4,
    nfacct: bool = True,
    cluster_cidr: str | None = None,
    detect_local: bool = True,
    mark: str = MASQ_MARK,
    random_fully: bool = True,
) -> str:
    """iptables-restore input of a full sync (filter and nat tables) of `family`'s proxier.
    Load it with RESTORE_FLAGS after setup_argv(); nfacct=True needs the NFACCT_COUNTERS to
    exist (create_nfacct_counters), as kube-proxy creates them first. cluster_cidr: the
    pod CIDR (default: the bench's, of `family`); detect_local=False: none configured."""
    ports = service_ports(services, family)
    return _iptables_sync(
        ports,
        None,
        [],
        total_endpoints=sum(len(p.endpoints) for p in ports),
        nfacct=nfacct,
        cluster_cidr=_cluster_cidr(family, cluster_cidr, detect_local),
        mark=mark,
        random_fully=random_fully,
        family=family,
    )


def _cluster_cidr(family: Family, cluster_cidr: str | None, detect_local: bool) -> str | None:
    if not detect_local:
        return None
    return cluster_cidr if cluster_cidr is not None else PLANS[family].cluster_cidr


def partial_sync(
    services: Sequence[BenchService | ServicePort],
    changed_index: int,
    ready: int,
    *,
    cleanup: bool | None = None,
    family: Family = Family.IPV4,
    nfacct: bool = True,
    cluster_cidr: str | None = None,
    detect_local: bool = True,
    mark: str = MASQ_MARK,
    random_fully: bool = True,
) -> str:
    """The partial sync (kube-proxy >= 1.26) after service changed_index kept only its first
    `ready` endpoints: filter and the nat base chains rewritten whole, only that service's
    SVC/SVL/EXT/SEP chains rewritten, its stale SEP chains flushed and deleted.

    cleanup: whether stale chains are deleted in this sync. kube-proxy always does it below
    LARGE_CLUSTER_ENDPOINTS; above, at most once per syncPeriod (30 s), so None (the
    default) assumes the last cleanup was recent and keeps them there."""
    before_ports = service_ports(services, family)
    ports, before, after = changed(before_ports, changed_index, ready)
    total = sum(len(p.endpoints) for p in before_ports)  # the not-ready one still counts
    if cleanup is None:
        cleanup = total <= LARGE_CLUSTER_ENDPOINTS
    stale = [sep_chain(before, ip) for ip in before.reachable if ip not in after.reachable]
    return _iptables_sync(
        ports,
        {changed_index},
        stale if cleanup else [],
        total_endpoints=total,
        nfacct=nfacct,
        cluster_cidr=_cluster_cidr(family, cluster_cidr, detect_local),
        mark=mark,
        random_fully=random_fully,
        family=family,
    )


# nfacct: kube-proxy's nfacct.Ensure, for the counters the rules above name.


def nfacct_argv(names: Iterable[str] = NFACCT_COUNTERS) -> list[list[str]]:
    """The nfacct objects kube-proxy creates before its first sync (its iptables rules
    match them where the kernel has xt_nfacct), as `nfacct add` commands (Debian package
    nfacct) to run in the node's network namespace. An existing object is not an error
    for kube-proxy; run these in a fresh namespace."""
    return [["nfacct", "add", name] for name in names]
