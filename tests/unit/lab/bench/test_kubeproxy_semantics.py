"""Session affinity and the Local traffic policies in the kube-proxy rule generators, and the
bench's --mix that programs them on both sides; checked without a kernel.

Expected lines marked "kube-proxy" are quoted from kubernetes/kubernetes:
pkg/proxy/iptables/proxier_test.go (TestOverallIPTablesRules svc5, TestInternalTrafficPolicyE2E
"local and there are local endpoints", TestTerminatingEndpointsTrafficPolicyLocal "ready
endpoints exist") and pkg/proxy/nftables/proxier_test.go (TestOverallNFTablesRules svc2 and
svc5). Lines for a LoadBalancer IP, loadBalancerSourceRanges or a health check node port
are left out of the quotes: the generators do not model those (kubeproxy.LEFT_OUT).
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from ebpflb.errors import ConfigError
from lab.bench import command, kubeproxy
from lab.bench.kubeproxy import iptables, naming, nftables
from lab.bench.kubeproxy.naming import ServicePort
from lab.bench.records import codec
from lab.bench.scenario import (
    AGENT_NODE,
    BACKEND_NODE,
    NODE_PORT,
    Mix,
    bench_services,
    objects,
    parse_mix,
    service_object,
    slice_object,
)
from lab.bench.settings import CompareSettings
from tests.unit.lab.bench.test_command import parse
from tests.unit.lab.bench.test_kubeproxy import (
    IPTABLES_OVERALL,
    MARK,
    NFT_OVERALL,
    POD_CIDR,
    SVC1,
    SVC3,
    NftState,
    _iptables_apply,
    _lines,
)

# TestOverallIPTablesRules / TestOverallNFTablesRules svc5: ClientIP affinity, 10800 s
# (a LoadBalancer with source ranges upstream; its NodePort is what is modelled here).
SVC5 = ServicePort(
    "ns5", "svc5", "p80", "172.30.0.45", ("10.180.0.3",), 80, 80, node_port=3002,
    affinity_seconds=10800,
)  # fmt: skip

# kube-proxy: TestOverallIPTablesRules, the ns5/svc5 lines (KUBE-FW-*, the loadbalancer IP
# rule and KUBE-PROXY-FIREWALL's DROP left out).
IPTABLES_SVC5 = """\
:KUBE-EXT-NUKIZ6OKUXPJNT4C - [0:0]
:KUBE-SEP-I77PXRDZVX7PMWMN - [0:0]
:KUBE-SVC-NUKIZ6OKUXPJNT4C - [0:0]
-A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3002 \
-m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-NUKIZ6OKUXPJNT4C
-A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp --dport 3002 \
-j KUBE-EXT-NUKIZ6OKUXPJNT4C
-A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 172.30.0.45 \
--dport 80 -j KUBE-SVC-NUKIZ6OKUXPJNT4C
-A KUBE-EXT-NUKIZ6OKUXPJNT4C -m comment --comment "masquerade traffic for ns5/svc5:p80 external \
destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-NUKIZ6OKUXPJNT4C -j KUBE-SVC-NUKIZ6OKUXPJNT4C
-A KUBE-SEP-I77PXRDZVX7PMWMN -m comment --comment ns5/svc5:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
-A KUBE-SEP-I77PXRDZVX7PMWMN -m comment --comment ns5/svc5:p80 -m recent --name \
KUBE-SEP-I77PXRDZVX7PMWMN --set -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80
-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp \
-d 172.30.0.45 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -m recent \
--name KUBE-SEP-I77PXRDZVX7PMWMN --rcheck --seconds 10800 --reap -j KUBE-SEP-I77PXRDZVX7PMWMN
-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" \
-j KUBE-SEP-I77PXRDZVX7PMWMN
"""

# kube-proxy: TestInternalTrafficPolicyE2E, "internalTrafficPolicy is local and there are local
# endpoints" (the whole restore input; that test's proxier has no nfacct counters).
IPTABLES_ITP_LOCAL = """\
*filter
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
COMMIT
*nat
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-3JOIVZTXZZRGORX4 - [0:0]
:KUBE-SVL-AQI2S6QIMU7PVVRP - [0:0]
-A KUBE-SERVICES -m comment --comment "ns1/svc1 cluster IP" -m tcp -p tcp -d 172.30.1.1 \
--dport 80 -j KUBE-SVL-AQI2S6QIMU7PVVRP
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the \
last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
-A KUBE-SEP-3JOIVZTXZZRGORX4 -m comment --comment ns1/svc1 -s 10.0.1.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-3JOIVZTXZZRGORX4 -m comment --comment ns1/svc1 -m tcp -p tcp -j DNAT \
--to-destination 10.0.1.1:80
-A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 cluster IP" -m tcp -p tcp \
-d 172.30.1.1 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.1:80" \
-j KUBE-SEP-3JOIVZTXZZRGORX4
COMMIT
"""

# kube-proxy: TestTerminatingEndpointsTrafficPolicyLocal, "ready endpoints exist": eTP Local
# with affinity; 10.0.1.1 and 10.0.1.2 local, 10.0.1.5 on another node (the terminating ones
# are not ready, so not here). The service's own chains only: upstream reaches KUBE-EXT
# through a LoadBalancer IP, here through a NodePort.
IPTABLES_ETP_LOCAL_AFFINITY_CHAINS = """\
:KUBE-EXT-AQI2S6QIMU7PVVRP - [0:0]
:KUBE-SEP-3JOIVZTXZZRGORX4 - [0:0]
:KUBE-SEP-EQCHZ7S2PJ72OHAY - [0:0]
:KUBE-SEP-IO5XOSKPAXIFQXAJ - [0:0]
:KUBE-SVC-AQI2S6QIMU7PVVRP - [0:0]
:KUBE-SVL-AQI2S6QIMU7PVVRP - [0:0]
-A KUBE-EXT-AQI2S6QIMU7PVVRP -m comment --comment "pod traffic for ns1/svc1 external \
destinations" -s 10.0.0.0/8 -j KUBE-SVC-AQI2S6QIMU7PVVRP
-A KUBE-EXT-AQI2S6QIMU7PVVRP -m comment --comment "masquerade LOCAL traffic for ns1/svc1 external \
destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
-A KUBE-EXT-AQI2S6QIMU7PVVRP -m comment --comment "route LOCAL traffic for ns1/svc1 external \
destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-AQI2S6QIMU7PVVRP
-A KUBE-EXT-AQI2S6QIMU7PVVRP -j KUBE-SVL-AQI2S6QIMU7PVVRP
-A KUBE-SEP-3JOIVZTXZZRGORX4 -m comment --comment ns1/svc1 -s 10.0.1.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-3JOIVZTXZZRGORX4 -m comment --comment ns1/svc1 -m recent --name \
KUBE-SEP-3JOIVZTXZZRGORX4 --set -m tcp -p tcp -j DNAT --to-destination 10.0.1.1:80
-A KUBE-SEP-EQCHZ7S2PJ72OHAY -m comment --comment ns1/svc1 -s 10.0.1.5 -j KUBE-MARK-MASQ
-A KUBE-SEP-EQCHZ7S2PJ72OHAY -m comment --comment ns1/svc1 -m recent --name \
KUBE-SEP-EQCHZ7S2PJ72OHAY --set -m tcp -p tcp -j DNAT --to-destination 10.0.1.5:80
-A KUBE-SEP-IO5XOSKPAXIFQXAJ -m comment --comment ns1/svc1 -s 10.0.1.2 -j KUBE-MARK-MASQ
-A KUBE-SEP-IO5XOSKPAXIFQXAJ -m comment --comment ns1/svc1 -m recent --name \
KUBE-SEP-IO5XOSKPAXIFQXAJ --set -m tcp -p tcp -j DNAT --to-destination 10.0.1.2:80
-A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 cluster IP" -m tcp -p tcp \
-d 172.30.1.1 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.1:80" -m recent --name \
KUBE-SEP-3JOIVZTXZZRGORX4 --rcheck --seconds 10800 --reap -j KUBE-SEP-3JOIVZTXZZRGORX4
-A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.2:80" -m recent --name \
KUBE-SEP-IO5XOSKPAXIFQXAJ --rcheck --seconds 10800 --reap -j KUBE-SEP-IO5XOSKPAXIFQXAJ
-A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.5:80" -m recent --name \
KUBE-SEP-EQCHZ7S2PJ72OHAY --rcheck --seconds 10800 --reap -j KUBE-SEP-EQCHZ7S2PJ72OHAY
-A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.1:80" -m statistic --mode \
random --probability 0.3333333333 -j KUBE-SEP-3JOIVZTXZZRGORX4
-A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.2:80" -m statistic --mode \
random --probability 0.5000000000 -j KUBE-SEP-IO5XOSKPAXIFQXAJ
-A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.5:80" \
-j KUBE-SEP-EQCHZ7S2PJ72OHAY
-A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.1:80" -m recent --name \
KUBE-SEP-3JOIVZTXZZRGORX4 --rcheck --seconds 10800 --reap -j KUBE-SEP-3JOIVZTXZZRGORX4
-A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.2:80" -m recent --name \
KUBE-SEP-IO5XOSKPAXIFQXAJ --rcheck --seconds 10800 --reap -j KUBE-SEP-IO5XOSKPAXIFQXAJ
-A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.1:80" -m statistic --mode \
random --probability 0.5000000000 -j KUBE-SEP-3JOIVZTXZZRGORX4
-A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.2:80" \
-j KUBE-SEP-IO5XOSKPAXIFQXAJ
"""


def _in_order(lines: list[str], nft: bool = False) -> dict[str, list[str]]:
    """Rules by chain, in their order (the sorted comparisons do not see order, and an
    affinity check must come before the random choice)."""
    chains: dict[str, list[str]] = defaultdict(list)
    for line in lines:
        if nft and line.startswith("add rule "):
            chains[line.split()[4]].append(line)
        elif not nft and line.startswith("-A "):
            chains[line.split()[1]].append(line)
    return chains


def _order_holds(ours: list[str], expected: str, nft: bool = False) -> None:
    shared = ("KUBE-SERVICES", "KUBE-NODEPORTS")  # other services' rules are there too
    want = {
        chain: rules
        for chain, rules in _in_order(expected.splitlines(), nft).items()
        if chain not in shared
    }
    got = _in_order(ours, nft)
    assert {chain: got[chain] for chain in want} == want


def _service_chain_lines(text: str) -> list[str]:
    """The nat lines of per-service chains (declarations and rules)."""
    nat = text.split("*nat\n", 1)[1].splitlines()
    prefixes = tuple(
        f"{lead}KUBE-{kind}-" for lead in (":", "-A ") for kind in ("SVC", "SVL", "EXT", "SEP")
    )
    return sorted(line for line in nat if line.startswith(prefixes))


def test_iptables_affinity_matches_kube_proxy_overall_svc5() -> None:
    text = iptables.full_sync(
        [SVC1, SVC3, SVC5], random_fully=False, cluster_cidr=POD_CIDR, mark=MARK
    )
    assert _lines(text) == sorted(_lines(IPTABLES_OVERALL) + _lines(IPTABLES_SVC5))
    _order_holds(text.splitlines(), IPTABLES_SVC5)


def test_iptables_internal_local_matches_kube_proxy() -> None:
    svc = ServicePort(
        "ns1", "svc1", "", "172.30.1.1", ("10.0.1.1", "10.0.1.2", "10.0.1.3"), 80, 80,
        internal_local=True, local=("10.0.1.1",),
    )  # fmt: skip
    text = iptables.full_sync(
        [svc], nfacct=False, random_fully=False, cluster_cidr=POD_CIDR, mark=MARK
    )
    assert _lines(text) == _lines(IPTABLES_ITP_LOCAL)
    _order_holds(text.splitlines(), IPTABLES_ITP_LOCAL)


def test_iptables_external_local_with_affinity_matches_kube_proxy() -> None:
    svc = ServicePort(
        "ns1", "svc1", "", "172.30.1.1", ("10.0.1.1", "10.0.1.2", "10.0.1.5"), 80, 80,
        node_port=30001, affinity_seconds=10800, external_local=True,
        local=("10.0.1.1", "10.0.1.2"),
    )  # fmt: skip
    text = iptables.full_sync([svc], random_fully=False, cluster_cidr=POD_CIDR, mark=MARK)
    assert _service_chain_lines(text) == _lines(IPTABLES_ETP_LOCAL_AFFINITY_CHAINS)
    _order_holds(text.splitlines(), IPTABLES_ETP_LOCAL_AFFINITY_CHAINS)
    ext = naming.ext_chain(svc)
    assert [ln for ln in _lines(text) if "KUBE-NODEPORTS -m" in ln and f"-j {ext}" in ln]


# kube-proxy: TestOverallNFTablesRules svc5 (its LoadBalancer IP element, firewall chain and
# firewall-ips element left out).
NFT_SVC5 = """\
add set ip kube-proxy affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { type ipv4_addr ; \
flags dynamic,timeout ; timeout 10800s ; }
add chain ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip daddr 172.30.0.45 ip saddr != \
10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr \
@affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto \
endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 numgen random mod 1 vmap { 0 : goto \
endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 }
add chain ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 goto service-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 \
jump mark-for-masquerade
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 update \
@affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 meta l4proto tcp \
dnat to 10.180.0.3:80
add element ip kube-proxy cluster-ips { 172.30.0.45 }
add element ip kube-proxy service-ips { 172.30.0.45 . tcp . 80 : goto \
service-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3002 : goto \
external-HVFWP5L3-ns5/svc5/tcp/p80 }
"""

# kube-proxy: TestOverallNFTablesRules svc2 (eTP Local; its external IP and LoadBalancer IP
# elements left out). Upstream's endpoint is not local, so its NodePort gets a
# no-endpoint-nodeports drop; with the endpoint local (here) that element goes and the
# external chain ends in `goto local-...`, the local chain holding the local endpoints'
# vmap (pkg/proxy/nftables/proxier.go: "Anything else falls thru to the appropriate policy
# chain", writeServiceToEndpointRules(localPolicyChain, localEndpoints)).
NFT_SVC2_UPSTREAM = """\
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 ip daddr 172.30.0.42 ip saddr != \
10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto \
endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto \
service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local jump \
mark-for-masquerade comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto \
service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add chain ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 ip saddr 10.180.0.2 \
jump mark-for-masquerade
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 meta l4proto tcp \
dnat to 10.180.0.2:80
add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto \
service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto \
external-42NFTM6N-ns2/svc2/tcp/p80 }
"""
NFT_SVC2_LOCAL = """\
add chain ip kube-proxy local-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 goto local-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy local-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto \
endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
"""


def _nft_text(services: list[ServicePort]) -> str:
    return nftables.full_sync(
        services,
        node_ip="192.168.0.2",
        service_cidr="172.30.0.0/16",
        cluster_cidr=POD_CIDR,
        mark=MARK,
    )


def _nft(services: list[ServicePort]) -> list[str]:
    return NftState().apply(_nft_text(services)).lines()


def _expected(*blocks: str) -> list[str]:
    return sorted(line for block in blocks for line in block.splitlines() if line)


def test_nftables_affinity_matches_kube_proxy_overall_svc5() -> None:
    assert _nft([SVC1, SVC3, SVC5]) == _expected(NFT_OVERALL, NFT_SVC5)
    _order_holds(_nft_text([SVC5]).splitlines(), NFT_SVC5, nft=True)


def test_nftables_external_local_matches_kube_proxy_overall_svc2() -> None:
    svc2 = ServicePort(
        "ns2", "svc2", "p80", "172.30.0.42", ("10.180.0.2",), 80, 80, node_port=3001,
        external_local=True, local=("10.180.0.2",),
    )  # fmt: skip
    assert naming.nft_local_chain(svc2) == "local-42NFTM6N-ns2/svc2/tcp/p80"
    assert _nft([SVC1, SVC3, svc2]) == _expected(NFT_OVERALL, NFT_SVC2_UPSTREAM, NFT_SVC2_LOCAL)
    # The external chain's rules in kube-proxy's order, the local chain's goto last.
    _order_holds(_nft_text([svc2]).splitlines(), NFT_SVC2_UPSTREAM + NFT_SVC2_LOCAL, nft=True)


def test_nftables_internal_local_goes_to_the_local_chain_only() -> None:
    svc = ServicePort(
        "ns1", "svc1", "p80", "172.30.1.1", ("10.0.1.1", "10.0.1.2", "10.0.1.3"), 80, 80,
        internal_local=True, local=("10.0.1.1", "10.0.1.3"),
    )  # fmt: skip
    state = NftState().apply(nftables.full_sync([svc], node_ip="192.168.0.2"))
    local, service = naming.nft_local_chain(svc), naming.nft_service_chain(svc)
    assert state.elements["service-ips"] == [
        f"add element ip kube-proxy service-ips {{ 172.30.1.1 . tcp . 80 : goto {local} }}"
    ]
    assert ("chain", service) not in state.objects  # no Cluster chain: nothing uses it
    ep1, ep3 = (naming.nft_endpoint_chain(svc, ip) for ip in ("10.0.1.1", "10.0.1.3"))
    assert state.rules[local] == [
        f"add rule ip kube-proxy {local} ip daddr 172.30.1.1 ip saddr != 10.128.0.0/11"
        " jump mark-for-masquerade",
        f"add rule ip kube-proxy {local} numgen random mod 2 vmap {{ 0 : goto {ep1} , 1 : goto"
        f" {ep3} }}",
    ]
    endpoint_chains = {name for kind, name in state.objects if name.startswith("endpoint-")}
    assert endpoint_chains == {ep1, ep3}


# ---- the model's limits ---------------------------------------------------------------------


def test_a_local_policy_needs_local_endpoints_and_external_needs_a_node_port() -> None:
    with pytest.raises(ValueError, match="without local endpoints"):
        ServicePort("ns", "s", "p", "10.96.0.1", ("10.0.0.1",), internal_local=True)
    with pytest.raises(ValueError, match="needs a NodePort"):
        ServicePort(
            "ns", "s", "p", "10.96.0.1", ("10.0.0.1",), external_local=True, local=("10.0.0.1",)
        )
    # Dropping the only local endpoint would need kube-proxy's DROP rules: refused.
    svc = ServicePort(
        "ns",
        "s",
        "p",
        "10.96.0.1",
        ("10.0.0.1", "10.0.0.2"),
        internal_local=True,
        local=("10.0.0.2",),
    )
    with pytest.raises(ValueError):
        svc.with_ready(1)


def test_large_cluster_mode_drops_the_affinity_rules_comments() -> None:
    services = bench_services(400, 3, mix=(Mix.AFFINITY,))  # 1200 endpoints > 1000
    svc = ServicePort.of(services[0])
    assert svc.affinity_seconds == 10800
    text = iptables.full_sync(services)
    sep = naming.sep_chain(svc, svc.endpoints[0])
    rules = [ln for ln in text.splitlines() if ln.startswith(f"-A {naming.svc_chain(svc)} ")]
    check = f"-m recent --name {sep} --rcheck --seconds 10800 --reap -j {sep}"
    assert rules[1] == f"-A {naming.svc_chain(svc)} {check}"
    assert f"-A {sep} -m recent --name {sep} --set -m tcp -p tcp -j DNAT" in text


# ---- the bench's mix ------------------------------------------------------------------------


def test_default_services_are_unchanged_by_the_mix_machinery() -> None:
    for svc in bench_services(9, 3):
        assert not (svc.affinity or svc.internal_local or svc.external_local)
        spec = service_object(svc)["spec"]
        # ipFamilies [IPv4] / SingleStack: what the API server fills in for them anyway.
        basics = {"type", "clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy", "ports"}
        assert set(spec) == basics | ({"externalTrafficPolicy"} if svc.node_port else set())
        assert {ep["nodeName"] for ep in slice_object(svc)["endpoints"]} == {BACKEND_NODE}
    # And so are the rulesets: the default bench's figures stay comparable.
    plain = bench_services(9, 3)
    assert iptables.full_sync(plain) == iptables.full_sync(bench_services(9, 3, mix=()))


def test_mix_assigns_every_fourth_service_and_spares_the_nodeport_target() -> None:
    services = bench_services(13, 3, mix=parse_mix("affinity,local"))
    assert [s.index for s in services if s.affinity] == [0, 4, 8]
    assert [s.index for s in services if s.internal_local] == [1, 5, 9]
    assert [(s.index, s.node_port) for s in services if s.external_local] == [
        (2, NODE_PORT + 1),
        (6, NODE_PORT + 2),
        (10, NODE_PORT + 3),
    ]
    last = services[-1]
    assert (last.node_port, last.affinity, last.local_policy) == (NODE_PORT, False, False)
    only_affinity = bench_services(13, 3, mix=(Mix.AFFINITY,))
    assert not any(s.local_policy for s in only_affinity)
    node_ports = [s.node_port for s in bench_services(12_000, 2, mix=(Mix.LOCAL,)) if s.node_port]
    assert max(node_ports) == 32767 and len(node_ports) == len(set(node_ports)) == 2688


def test_mix_objects_say_what_the_rules_do() -> None:
    by_index = {s.index: s for s in bench_services(5, 3, mix=(Mix.AFFINITY, Mix.LOCAL))}
    affinity, itp, etp = (service_object(by_index[i])["spec"] for i in (0, 1, 2))
    assert affinity["sessionAffinity"] == "ClientIP"
    assert affinity["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": 10800}}
    assert itp["internalTrafficPolicy"] == "Local" and itp["type"] == "ClusterIP"
    assert etp["type"] == "NodePort" and etp["externalTrafficPolicy"] == "Local"
    assert etp["ports"][0]["nodePort"] == NODE_PORT + 1
    nodes = [ep["nodeName"] for ep in slice_object(by_index[1])["endpoints"]]
    assert nodes == [AGENT_NODE, AGENT_NODE, BACKEND_NODE]
    assert len(list(objects(list(by_index.values())))) == 10
    with pytest.raises(ConfigError, match="unknown kind 'topology'"):
        parse_mix("affinity,topology")


# ---- partial syncs of mixed services -----------------------------------------------------------


@pytest.mark.parametrize("index", range(4))  # affinity, iTP Local, eTP Local, plain
def test_iptables_partial_on_full_equals_full_with_the_mix(index: int) -> None:
    before = bench_services(9, 4, mix=(Mix.AFFINITY, Mix.LOCAL))
    after = [ServicePort.of(s).with_ready(2) if s.index == index else s for s in before]
    patched: dict[str, dict[str, list[str]]] = defaultdict(dict)
    fresh: dict[str, dict[str, list[str]]] = defaultdict(dict)
    _iptables_apply(patched, iptables.full_sync(before))
    _iptables_apply(patched, iptables.partial_sync(before, index, 2))
    _iptables_apply(fresh, iptables.full_sync(after))
    assert patched == fresh


@pytest.mark.parametrize("index", range(4))
def test_nftables_partial_on_full_equals_full_with_the_mix(index: int) -> None:
    before = bench_services(9, 4, mix=(Mix.AFFINITY, Mix.LOCAL))
    after = [ServicePort.of(s).with_ready(2) if s.index == index else s for s in before]
    partial = nftables.partial_sync(before, index, 2)
    patched = NftState().apply(nftables.full_sync(before, node_ip="192.168.50.1"))
    patched.apply(partial)
    patched.apply(nftables.stale_cleanup(before, index, 2))
    fresh = NftState().apply(nftables.full_sync(after, node_ip="192.168.50.1"))
    assert patched.lines() == fresh.lines()
    changed = ServicePort.of(before[index])
    stale_sets = [
        f"delete set ip kube-proxy {naming.nft_affinity_set(changed, ip)}"
        for ip in changed.endpoints[2:]
    ]
    assert [ln for ln in partial.splitlines() if ln.startswith("delete set")] == (
        stale_sets if changed.affinity_seconds else []
    )


def test_left_out_no_longer_lists_what_is_modelled() -> None:
    text = " ".join(kubeproxy.LEFT_OUT)
    assert "session affinity" not in text and "KUBE-SVL" not in text
    assert "healthCheckNodePort" in text and "topology" in text


def test_the_mix_flag_reaches_the_settings_and_the_report() -> None:
    assert command.compare_settings(parse("bench", "--quick")).mix == ()
    settings = command.compare_settings(parse("bench", "--quick", "--mix", "local,affinity"))
    assert settings.mix == (Mix.LOCAL, Mix.AFFINITY)
    assert codec.decode(CompareSettings, codec.encode(settings)) == settings
    assert codec.encode(settings)["mix"] == ["local", "affinity"]
    with pytest.raises(ConfigError):
        command.compare_settings(parse("bench", "--mix", "sctp"))
