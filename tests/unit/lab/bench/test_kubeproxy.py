"""The kube-proxy rule generators (lab.bench.kubeproxy), checked without a kernel.

Expected lines marked "kube-proxy" are quoted from kubernetes/kubernetes test expectations:
pkg/proxy/iptables/proxier_test.go (TestOverallIPTablesRules, TestSyncProxyRulesRepeated)
and pkg/proxy/nftables/proxier_test.go (baseRules, TestOverallNFTablesRules). Those tests'
fake proxiers use mark 0x4000, pod CIDR 10.0.0.0/8, service CIDR 172.30.0.0/16, node IP
192.168.0.2 and (iptables) no --random-fully, so the same options are passed here.
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from lab.bench import kubeproxy
from lab.bench.kubeproxy import iptables, naming, nftables
from lab.bench.kubeproxy.naming import ServicePort
from lab.bench.scenario import CLUSTER_CIDR, NODE_PORT, bench_services

POD_CIDR, MARK = "10.0.0.0/8", "0x4000"  # the upstream fake proxiers'
SVC1 = ServicePort("ns1", "svc1", "p80", "172.30.0.41", ("10.180.0.1",), 80, 80)
SVC3 = ServicePort("ns3", "svc3", "p80", "172.30.0.43", ("10.180.0.3",), 80, 80, node_port=3003)


# ---- chain names ---------------------------------------------------------------------------


def test_iptables_chain_hashes_match_kube_proxy() -> None:
    # kube-proxy: TestOverallIPTablesRules (KUBE-SVC/EXT/SEP names of ns1/svc1 and ns3/svc3).
    assert naming.svc_chain(SVC1) == "KUBE-SVC-XPGD46QRK7WJZT7O"
    assert naming.sep_chain(SVC1, "10.180.0.1") == "KUBE-SEP-SXIVWICOYRO3J4NJ"
    assert naming.svc_chain(SVC3) == "KUBE-SVC-X27LE4BHSL4DOUIK"
    assert naming.ext_chain(SVC3) == "KUBE-EXT-X27LE4BHSL4DOUIK"
    assert naming.sep_chain(SVC3, "10.180.0.3") == "KUBE-SEP-OYPFS5VJICHGATKP"


def test_nftables_chain_names_match_kube_proxy() -> None:
    # kube-proxy: TestOverallNFTablesRules (service-/external-/endpoint- chains).
    assert naming.nft_service_chain(SVC1) == "service-ULMVA6XW-ns1/svc1/tcp/p80"
    assert (
        naming.nft_endpoint_chain(SVC1, "10.180.0.1")
        == "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
    )
    assert naming.nft_external_chain(SVC3) == "external-4AT6LBPK-ns3/svc3/tcp/p80"
    assert (
        naming.nft_endpoint_chain(SVC3, "10.180.0.3")
        == "endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80"
    )


def test_the_two_modes_hash_differently() -> None:
    svc = ServicePort.of(bench_services(1, 2)[0])
    assert naming.portproto_hash(svc.port_name_string, "tcp") == naming.svc_chain(svc)[9:]
    assert naming.nft_service_chain(svc).startswith("service-")
    assert naming.nft_service_chain(svc).endswith("-bench/svc-000000/tcp/http")
    assert len(naming.nft_service_chain(svc).split("-")[1]) == 8  # 8 base32 characters


# ---- iptables: against kube-proxy's expectations --------------------------------------------

IPTABLES_OVERALL = """\
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 \
! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name \
ct_state_invalid_dropped_pkts -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark \
0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack \
--ctstate RELATED,ESTABLISHED -j ACCEPT
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXT-X27LE4BHSL4DOUIK - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-OYPFS5VJICHGATKP - [0:0]
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
:KUBE-SVC-X27LE4BHSL4DOUIK - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3003 \
-m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-X27LE4BHSL4DOUIK
-A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp --dport 3003 \
-j KUBE-EXT-X27LE4BHSL4DOUIK
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 \
--dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 \
--dport 80 -j KUBE-SVC-X27LE4BHSL4DOUIK
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the \
last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-EXT-X27LE4BHSL4DOUIK -m comment --comment "masquerade traffic for ns3/svc3:p80 external \
destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-X27LE4BHSL4DOUIK -j KUBE-SVC-X27LE4BHSL4DOUIK
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
-A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
-A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -m tcp -p tcp -j DNAT \
--to-destination 10.180.0.3:80
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT \
--to-destination 10.180.0.1:80
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp \
-d 172.30.0.43 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.180.0.3:80" \
-j KUBE-SEP-OYPFS5VJICHGATKP
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp \
-d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" \
-j KUBE-SEP-SXIVWICOYRO3J4NJ
"""

# TestSyncProxyRulesRepeated, "Add an endpoint to a service": a partial sync rewriting only
# ns3/svc3 (two endpoints). That test's kube-proxy had no nfacct counters.
IPTABLES_PARTIAL = """\
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 \
! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark \
0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack \
--ctstate RELATED,ESTABLISHED -j ACCEPT
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-DKCFIS26GWF2WLWC - [0:0]
:KUBE-SEP-JVVZVJ7BSEPPRNBS - [0:0]
:KUBE-SVC-X27LE4BHSL4DOUIK - [0:0]
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 \
--dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 \
--dport 80 -j KUBE-SVC-X27LE4BHSL4DOUIK
-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 \
--dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the \
last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
-A KUBE-SEP-DKCFIS26GWF2WLWC -m comment --comment ns3/svc3:p80 -s 10.0.3.2 -j KUBE-MARK-MASQ
-A KUBE-SEP-DKCFIS26GWF2WLWC -m comment --comment ns3/svc3:p80 -m tcp -p tcp -j DNAT \
--to-destination 10.0.3.2:80
-A KUBE-SEP-JVVZVJ7BSEPPRNBS -m comment --comment ns3/svc3:p80 -s 10.0.3.3 -j KUBE-MARK-MASQ
-A KUBE-SEP-JVVZVJ7BSEPPRNBS -m comment --comment ns3/svc3:p80 -m tcp -p tcp -j DNAT \
--to-destination 10.0.3.3:80
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp \
-d 172.30.0.43 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.0.3.2:80" -m statistic \
--mode random --probability 0.5000000000 -j KUBE-SEP-DKCFIS26GWF2WLWC
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.0.3.3:80" \
-j KUBE-SEP-JVVZVJ7BSEPPRNBS
"""


def _lines(text: str) -> list[str]:
    """Restore input without table headers, sorted (as kube-proxy's assertion compares)."""
    return sorted(
        line for line in text.splitlines() if line and line not in ("*filter", "*nat", "COMMIT")
    )


def test_iptables_full_matches_kube_proxy_overall_rules() -> None:
    text = iptables.full_sync([SVC1, SVC3], random_fully=False, cluster_cidr=POD_CIDR, mark=MARK)
    assert _lines(text) == _lines(IPTABLES_OVERALL)


def test_iptables_partial_matches_kube_proxy_repeated_sync() -> None:
    svc1 = ServicePort("ns1", "svc1", "p80", "172.30.0.41", ("10.0.1.1",), 80, 80)
    endpoints = ("10.0.3.2", "10.0.3.3", "10.0.3.9")
    svc3 = ServicePort("ns3", "svc3", "p80", "172.30.0.43", endpoints, 80, 80)
    svc4 = ServicePort("ns4", "svc4", "p80", "172.30.0.44", ("10.0.4.1",), 80, 80)
    text = iptables.partial_sync(
        [svc1, svc3, svc4], 1, 2, nfacct=False, random_fully=False, cluster_cidr=POD_CIDR, mark=MARK
    )
    stale = naming.sep_chain(svc3, "10.0.3.9")  # ours drops 10.0.3.9; upstream's step did not
    assert f":{stale} - [0:0]" in text.splitlines()
    assert f"-X {stale}" in text.splitlines()
    ours = [line for line in _lines(text) if stale not in line]
    assert ours == _lines(IPTABLES_PARTIAL)


# ---- iptables: structure -------------------------------------------------------------------


def _nat(text: str) -> list[str]:
    return text.split("*nat\n", 1)[1].splitlines()


def _rules(text: str, chain: str) -> list[str]:
    return [line for line in _nat(text) if line.startswith(f"-A {chain} ")]


@pytest.mark.parametrize(("count", "endpoints"), [(1, 2), (5, 3), (40, 8)])
def test_iptables_rule_counts_scale(count: int, endpoints: int) -> None:
    text = iptables.full_sync(bench_services(count, endpoints))
    nat_rules = [line for line in _nat(text) if line.startswith("-A ")]
    # base 4, per service: KUBE-SERVICES, SVC masquerade, K SVC->SEP, 2K SEP; the NodePort
    # service: 2 KUBE-NODEPORTS and 2 EXT rules; the final KUBE-NODEPORTS jump.
    assert len(nat_rules) == 4 + count * (2 + 3 * endpoints) + 4 + 1
    chains = [line for line in _nat(text) if line.startswith(":")]
    assert len(chains) == 4 + count * (1 + endpoints) + 1


def test_nodeport_jump_is_the_last_rule_of_kube_services() -> None:
    services = bench_services(20, 2)
    for text in (iptables.full_sync(services), iptables.partial_sync(services, 7, 1)):
        last = _rules(text, "KUBE-SERVICES")[-1]
        assert "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS" in last
        assert _rules(text, "KUBE-SERVICES")[:-1] == [
            line for line in _rules(text, "KUBE-SERVICES") if "cluster IP" in line
        ]


@pytest.mark.parametrize("endpoints", range(2, 9))
def test_probabilities_are_one_over_remaining(endpoints: int) -> None:
    svc = ServicePort.of(bench_services(1, endpoints, node_port=False)[0])
    rules = _rules(iptables.full_sync([svc]), naming.svc_chain(svc))[
        1:
    ]  # after the masquerade rule
    assert len(rules) == endpoints
    for i, rule in enumerate(rules[:-1]):
        match = re.search(r"--probability (\S+) ", rule)
        assert match is not None
        assert match[1] == f"{1 / (endpoints - i):.10f}"
    assert "statistic" not in rules[-1]
    assert rules[-1].endswith(naming.sep_chain(svc, svc.endpoints[-1]))


def test_nodeport_service_as_kube_proxy_writes_etp_cluster() -> None:
    services = bench_services(3, 2)
    svc = ServicePort.of(services[-1])
    text = iptables.full_sync(services)
    ext, name = naming.ext_chain(svc), svc.port_name_string
    assert _rules(text, "KUBE-NODEPORTS") == [
        f"-A KUBE-NODEPORTS -m comment --comment {name} -m tcp -p tcp -d 127.0.0.0/8 --dport"
        f" {NODE_PORT} -m nfacct --nfacct-name localhost_nps_accepted_pkts -j {ext}",
        f"-A KUBE-NODEPORTS -m comment --comment {name} -m tcp -p tcp --dport {NODE_PORT} -j {ext}",
    ]
    assert _rules(text, ext) == [
        f'-A {ext} -m comment --comment "masquerade traffic for {name} external destinations"'
        " -j KUBE-MARK-MASQ",
        f"-A {ext} -j {naming.svc_chain(svc)}",
    ]
    assert f"! -s {CLUSTER_CIDR} -j KUBE-MARK-MASQ" in _rules(text, naming.svc_chain(svc))[0]
    assert "MASQUERADE --random-fully" in text
    assert "--mark 0x00004000/0x00004000" in text  # kube-proxy's "%#08x" of 1<<14
    assert iptables.full_sync(services, nfacct=False).count("nfacct") == 0


def test_iptables_partial_holds_only_the_changed_service() -> None:
    services = bench_services(30, 3)
    changed = ServicePort.of(services[11])
    text = iptables.partial_sync(services, 11, 2)
    chains = {line[1:].split()[0] for line in _nat(text) if line.startswith(":")}
    stale = naming.sep_chain(changed, changed.endpoints[2])
    assert chains == {
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
        naming.svc_chain(changed),
        *(naming.sep_chain(changed, ip) for ip in changed.endpoints),
    }
    assert f"-X {stale}" in _nat(text)
    assert len(_rules(text, "KUBE-SERVICES")) == 31  # rewritten whole
    assert "*filter" in text and ":KUBE-FORWARD - [0:0]" in text
    # The NodePort service's chains are not rewritten unless it is the changed one.
    assert naming.ext_chain(ServicePort.of(services[-1])) not in {c for c in chains}
    partial_np = iptables.partial_sync(services, 29, 1)
    assert f":{naming.ext_chain(ServicePort.of(services[-1]))} - [0:0]" in _nat(partial_np)


def test_large_cluster_mode() -> None:
    services = bench_services(400, 3)  # 1200 endpoints > 1000
    svc = ServicePort.of(services[0])
    text = iptables.full_sync(services)
    assert _rules(text, naming.sep_chain(svc, svc.endpoints[0]))[0] == (
        f"-A {naming.sep_chain(svc, svc.endpoints[0])} -s {svc.endpoints[0]} -j KUBE-MARK-MASQ"
    )
    assert "->" not in "".join(_rules(text, naming.svc_chain(svc)))
    # Stale chains wait for the next cleanup (once per syncPeriod) unless asked for.
    assert "-X " not in iptables.partial_sync(services, 3, 2)
    assert "-X " in iptables.partial_sync(services, 3, 2, cleanup=True)


def _iptables_apply(state: dict[str, dict[str, list[str]]], text: str) -> None:
    """iptables-restore --noflush: a chain line creates or flushes, -A appends, -X deletes."""
    table = ""
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":"):
            state[table][line[1:].split()[0]] = []
        elif line.startswith("-A "):
            state[table][line.split()[1]].append(line)
        elif line.startswith("-X "):
            chain = line.split()[1]
            assert not state[table][chain], "iptables refuses to delete a non-empty chain"
            assert not any(f"-j {chain}" in r for rules in state[table].values() for r in rules)
            del state[table][chain]


