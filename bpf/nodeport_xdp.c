/* The NodePort/LoadBalancer/external-IP ingress path in XDP (--xdp native|generic), for
 * IPv4 and IPv6.
 *
 * Same decisions as the tc ingress program (lib/nodeport.h, shared conntrack and maps),
 * taken before the kernel allocates an skb. ICMP errors and IP fragments go on to tc,
 * which translates them (its skb helpers reach embedded headers; a fragment follows its
 * datagram's first there). A packet whose source
 * becomes a node address is sent on here (XDP_TX back out of the same interface, or
 * XDP_REDIRECT); a DNAT-only packet goes on to the stack (XDP_PASS). When the next hop's
 * MAC is unknown XDP cannot resolve it, so the packet goes to the stack untranslated and
 * the tc program, which can, translates it from the conntrack entry just made. tc stays
 * attached in every mode (it also does the egress side).
 */
#include <uapi/linux/bpf.h>

#include "lib/fib.h"
#include "lib/nodeport.h"

/* After a translation: XDP_TX or a redirect for a packet whose source became a node
 * address (`forward`, *fib looked up), else XDP_PASS. */
static __always_inline int xdp_send(struct xdp_md *ctx, bool forward,
				    const struct bpf_fib_lookup *fib)
{
	if (!forward)
		return XDP_PASS;
	if (fib->ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	return bpf_redirect(fib->ifindex, 0);
}

static __always_inline int np4_xdp(struct xdp_md *ctx, void *data, void *data_end)
{
	struct bpf_fib_lookup fib = {};
	struct xlate4 out = {};
	struct pkt4 pkt = {};
	bool forward;

	/* ICMP and fragments are tc's (the skb helpers rewrite embedded headers; a later
	 * fragment follows its first one there) */
	if (pkt4_parse(data, data_end, data_end - data, &pkt) != PKT_OK || pkt.frag != FRAG_NONE)
		return XDP_PASS;
	switch (np4_ingress(ctx, &pkt, ctx->ingress_ifindex, &out)) {
	case NP_DROP:
		return XDP_DROP;
	case NP_PASS:
	case NP_REJECT: /* the tc program builds the answer (it can resize the packet) */
		return XDP_PASS;
	case NP_XLATE:
		break;
	}
	/* The source becomes a node address: this program must forward the packet. */
	forward = out.saddr != pkt.flow.saddr;
	if (forward && fib4_lookup(ctx, ctx->ingress_ifindex, pkt.flow.proto, out.saddr, out.daddr,
				   pkt.len - pkt.l3_off, &fib) != BPF_FIB_LKUP_RET_SUCCESS)
		return XDP_PASS; /* untranslated: tc resolves the neighbour and translates */
	if (pkt4_xlate_xdp(ctx, &out) < 0)
		return XDP_DROP;
	/* Counted here, not in np4_ingress: a packet passed untranslated is counted by tc. */
	svc_stats_np_packet(out.svc_id, pkt.len);
	if (forward && xdp_forward4_prepare(ctx, &fib) < 0)
		return XDP_DROP;
	return xdp_send(ctx, forward, &fib);
}

static __always_inline int np6_xdp(struct xdp_md *ctx, void *data, void *data_end)
{
	struct bpf_fib_lookup fib = {};
	struct xlate6 out = {};
	struct pkt6 pkt = {};
	bool forward;

	/* Extension headers past the walk are counted by tc, which sees the packet next. */
	if (pkt6_parse(data, data_end, data_end - data, &pkt) != PKT_OK || pkt.frag != FRAG_NONE)
		return XDP_PASS;
	switch (np6_ingress(ctx, &pkt, ctx->ingress_ifindex, &out)) {
	case NP_DROP:
		return XDP_DROP;
	case NP_PASS:
	case NP_REJECT:
		return XDP_PASS;
	case NP_XLATE:
		break;
	}
	forward = !addr6_equal(out.saddr, pkt.flow.saddr);
	if (forward && fib6_lookup(ctx, ctx->ingress_ifindex, pkt.flow.proto, out.saddr, out.daddr,
				   pkt.len - pkt.l3_off, &fib) != BPF_FIB_LKUP_RET_SUCCESS)
		return XDP_PASS;
	if (pkt6_xlate_xdp(ctx, &pkt, &out) < 0)
		return XDP_DROP;
	svc_stats_np_packet(out.svc_id, pkt.len);
	if (forward && xdp_forward6_prepare(ctx, &fib) < 0)
		return XDP_DROP;
	return xdp_send(ctx, forward, &fib);
}

int ebpflb_np_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return np6_xdp(ctx, data, data_end);
	return np4_xdp(ctx, data, data_end);
}
