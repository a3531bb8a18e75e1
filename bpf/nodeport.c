/* NodePort, LoadBalancer and external-IP load balancing on the node's interfaces (tc),
 * for IPv4 and IPv6 (one program each way; the Ethernet type picks the family's path).
 *
 * ingress (ebpflb_np_in): a reply to a SNATed flow is translated back to the client's view;
 *   a packet to a frontend of one of those types is DNATed to a backend picked from the
 *   service's Maglev table by a hash of its 5-tuple (remembered in conntrack), and SNATed
 *   to the node's address when the backend runs on another node and externalTrafficPolicy
 *   is Cluster (kube-proxy's KUBE-MARK-MASQ); the decisions are lib/nodeport.h's. Packets whose source became a node address are forwarded by the
 *   program (lib/fib.h); DNAT-only packets go on to the stack.
 * egress (ebpflb_np_out): a reply from a local backend (no SNAT) gets the frontend as its
 *   source again.
 *
 * Return codes: TC_ACT_OK lets the (possibly rewritten) packet continue; TC_ACT_SHOT drops
 * it (source outside loadBalancerSourceRanges, no usable backend, no SNAT port, no route);
 * a packet to a service with no endpoint at all is answered instead (TCP RST, ICMP or
 * ICMPv6 port unreachable: lib/reject.h);
 * TC_ACT_REDIRECT (from bpf_redirect*) sends it out of the chosen interface.
 */
#include <uapi/linux/bpf.h>

#include "lib/fib.h"
#include "lib/nodeport.h"
#include "lib/reject.h"

static __always_inline int np4_in(struct __sk_buff *skb, void *data, void *data_end)
{
	struct xlate4 out = {};
	struct pkt4 pkt = {};

	if (pkt4_parse(data, data_end, skb->len, &pkt) != PKT_OK)
		return TC_ACT_OK;
	switch (np4_ingress(&pkt, skb->ifindex, &out)) {
	case NP_DROP:
		return TC_ACT_SHOT;
	case NP_REJECT:
		stat_inc(STAT_NP_NO_BACKEND);
		svc_stats_refused(out.svc_id);
		if (pkt.flow.proto == IPPROTO_TCP)
			return tc_reject4_tcp(skb, &pkt);
		return tc_reject4_udp(skb, &pkt);
	case NP_XLATE:
		if (pkt4_xlate_skb(skb, &pkt, &out) < 0)
			return TC_ACT_SHOT;
		svc_stats_np_packet(out.svc_id, pkt.len);
		/* The source is now a node address (SNAT, or the frontend of a reply). */
		if (out.saddr != pkt.flow.saddr)
			return tc_forward4(skb, &pkt, out.saddr, out.daddr);
		return TC_ACT_OK;
	default:
		return TC_ACT_OK;
	}
}

static __always_inline int np6_in(struct __sk_buff *skb, void *data, void *data_end)
{
	struct xlate6 out = {};
	struct pkt6 pkt = {};
	enum pkt_parse parsed = pkt6_parse(data, data_end, skb->len, &pkt);

	if (parsed == PKT_EXT_HEADERS)
		stat_inc(STAT_NP6_EXT_HEADER);
	if (parsed != PKT_OK)
		return TC_ACT_OK;
	switch (np6_ingress(&pkt, skb->ifindex, &out)) {
	case NP_DROP:
		return TC_ACT_SHOT;
	case NP_REJECT:
		stat_inc(STAT_NP_NO_BACKEND);
		svc_stats_refused(out.svc_id);
		return tc_reject6(skb, &pkt);
	case NP_XLATE:
		if (pkt6_xlate_skb(skb, &pkt, &out) < 0)
			return TC_ACT_SHOT;
		svc_stats_np_packet(out.svc_id, pkt.len);
		if (!addr6_equal(out.saddr, pkt.flow.saddr))
			return tc_forward6(skb, &pkt, out.saddr, out.daddr);
		return TC_ACT_OK;
	default:
		return TC_ACT_OK;
	}
}

int ebpflb_np_in(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return np6_in(skb, data, data_end);
	return np4_in(skb, data, data_end);
}

static __always_inline int np4_out(struct __sk_buff *skb, void *data, void *data_end)
{
	struct xlate4 out = {};
	struct pkt4 pkt = {};

	if (pkt4_parse(data, data_end, skb->len, &pkt) == PKT_OK && np4_egress(&pkt, &out) == NP_XLATE &&
	    pkt4_xlate_skb(skb, &pkt, &out) < 0)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

static __always_inline int np6_out(struct __sk_buff *skb, void *data, void *data_end)
{
	struct xlate6 out = {};
	struct pkt6 pkt = {};

	if (pkt6_parse(data, data_end, skb->len, &pkt) == PKT_OK && np6_egress(&pkt, &out) == NP_XLATE &&
	    pkt6_xlate_skb(skb, &pkt, &out) < 0)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

int ebpflb_np_out(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return np6_out(skb, data, data_end);
	return np4_out(skb, data, data_end);
}