def test_iptables_partial_on_full_equals_full_of_the_new_state() -> None:
    before = bench_services(12, 4)
    for index, ready in ((3, 2), (11, 1), (0, 4)):
        after = [ServicePort.of(s).with_ready(ready) if s.index == index else s for s in before]
        patched: dict[str, dict[str, list[str]]] = defaultdict(dict)
        fresh: dict[str, dict[str, list[str]]] = defaultdict(dict)
        _iptables_apply(patched, iptables.full_sync(before))
        _iptables_apply(patched, iptables.partial_sync(before, index, ready))
        _iptables_apply(fresh, iptables.full_sync(after))
        assert patched == fresh


def test_setup_argv_creates_chains_before_jumping() -> None:
    argv = iptables.setup_argv("iptables-legacy")
    assert all(a[:5] == ["iptables-legacy", "-w", "5", "-W", "100000"] for a in argv)
    created: set[tuple[str, str]] = set()
    for a in argv:
        op, chain, table = a[5], a[6], a[8]
        if op == "-N":
            created.add((table, chain))
        else:
            assert op == "-I"
            assert (table, a[-1]) in created
    jumps = [(a[8], a[6], a[-1]) for a in argv if a[5] == "-I"]
    assert ("nat", "PREROUTING", "KUBE-SERVICES") in jumps
    assert ("nat", "POSTROUTING", "KUBE-POSTROUTING") in jumps
    assert ("filter", "FORWARD", "KUBE-FORWARD") in jumps
    assert iptables.RESTORE_FLAGS == ("-w", "5", "-W", "100000", "--noflush", "--counters")


