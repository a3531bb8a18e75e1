/* The NodePort/LoadBalancer/external-IP ingress path in XDP (--xdp native|generic).
 *
 * Same decisions as the tc ingress program (lib/nat.h, shared conntrack and maps), taken
 * before the kernel allocates an skb. A packet whose source becomes a node address is
 * sent on here (XDP_TX back out of the same interface, or XDP_REDIRECT); a DNAT-only
 * packet goes on to the stack (XDP_PASS). When the next hop's MAC is unknown XDP cannot
 * resolve it, so the packet goes to the stack untranslated and the tc program, which can,
 * translates it from the conntrack entry just made. tc stays attached in every mode (it
 * also does the egress side).
 */
#include <uapi/linux/bpf.h>

#include "lib/nat.h"

#ifndef AF_INET
#define AF_INET 2
#endif

/* One's-complement checksum updates (RFC 1624) on 16-bit words as they sit in memory:
 * the sum is byte-order independent, so no conversion is needed. */
static __always_inline __u16 csum16_add(__u16 csum, __u16 addend)
{
	__u32 res = (__u32)csum + addend;

	return (__u16)((res & 0xffff) + (res >> 16));
}

static __always_inline void csum_replace2(__u16 *sum, __u16 from, __u16 to)
{
	__u16 csum = ~*sum;

	csum = csum16_add(csum, ~from);
	csum = csum16_add(csum, to);
	*sum = ~csum;
}

static __always_inline void csum_replace4(__u16 *sum, __u32 from, __u32 to)
{
	csum_replace2(sum, (__u16)(from >> 16), (__u16)(to >> 16));
	csum_replace2(sum, (__u16)from, (__u16)to);
}

/* Fix an L4 checksum for new addresses and ports (each protocol's header in its branch,
 * so the verifier keeps every packet pointer's bounds). */
static __always_inline void l4_csum_update(__u16 *check, const struct iphdr *ip, const __u16 *ports,
					   const struct np4_xlate *out)
{
	csum_replace4(check, ip->saddr, out->saddr);
	csum_replace4(check, ip->daddr, out->daddr);
	csum_replace2(check, ports[0], out->sport);
	csum_replace2(check, ports[1], out->dport);
}

/* Rewrite addresses and ports in place; -1 if the headers are out of bounds. */
static __always_inline int xdp_rewrite(struct xdp_md *ctx, const struct np4_xlate *out)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	__u32 ihl;

	if ((void *)(ip + 1) > data_end)
		return -1;
	ihl = (ip->ihl & 0xf) * 4;
	if (ip->protocol == IPPROTO_TCP) {
		struct tcphdr *tcp = (void *)ip + ihl;

		if ((void *)(tcp + 1) > data_end)
			return -1;
		l4_csum_update(&tcp->check, ip, (__u16 *)tcp, out);
		tcp->source = out->sport;
		tcp->dest = out->dport;
	} else {
		struct udphdr *udp = (void *)ip + ihl;

		if ((void *)(udp + 1) > data_end)
			return -1;
		if (udp->check) { /* 0: no UDP checksum, keep it that way */
			l4_csum_update(&udp->check, ip, (__u16 *)udp, out);
			if (udp->check == 0)
				udp->check = 0xffff;
		}
		udp->source = out->sport;
		udp->dest = out->dport;
	}
	csum_replace4(&ip->check, ip->saddr, out->saddr);
	csum_replace4(&ip->check, ip->daddr, out->daddr);
	ip->saddr = out->saddr;
	ip->daddr = out->daddr;
	return 0;
}

/* Decrement the TTL and set the MACs the route lookup found. */
static __always_inline int xdp_forward_prepare(struct xdp_md *ctx, const struct bpf_fib_lookup *fib)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);

	if ((void *)(ip + 1) > data_end || ip->ttl <= 1)
		return -1;
	/* ttl is the high-order byte of its 16-bit word in network order. */
	csum_replace2(&ip->check, bpf_htons((__u16)ip->ttl << 8), bpf_htons((__u16)(ip->ttl - 1) << 8));
	ip->ttl -= 1;
	__builtin_memcpy(eth->h_dest, fib->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fib->smac, ETH_ALEN);
	return 0;
}

int ebpflb_np_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct bpf_fib_lookup fib = {};
	struct np4_xlate out = {};
	struct pkt4 pkt = {};
	int forward;

	if (pkt4_parse(data, data_end, data_end - data, &pkt) < 0)
		return XDP_PASS;
	switch (np4_ingress(&pkt, ctx->ingress_ifindex, &out)) {
	case NP_DROP:
		return XDP_DROP;
	case NP_PASS:
		return XDP_PASS;
	}
	/* The source becomes a node address: this program must forward the packet. */
	forward = out.saddr != pkt.flow.saddr;
	if (forward) {
		fib.family = AF_INET;
		fib.ifindex = ctx->ingress_ifindex;
		fib.l4_protocol = pkt.flow.proto;
		fib.tot_len = pkt.len - pkt.l3_off;
		fib.ipv4_src = out.saddr;
		fib.ipv4_dst = out.daddr;
		if (bpf_fib_lookup(ctx, &fib, sizeof(fib), 0) != BPF_FIB_LKUP_RET_SUCCESS)
			return XDP_PASS; /* untranslated: tc resolves the neighbour and translates */
	}
	if (xdp_rewrite(ctx, &out) < 0)
		return XDP_DROP;
	if (!forward)
		return XDP_PASS;
	if (xdp_forward_prepare(ctx, &fib) < 0)
		return XDP_DROP;
	if (fib.ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	return bpf_redirect(fib.ifindex, 0);
}
