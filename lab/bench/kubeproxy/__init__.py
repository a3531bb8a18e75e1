"""What kube-proxy's iptables and nftables proxiers write, for the bench's services.

naming.py: what the two proxiers share (the service port model, the hashes behind chain
names, the masquerade mark); iptables.py: the iptables-restore input (full and partial
sync) and the commands run before it; nftables.py: the nft transactions.

Pure generators (no kernel access; the setup commands come back as argv lists): given the
services of lab.bench.scenario they return the exact input kube-proxy hands to
`iptables-restore -w 5 -W 100000 --noflush --counters` (iptables mode, for both the legacy
and the nf_tables backend of the iptables tool) or to `nft -f -` (nftables mode), for a
full sync and for the partial sync after one service's endpoints dropped to `ready`.
Services may have ClientIP session affinity (iptables: `-m recent --rcheck` per endpoint in
KUBE-SVC/SVL-*, `-m recent --set` in KUBE-SEP-*; nftables: one timeout set per endpoint,
`ip saddr @affinity-...` checks and `update @affinity-... { ip saddr }`), and
internalTrafficPolicy / externalTrafficPolicy Local (KUBE-SVL-* / local-* chains over the
node's endpoints, KUBE-EXT-* / external-* chains short-circuiting pod and node traffic to
all endpoints), endpoints split as pkg/proxy/topology.go's CategorizeEndpoints does.
Either family (family=Family.IPV6: the IPv6 proxier's ip6tables-restore input, table ip6
kube-proxy), one per call: kube-proxy runs one single-stack proxier per family.

Sources followed (kubernetes/kubernetes, read through the code index; commit ids were not
visible, so the versions are identified by their content):

- iptables: pkg/proxy/iptables/proxier.go of the v1.31-v1.33 line (NewDualStackProxier
  with nfacct counters, largeClusterEndpointsThreshold = 1000, partial syncs) and the
  expected rulesets of pkg/proxy/iptables/proxier_test.go (TestOverallIPTablesRules,
  TestSyncProxyRulesRepeated, TestInternalTrafficPolicyE2E,
  TestTerminatingEndpointsTrafficPolicyLocal), which the unit tests compare against line by
  line; for IPv6, TestEnableLocalhostNodePortsIPv6 and the per-family branches of
  syncProxyRules (localhost NodePorts IPv4-only, "! -d ::1/128").
- nftables: the transaction structure of pkg/proxy/nftables/proxier.go (v1.31: setupNFTables,
  ensureChain = add + flush, nftElementStorage, stale chains flushed now and deleted
  by a later sync) and the ruleset of the newer pkg/proxy/nftables/proxier_test.go
  (TestOverallNFTablesRules baseRules: filter-prerouting-pre-dnat / filter-output-pre-dnat
  at priority -110, filter-input/forward/output at 0, `ip daddr <vip> ip saddr != <pod
  cidr>` masquerade rule, per-endpoint hairpin rule, svc2's and svc5's Local policy and
  affinity rules, affinity sets without a comment). kube-proxy v1.36 replaced the
  per-endpoint hairpin rule with a hairpin-connections set; that is not modelled.
- nftables IPv6: setupNFTables' and syncProxyRules' ipX / ipvX_addr / noLocalhost and
  servicePortEndpointChainNameBase (":" -> "." in endpoint chain names), checked against
  the IPv6 ruleset of TestNodePorts as knftables' fake_test.go quotes it.
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

# What the generators do not model (the README lists these too).
LEFT_OUT: tuple[str, ...] = (
    "LoadBalancer IPs, externalIPs and loadBalancerSourceRanges (KUBE-FW-*, "
    "KUBE-PROXY-FIREWALL rules, firewall-ips elements)",
    "healthCheckNodePort (only LoadBalancer services get one), topology hints, "
    "terminating-endpoint fallback",
    "services without ready endpoints, and Local policies without local ones (REJECT and "
    "DROP rules, no-endpoint-* elements): ready >= 1, local >= 1",
    "several ports per service, UDP/SCTP",
    "dual-stack: each run is one family (--family ipv4|ipv6), as one of kube-proxy's two "
    "single-stack proxiers; both at once (its MetaProxier, a dual-stack Service) is not "
    "measured",
    "kube-proxy ranges over a Go map, so its service order is random; here it is by index",
    "work outside the restore input / nft transaction: the iptables-save (or nft list) "
    "before each sync, the -C checks before the jump inserts, the canary monitor, sysctls "
    "(route_localnet, conntrack), conntrack cleanup, healthz and metrics, informers",
    "masqueradeAll and --nodeport-addresses other than the defaults",
    "kube-proxy v1.36's hairpin-connections set (the per-endpoint hairpin rule is kept)",
)
