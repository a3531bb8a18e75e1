"""kube-proxy's IPv6 rulesets (family=Family.IPV6) from lab.bench.kubeproxy, checked
without a kernel, two ways:

- against kube-proxy's own IPv6 expectations. iptables: TestEnableLocalhostNodePortsIPv6
  (pkg/proxy/iptables/proxier_test.go; its fake proxier has a no-op local detector, mark
  0x4000, no --random-fully and, in that version, no nfacct counters). nftables: the IPv6
  "basic tests" ruleset of TestNodePorts (pkg/proxy/nftables/proxier_test.go; pod CIDR
  fd00:10::/64, service CIDR fd00:10:96::/112, node 2001:db8::1) as sigs.k8s.io/knftables
  quotes it in fake_test.go (TestFakeParseDump); the lines kube-proxy has changed since
  (the v1.31 base chains, the masquerade rule's form) and knftables' own test comments are
  named and replaced (NFT6_SINCE);
- rule by rule against the IPv4 output for the same services (where no upstream test has
  an IPv6 expectation: partial syncs, affinity and Local policies at bench scale): the IPv6
  proxier writes the same rules in the same order with the IPv6 addresses, except where
  proxier.go branches on the family (_iptables_v6, _nft_v6).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import pytest

from lab.bench.kubeproxy import iptables, naming, nftables
from lab.bench.kubeproxy.naming import ServicePort
from lab.bench.scenario import PLANS, BenchService, Family, Mix, bench_services
from tests.unit.lab.bench.test_kubeproxy import MARK, NftState, _lines

V6 = Family.IPV6

# ---- against kube-proxy's expectations ----------------------------------------------------

# TestEnableLocalhostNodePortsIPv6: a NodePort service with externalTrafficPolicy Local,
# one remote and one local endpoint. No KUBE-FIREWALL chain or 127.0.0.0/8 rule although
# the test asks for localhostNodePorts (IPv4-only), and "! -d ::1/128" on the last rule.
IPTABLES6_LOCALHOST = """\
*filter
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark \
0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack \
--ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
*nat
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXT-XPGD46QRK7WJZT7O - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-LIGRYQQLSZN4UWQ5 - [0:0]
:KUBE-SEP-XJJ5QXWGJG344QDZ - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SVL-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m tcp -p tcp --dport 30001 \
-j KUBE-EXT-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp \
-d fd00:ab34::20 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the \
last rule in this chain" -m addrtype --dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS
-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "masquerade LOCAL traffic for ns1/svc1:p80 \
external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "route LOCAL traffic for ns1/svc1:p80 \
external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVL-XPGD46QRK7WJZT7O
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
-A KUBE-SEP-LIGRYQQLSZN4UWQ5 -m comment --comment ns1/svc1:p80 -s ff06::c1 -j KUBE-MARK-MASQ
-A KUBE-SEP-LIGRYQQLSZN4UWQ5 -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT \
--to-destination [ff06::c1]:80
-A KUBE-SEP-XJJ5QXWGJG344QDZ -m comment --comment ns1/svc1:p80 -s ff06::c2 -j KUBE-MARK-MASQ
-A KUBE-SEP-XJJ5QXWGJG344QDZ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT \
--to-destination [ff06::c2]:80
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> [ff06::c1]:80" -m statistic \
--mode random --probability 0.5000000000 -j KUBE-SEP-LIGRYQQLSZN4UWQ5
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> [ff06::c2]:80" \
-j KUBE-SEP-XJJ5QXWGJG344QDZ
-A KUBE-SVL-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> [ff06::c2]:80" \
-j KUBE-SEP-XJJ5QXWGJG344QDZ
COMMIT
"""


def test_iptables6_matches_kube_proxy_enable_localhost_nodeports_ipv6() -> None:
    svc = ServicePort(
        "ns1",
        "svc1",
        "p80",
        "fd00:ab34::20",
        ("ff06::c1", "ff06::c2"),
        80,
        80,
        node_port=30001,
        external_local=True,
        local=("ff06::c2",),
    )
    text = iptables.full_sync(
        [svc], family=V6, nfacct=False, detect_local=False, random_fully=False, mark=MARK
    )
    assert _lines(text) == _lines(IPTABLES6_LOCALHOST)


# TestNodePorts' IPv6 ruleset: ns1/svc1 (fd00:172:30::41:80, NodePort 3001, Cluster policy)
# with endpoints fd00:10:180::1 and fd00:10:180::2:1, as knftables' fake_test.go has it.
NFT6_NODEPORTS = """\
add table ip6 kube-proxy { comment "rules for kube-proxy" ; }
add chain ip6 kube-proxy cluster-ips-check
add chain ip6 kube-proxy endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80
add chain ip6 kube-proxy endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80
add chain ip6 kube-proxy external-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip6 kube-proxy filter-forward { type filter hook forward priority -110 ; }
add chain ip6 kube-proxy filter-input { type filter hook input priority -110 ; }
add chain ip6 kube-proxy filter-output { type filter hook output priority -110 ; }
add chain ip6 kube-proxy filter-output-post-dnat { type filter hook output priority -90 ; }
add chain ip6 kube-proxy filter-prerouting { type filter hook prerouting priority -110 ; }
add chain ip6 kube-proxy firewall-check
add chain ip6 kube-proxy mark-for-masquerade
add chain ip6 kube-proxy masquerading
add chain ip6 kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip6 kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip6 kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip6 kube-proxy nodeport-endpoints-check
add chain ip6 kube-proxy reject-chain { comment \
"helper for @no-endpoint-services / @no-endpoint-nodeports" ; }
add chain ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip6 kube-proxy service-endpoints-check
add chain ip6 kube-proxy services
add set ip6 kube-proxy cluster-ips { type ipv6_addr ; comment "Active ClusterIPs" ; }
add set ip6 kube-proxy nodeport-ips { type ipv6_addr ; comment \
"IPs that accept NodePort traffic" ; }
add map ip6 kube-proxy firewall-ips { type ipv6_addr . inet_proto . inet_service : verdict ; \
comment "destinations that are subject to LoadBalancerSourceRanges" ; }
add map ip6 kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; \
comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }
add map ip6 kube-proxy no-endpoint-services { type ipv6_addr . inet_proto . inet_service : \
verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
add map ip6 kube-proxy service-ips { type ipv6_addr . inet_proto . inet_service : verdict ; \
comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map ip6 kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; \
comment "NodePort traffic" ; }
add rule ip6 kube-proxy cluster-ips-check ip6 daddr @cluster-ips reject comment \
"Reject traffic to invalid ports of ClusterIPs"
add rule ip6 kube-proxy cluster-ips-check ip6 daddr { fd00:10:96::/112 } drop comment \
"Drop traffic to unallocated ClusterIPs"
add rule ip6 kube-proxy endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 ip6 saddr \
fd00:10:180::2:1 jump mark-for-masquerade
add rule ip6 kube-proxy endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 meta l4proto \
tcp dnat to [fd00:10:180::2:1]:80
add rule ip6 kube-proxy endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 ip6 saddr \
fd00:10:180::1 jump mark-for-masquerade
add rule ip6 kube-proxy endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 meta l4proto tcp \
dnat to [fd00:10:180::1]:80
add rule ip6 kube-proxy external-ULMVA6XW-ns1/svc1/tcp/p80 jump mark-for-masquerade
add rule ip6 kube-proxy external-ULMVA6XW-ns1/svc1/tcp/p80 goto service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip6 kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip6 kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip6 kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip6 kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip6 kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip6 kube-proxy filter-output ct state new jump firewall-check
add rule ip6 kube-proxy filter-output-post-dnat ct state new jump cluster-ips-check
add rule ip6 kube-proxy filter-prerouting ct state new jump firewall-check
add rule ip6 kube-proxy firewall-check ip6 daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip6 kube-proxy mark-for-masquerade mark set mark or 0x4000
add rule ip6 kube-proxy masquerading mark and 0x4000 == 0 return
add rule ip6 kube-proxy masquerading mark set mark xor 0x4000
add rule ip6 kube-proxy masquerading masquerade fully-random
add rule ip6 kube-proxy nat-output jump services
add rule ip6 kube-proxy nat-postrouting jump masquerading
add rule ip6 kube-proxy nat-prerouting jump services
add rule ip6 kube-proxy nodeport-endpoints-check ip6 daddr @nodeport-ips meta l4proto . th dport \
vmap @no-endpoint-nodeports
add rule ip6 kube-proxy reject-chain reject
add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip6 daddr fd00:172:30::41 tcp dport 80 \
ip6 saddr != fd00:10::/64 jump mark-for-masquerade
add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 2 vmap { 0 : goto \
endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 , 1 : goto \
endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 }
add rule ip6 kube-proxy service-endpoints-check ip6 daddr . meta l4proto . th dport vmap \
@no-endpoint-services
add rule ip6 kube-proxy services ip6 daddr . meta l4proto . th dport vmap @service-ips
add rule ip6 kube-proxy services ip6 daddr @nodeport-ips meta l4proto . th dport vmap \
@service-nodeports
add element ip6 kube-proxy cluster-ips { fd00:172:30::41 }
add element ip6 kube-proxy nodeport-ips { 2001:db8::1 comment "test comment" }
add element ip6 kube-proxy nodeport-ips { 2001:db8:1::2 }
add element ip6 kube-proxy service-ips { fd00:172:30::41 . tcp . 80 : goto \
service-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip6 kube-proxy service-nodeports { tcp . 3001 comment "test comment" : goto \
external-ULMVA6XW-ns1/svc1/tcp/p80 }
"""

T6 = "add chain ip6 kube-proxy"
R6 = "add rule ip6 kube-proxy"
SVC1_CHAIN = "service-ULMVA6XW-ns1/svc1/tcp/p80"
# What changed since that ruleset, and why; None: the line is gone.
NFT6_SINCE: dict[str, str | None] = {
    # v1.31's base chains (TestOverallNFTablesRules' baseRules): filtering of pre-DNAT
    # addresses moved to *-pre-dnat chains at -110; input, forward, output filter at 0.
    f"{T6} filter-forward {{ type filter hook forward priority -110 ; }}": (
        f"{T6} filter-forward {{ type filter hook forward priority 0 ; }}"
    ),
    f"{T6} filter-input {{ type filter hook input priority -110 ; }}": (
        f"{T6} filter-input {{ type filter hook input priority 0 ; }}"
    ),
    f"{T6} filter-output {{ type filter hook output priority -110 ; }}": (
        f"{T6} filter-output {{ type filter hook output priority 0 ; }}"
    ),
    f"{T6} filter-output-post-dnat {{ type filter hook output priority -90 ; }}": (
        f"{T6} filter-output-pre-dnat {{ type filter hook output priority -110 ; }}"
    ),
    f"{T6} filter-prerouting {{ type filter hook prerouting priority -110 ; }}": (
        f"{T6} filter-prerouting-pre-dnat {{ type filter hook prerouting priority -110 ; }}"
    ),
    f"{R6} filter-output ct state new jump firewall-check": (
        f"{R6} filter-output-pre-dnat ct state new jump firewall-check"
    ),
    f"{R6} filter-output-post-dnat ct state new jump cluster-ips-check": (
        f"{R6} filter-output ct state new jump cluster-ips-check"
    ),
    f"{R6} filter-prerouting ct state new jump firewall-check": (
        f"{R6} filter-prerouting-pre-dnat ct state new jump firewall-check"
    ),
    # The masquerade rule without the port match (TestOverallNFTablesRules' form).
    f"{R6} {SVC1_CHAIN} ip6 daddr fd00:172:30::41 tcp dport 80 ip6 saddr != fd00:10::/64 jump"
    " mark-for-masquerade": (
        f"{R6} {SVC1_CHAIN} ip6 daddr fd00:172:30::41 ip6 saddr != fd00:10::/64 jump"
        " mark-for-masquerade"
    ),
    # knftables' test adds comments to two elements; kube-proxy writes none there.
    'add element ip6 kube-proxy nodeport-ips { 2001:db8::1 comment "test comment" }': (
        "add element ip6 kube-proxy nodeport-ips { 2001:db8::1 }"
    ),
    'add element ip6 kube-proxy service-nodeports { tcp . 3001 comment "test comment" : goto'
    " external-ULMVA6XW-ns1/svc1/tcp/p80 }": (
        "add element ip6 kube-proxy service-nodeports { tcp . 3001 : goto"
        " external-ULMVA6XW-ns1/svc1/tcp/p80 }"
    ),
    # That fake proxier's --nodeport-addresses matched a second address; "primary" one.
    "add element ip6 kube-proxy nodeport-ips { 2001:db8:1::2 }": None,
}


def test_nftables6_matches_kube_proxy_nodeports_ipv6() -> None:
    endpoints = ("fd00:10:180::1", "fd00:10:180::2:1")
    svc = ServicePort("ns1", "svc1", "p80", "fd00:172:30::41", endpoints, 80, 80, node_port=3001)
    text = nftables.full_sync(
        [svc],
        family=V6,
        node_ip="2001:db8::1",
        service_cidr="fd00:10:96::/112",
        cluster_cidr="fd00:10::/64",
        mark=MARK,
    )
    upstream = [line for line in NFT6_NODEPORTS.splitlines() if line]
    assert set(NFT6_SINCE) <= set(upstream)  # every replaced line is upstream's
    expected = [NFT6_SINCE.get(line, line) for line in upstream]
    assert NftState().apply(text).lines() == sorted(line for line in expected if line)


# ---- rule by rule against IPv4 --------------------------------------------------------------

NODE4, NODE6 = "10.240.0.1", "fd00:240::1"


def _to_v6(text: str, v4: Sequence[BenchService], v6: Sequence[BenchService]) -> str:
    """The IPv4 text with every address and every name derived from one (SEP chains, nft
    endpoint chains and affinity sets) replaced by its IPv6 counterpart."""
    four, six = PLANS[Family.IPV4], PLANS[V6]
    names: dict[str, str] = {
        four.cluster_cidr: six.cluster_cidr,
        str(four.service_cidr): str(six.service_cidr),
        NODE4: NODE6,
    }
    derived: tuple[Callable[[ServicePort, str], str], ...] = (
        naming.sep_chain,
        naming.nft_endpoint_chain,
        naming.nft_affinity_set,
        ServicePort.endpoint_string,
    )
    for a, b in zip(map(ServicePort.of, v4), map(ServicePort.of, v6), strict=True):
        names[a.cluster_ip] = b.cluster_ip
        for ip4, ip6 in zip(a.endpoints, b.endpoints, strict=True):
            names[ip4] = ip6
            names.update((name(a, ip4), name(b, ip6)) for name in derived)
    alternatives = "|".join(re.escape(k) for k in sorted(names, key=len, reverse=True))
    return re.sub(rf"(?<![\w.])(?:{alternatives})(?![\w.])", lambda m: names[m[0]], text)


def _iptables_v6(text4: str) -> list[str]:
    """proxier.go's IPv6 branches: localhost NodePorts are IPv4-only (no KUBE-FIREWALL
    chain and rule, no 127.0.0.0/8 NodePort rule); NodePorts on ::1 are excluded."""
    lines = []
    for line in text4.splitlines():
        if line == ":KUBE-FIREWALL - [0:0]" or line.startswith("-A KUBE-FIREWALL "):
            continue
        if " -d 127.0.0.0/8 --dport " in line:
            continue
        lines.append(line.replace("--dst-type LOCAL -j", "--dst-type LOCAL ! -d ::1/128 -j"))
    return lines


def _nft_v6(text4: str) -> list[str]:
    """setupNFTables' and syncProxyRules' ipX, ipvX_addr and noLocalhost."""
    text = re.sub(r"\bip (kube-proxy|daddr|saddr)\b", r"ip6 \1", text4)
    text = text.replace("ipv4_addr", "ipv6_addr").replace(
        "ip6 daddr != 127.0.0.0/8", "ip6 daddr != ::1"
    )
    return text.splitlines()


MIXES = [(), (Mix.AFFINITY, Mix.LOCAL)]


@pytest.mark.parametrize("mix", MIXES)
def test_iptables6_is_ipv4s_rules_with_ipv6_addresses(mix: tuple[Mix, ...]) -> None:
    v4 = bench_services(12, 3, mix=mix)
    v6 = bench_services(12, 3, mix=mix, family=V6)
    full4 = _to_v6(iptables.full_sync(v4), v4, v6)
    assert iptables.full_sync(v6, family=V6).splitlines() == _iptables_v6(full4)
    for index in (0, 1, 2, 11):  # affinity, internal Local, external Local, the NodePort
        partial4 = _to_v6(iptables.partial_sync(v4, index, 2), v4, v6)
        assert iptables.partial_sync(v6, index, 2, family=V6).splitlines() == _iptables_v6(partial4)
    assert "[fd00:128::1]:8080" in iptables.full_sync(v6, family=V6)


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("node_ip", [(NODE4, NODE6), (None, None)])
def test_nftables6_is_ipv4s_ruleset_with_ipv6_addresses(
    mix: tuple[Mix, ...], node_ip: tuple[str | None, str | None]
) -> None:
    v4 = bench_services(12, 3, mix=mix)
    v6 = bench_services(12, 3, mix=mix, family=V6)
    full4 = _to_v6(nftables.full_sync(v4, node_ip=node_ip[0]), v4, v6)
    assert nftables.full_sync(v6, family=V6, node_ip=node_ip[1]).splitlines() == _nft_v6(full4)
    for index in (0, 1, 2, 11):
        for make in (nftables.partial_sync, nftables.stale_cleanup):
            four = _to_v6(make(v4, index, 2), v4, v6)
            assert make(v6, index, 2, family=V6).splitlines() == _nft_v6(four)


def test_endpoint_chain_names_have_no_colons() -> None:
    svc = ServicePort.of(bench_services(1, 2, family=V6)[0])
    chain = naming.nft_endpoint_chain(svc, svc.endpoints[1])
    assert chain.endswith("-bench/svc-000000/tcp/http__fd00.128..2.1/8080")
    assert naming.sep_chain(svc, svc.endpoints[0]) != naming.sep_chain(
        ServicePort.of(bench_services(1, 2)[0]), "10.128.0.1"
    )


def test_one_family_per_ruleset() -> None:
    v4, v6 = bench_services(2, 2), bench_services(2, 2, family=V6)
    for make in (iptables.full_sync, nftables.full_sync):
        with pytest.raises(ValueError, match="is not ipv6"):
            make(v4, family=V6)
        with pytest.raises(ValueError, match="is not ipv4"):
            make(v6)
    assert iptables.tool("iptables-nft", V6) == "ip6tables-nft"
    assert iptables.tool("iptables-legacy", Family.IPV4) == "iptables-legacy"
    assert nftables.SYNTAX[V6].table == "ip6 kube-proxy"