def test_ready_must_leave_an_endpoint() -> None:
    services = bench_services(2, 3)
    for bad in (0, 4):
        with pytest.raises(ValueError):
            iptables.partial_sync(services, 0, bad)
        with pytest.raises(ValueError):
            nftables.partial_sync(services, 0, bad)


# ---- nftables ------------------------------------------------------------------------------

# kube-proxy: pkg/proxy/nftables/proxier_test.go baseRules, then the svc1 and svc3 blocks of
# TestOverallNFTablesRules.
NFT_OVERALL = """\
add table ip kube-proxy { comment "rules for kube-proxy" ; }
add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add set ip kube-proxy nodeport-ips { type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }
add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; \
comment "destinations that are subject to LoadBalancerSourceRanges" ; }
add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; \
comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : \
verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; \
comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; \
comment "NodePort traffic" ; }
add chain ip kube-proxy cluster-ips-check
add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }
add chain ip kube-proxy filter-output-pre-dnat { type filter hook output priority -110 ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority 0 ; }
add chain ip kube-proxy filter-input { type filter hook input priority 0 ; }
add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }
add chain ip kube-proxy firewall-check
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy masquerading
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nodeport-endpoints-check
add chain ip kube-proxy reject-chain { comment \
"helper for @no-endpoint-services / @no-endpoint-nodeports" ; }
add chain ip kube-proxy services
add chain ip kube-proxy service-endpoints-check
add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment \
"Reject traffic to invalid ports of ClusterIPs"
add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment \
"Drop traffic to unallocated ClusterIPs"
add rule ip kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-output ct state new jump cluster-ips-check
add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000
add rule ip kube-proxy masquerading mark and 0x4000 == 0 return
add rule ip kube-proxy masquerading mark set mark xor 0x4000
add rule ip kube-proxy masquerading masquerade fully-random
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport \
vmap @no-endpoint-nodeports
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap \
@service-nodeports
add element ip kube-proxy nodeport-ips { 192.168.0.2 }
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap \
@no-endpoint-services
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 ip saddr != \
10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto \
endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }
add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 \
jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp \
dnat to 10.180.0.1:80
add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto \
service-ULMVA6XW-ns1/svc1/tcp/p80 }
add chain ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 ip daddr 172.30.0.43 ip saddr != \
10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 numgen random mod 1 vmap { 0 : goto \
endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 }
add chain ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 goto service-4AT6LBPK-ns3/svc3/tcp/p80
add chain ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 \
jump mark-for-masquerade
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 meta l4proto tcp \
dnat to 10.180.0.3:80
add element ip kube-proxy cluster-ips { 172.30.0.43 }
add element ip kube-proxy service-ips { 172.30.0.43 . tcp . 80 : goto \
service-4AT6LBPK-ns3/svc3/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3003 : goto \
external-4AT6LBPK-ns3/svc3/tcp/p80 }
"""

_OBJECT = re.compile(
    r"^(add|delete|flush) (table|chain|rule|set|map|element) ip6? kube-proxy ?(\S*)"
)


class NftState:
    """What `nft -f` leaves in table ip (or ip6) kube-proxy, as knftables' Fake.Dump() lists
    it."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], str] = {}  # (kind, name) -> its add line
        self.rules: dict[str, list[str]] = defaultdict(list)
        self.elements: dict[str, list[str]] = defaultdict(list)

    def apply(self, text: str) -> NftState:
        for line in text.splitlines():
            match = _OBJECT.match(line)
            assert match, line
            verb, kind, name = match.groups()
            if kind == "rule":
                assert ("chain", name) in self.objects, line
                self.rules[name].append(line)
            elif kind == "element":
                assert ("set", name) in self.objects or ("map", name) in self.objects, line
                if line not in self.elements[name]:
                    self.elements[name].append(line)
            elif verb == "add":
                previous = self.objects.get((kind, name))
                if previous is None or "{" not in previous:  # nft keeps the first spec
                    self.objects[(kind, name)] = line
            elif verb == "flush":
                (self.rules if kind == "chain" else self.elements).pop(name, None)
            else:  # delete
                assert not self.rules.get(name), f"deleting non-empty {line}"
                assert not any(name in r for rules in self.rules.values() for r in rules), line
                del self.objects[(kind, name)]
                self.elements.pop(name, None)
        return self

    def lines(self) -> list[str]:
        everything = [*self.objects.values()]
        everything += [r for rules in self.rules.values() for r in rules]
        everything += [e for elements in self.elements.values() for e in elements]
        return sorted(everything)


def test_nftables_full_matches_kube_proxy_overall_rules() -> None:
    text = nftables.full_sync(
        [SVC1, SVC3],
        node_ip="192.168.0.2",
        service_cidr="172.30.0.0/16",
        cluster_cidr=POD_CIDR,
        mark=MARK,
    )
    expected = [line for line in NFT_OVERALL.splitlines() if line]
    assert NftState().apply(text).lines() == sorted(expected)


def test_nftables_maps_hold_every_service() -> None:
    services = bench_services(50, 3)
    text = nftables.full_sync(services, node_ip="192.168.50.1")
    state = NftState().apply(text)
    assert len(state.elements["service-ips"]) == 50
    assert len(state.elements["cluster-ips"]) == 50
    assert state.elements["service-nodeports"] == [
        f"add element ip kube-proxy service-nodeports {{ tcp . {NODE_PORT} : goto"
        f" {naming.nft_external_chain(ServicePort.of(services[-1]))} }}"
    ]
    for svc in map(ServicePort.of, services):
        vmap = [r for r in state.rules[naming.nft_service_chain(svc)] if "numgen" in r]
        assert vmap == [
            f"add rule ip kube-proxy {naming.nft_service_chain(svc)} numgen random mod 3 vmap {{ "
            + " , ".join(
                f"{i} : goto {naming.nft_endpoint_chain(svc, ip)}"
                for i, ip in enumerate(svc.endpoints)
            )
            + " }"
        ]
    # Match-all --nodeport-addresses instead of "primary":
    match_all = NftState().apply(nftables.full_sync(services))
    assert ("set", "nodeport-ips") not in match_all.objects
    assert any("fib daddr type local" in r for r in match_all.rules["services"])


def test_nftables_partial_is_o_changed() -> None:
    services = bench_services(200, 3)
    changed = ServicePort.of(services[42])
    text = nftables.partial_sync(services, 42, 2)
    assert "add element" not in text and " map " not in text
    named = {line.split()[4] for line in text.splitlines()}
    assert named == {
        naming.nft_service_chain(changed),
        *(naming.nft_endpoint_chain(changed, ip) for ip in changed.endpoints),
    }
    stale = naming.nft_endpoint_chain(changed, changed.endpoints[2])
    assert text.splitlines()[-1] == f"flush chain ip kube-proxy {stale}"
    assert nftables.stale_cleanup(services, 42, 2) == f"delete chain ip kube-proxy {stale}\n"
    assert len(text.splitlines()) == len(
        nftables.partial_sync(bench_services(5, 3), 2, 2).splitlines()
    )


def test_nftables_partial_on_full_equals_full_of_the_new_state() -> None:
    before = bench_services(9, 5)
    for index, ready in ((2, 3), (8, 1), (4, 5)):
        after = [ServicePort.of(s).with_ready(ready) if s.index == index else s for s in before]
        patched = NftState().apply(nftables.full_sync(before, node_ip="192.168.50.1"))
        patched.apply(nftables.partial_sync(before, index, ready))
        stale = nftables.stale_cleanup(before, index, ready)
        if stale:
            assert (
                patched.lines()
                != NftState().apply(nftables.full_sync(after, node_ip="192.168.50.1")).lines()
            )
        patched.apply(stale)
        fresh = NftState().apply(nftables.full_sync(after, node_ip="192.168.50.1"))
        assert patched.lines() == fresh.lines()


def test_left_out_is_documented() -> None:
    assert len(kubeproxy.LEFT_OUT) >= 5
    assert any("LoadBalancer IPs" in item for item in kubeproxy.LEFT_OUT)
    assert kubeproxy.__doc__ is not None and "proxier_test.go" in kubeproxy.__doc__
