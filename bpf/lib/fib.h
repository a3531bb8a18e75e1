/* Forwarding a translated packet without the stack's input routing: one route lookup
 * setup for tc and XDP per family, the router's duties (IPv4's TTL, IPv6's hop limit, the
 * MTU decision) for each, and the SNAT source a new flow's route gives.
 *
 * After SNAT (or the reply translation of a SNATed flow) the packet's source is one of this
 * node's own addresses; handed back to the stack it would be dropped as a martian. Like
 * Cilium, the programs look the route up themselves (bpf_fib_lookup), decrement the TTL as
 * a router must, and redirect to the egress interface. From tc, bpf_redirect_neigh (5.10+)
 * fills in the next hop's MAC when the neighbour is not resolved yet; XDP cannot, and
 * leaves such a packet to tc (bpf/nodeport_xdp.c). */
#ifndef EBPFLB_FIB_H
#define EBPFLB_FIB_H

#include <uapi/linux/bpf.h>
#include "pkt.h"
#include "stats.h"

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif

/* The MTU question differs by hook. An XDP frame is one packet on the wire: its IP length
 * is compared with the route's MTU (tot_len). An skb may be a GRO/GSO aggregate of up to
 * 64 KB that leaves as segments: since 5.12 a given tot_len is compared as it stands, so
 * an aggregate's lookup gives none (every one would come back FRAG_NEEDED: the collapse
 * of bulk TCP through a NodePort that Calico met in projectcalico/calico#5753). Without
 * one the kernel checks the skb against the egress device as forwarding would
 * (is_skb_forwardable: a GSO skb passes) and reports the device's MTU in mtu_result
 * (5.12+); tc_route4() then checks the segments themselves. A single packet keeps its
 * tot_len, so a route's own MTU counts as in the forwarding path (5.12+; 5.10 ignores
 * tot_len for skbs and checks the device). Where the kernel reports no MTU (5.10, a
 * lookup that failed on the neighbour) the agent's ebpflb_ifmtu has the device's. */
static __always_inline __u16 tc_fib_tot_len(const struct __sk_buff *skb, __u32 l3_len)
{
	return skb->gso_size ? 0 : (__u16)l3_len;
}

/* Route lookup for a packet leaving as saddr -> daddr, arrived on `ifindex`. `ctx` is the
 * skb or the xdp_md; *fib must be zeroed; `tot_len` the IP length to check against the
 * route's MTU, or 0 (above). BPF_FIB_LKUP_RET_*; fib->ifindex, smac and dmac say where to
 * send it. */
static __always_inline int fib4_lookup(void *ctx, __u32 ifindex, __u8 proto, __be32 saddr,
				       __be32 daddr, __u16 tot_len, struct bpf_fib_lookup *fib)
{
	fib->family = AF_INET;
	fib->ifindex = ifindex;
	fib->l4_protocol = proto;
	fib->tot_len = tot_len;
	fib->ipv4_src = saddr;
	fib->ipv4_dst = daddr;
	return bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
}

/* fib4_lookup's twin for IPv6. */
static __always_inline int fib6_lookup(void *ctx, __u32 ifindex, __u8 proto,
				       const __be32 saddr[4], const __be32 daddr[4],
				       __u16 tot_len, struct bpf_fib_lookup *fib)
{
	fib->family = AF_INET6;
	fib->ifindex = ifindex;
	fib->l4_protocol = proto;
	fib->tot_len = tot_len;
	addr6_copy(fib->ipv6_src, saddr);
	addr6_copy(fib->ipv6_dst, daddr);
	return bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
}

/* The next hop's MTU after a lookup with `tot_len`: the kernel's mtu_result where it
 * wrote one (5.12+; the field shares its place with tot_len, so an unchanged tot_len is
 * none), else the egress device's from ebpflb_ifmtu; 0 when unknown. */
static __always_inline __u32 fib_mtu(const struct bpf_fib_lookup *fib, __u16 tot_len)
{
	__u32 ifindex = fib->ifindex;
	__u32 *mtu;

	if (fib->mtu_result && fib->mtu_result != tot_len)
		return fib->mtu_result;
	mtu = ebpflb_ifmtu.lookup(&ifindex);
	return mtu ? *mtu : 0;
}

/* The length of the L4 header at l4_off: TCP's data offset, or a UDP header. */
static __always_inline __u32 tc_l4_hdr_len(struct __sk_buff *skb, __u32 l4_off, __u8 proto)
{
	__u8 doff_byte;

	if (proto != IPPROTO_TCP)
		return sizeof(struct udphdr);
	/* data offset: the high nibble of byte 12, in 32-bit words */
	if (bpf_skb_load_bytes(skb, l4_off + 12, &doff_byte, sizeof(doff_byte)) < 0)
		return sizeof(struct tcphdr);
	return (doff_byte >> 4) * 4;
}

/* What a route lookup for a packet this program forwards found. */
enum fib_verdict {
	FIB_SEND,     /* route and neighbour (or bpf_redirect_neigh) known, and it fits */
	FIB_TOO_BIG,  /* larger than the next hop's MTU (a GSO aggregate: its segments) */
	FIB_NO_ROUTE, /* no route: counted as STAT_FIB_FAIL */
};

/* The route lookup's verdict for an skb (or GRO aggregate) whose headers are at
 * l3_off/l4_off; *mtu holds the next hop's MTU with FIB_TOO_BIG (0: unknown). */
static __always_inline enum fib_verdict tc_fib_verdict(struct __sk_buff *skb, int rc,
						       const struct bpf_fib_lookup *fib,
						       __u16 tot_len, __u32 l3_off, __u32 l4_off,
						       __u8 proto, __u32 *mtu)
{
	__u32 gso_size = skb->gso_size;

	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED) {
		*mtu = fib_mtu(fib, tot_len);
		return FIB_TOO_BIG;
	}
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) {
		stat_inc(STAT_FIB_FAIL);
		return FIB_NO_ROUTE;
	}
	if (gso_size) { /* a segment: the IP and L4 headers and gso_size bytes of payload */
		*mtu = fib_mtu(fib, tot_len);
		if (*mtu && l4_off - l3_off + tc_l4_hdr_len(skb, l4_off, proto) + gso_size > *mtu)
			return FIB_TOO_BIG;
	}
	return FIB_SEND;
}

/* Route a packet about to be translated and sent as saddr -> daddr. */
static __always_inline enum fib_verdict tc_route4(struct __sk_buff *skb, const struct pkt4 *pkt,
						  __be32 saddr, __be32 daddr,
						  struct bpf_fib_lookup *fib, int *rc, __u32 *mtu)
{
	__u16 tot_len = tc_fib_tot_len(skb, pkt->len - pkt->l3_off);

	*rc = fib4_lookup(skb, skb->ifindex, pkt->flow.proto, saddr, daddr, tot_len, fib);
	return tc_fib_verdict(skb, *rc, fib, tot_len, pkt->l3_off, pkt->l4_off, pkt->flow.proto,
			      mtu);
}

/* tc_route4's twin. */
static __always_inline enum fib_verdict tc_route6(struct __sk_buff *skb, const struct pkt6 *pkt,
						  const __be32 saddr[4], const __be32 daddr[4],
						  struct bpf_fib_lookup *fib, int *rc, __u32 *mtu)
{
	__u16 tot_len = tc_fib_tot_len(skb, pkt->len - pkt->l3_off);

	*rc = fib6_lookup(skb, skb->ifindex, pkt->flow.proto, saddr, daddr, tot_len, fib);
	return tc_fib_verdict(skb, *rc, fib, tot_len, pkt->l3_off, pkt->l4_off, pkt->flow.proto,
			      mtu);
}

/* The SNAT source of a new flow from `client` to `backend` that arrived on `ifindex`: the
 * node address of the interface its route leaves by, as MASQUERADE takes it (on an
 * overlay, the tunnel device's: the peer's reverse-path filter expects that one), else the
 * node's primary address (key 0: an interface without an address of its own); NULL when
 * the agent gave neither. `ctx`: the skb or the xdp_md. */
static __always_inline __be32 *snat4_source(void *ctx, __u32 ifindex, __u8 proto, __be32 client,
					    __be32 backend)
{
	struct bpf_fib_lookup fib = {};
	__u32 primary = 0;
	__be32 *addr = NULL;
	int rc;

	/* Too big for the device (FRAG_NEEDED: a packet the forwarding step answers) still
	 * says which interface the route leaves by. */
	rc = fib4_lookup(ctx, ifindex, proto, client, backend, 0, &fib);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH ||
	    rc == BPF_FIB_LKUP_RET_FRAG_NEEDED) {
		__u32 egress = fib.ifindex;

		addr = ebpflb_ifaddr4.lookup(&egress);
	}
	return addr ? addr : ebpflb_ifaddr4.lookup(&primary);
}

/* snat4_source's twin. */
static __always_inline struct addr6 *snat6_source(void *ctx, __u32 ifindex, __u8 proto,
						  const __be32 client[4],
						  const __be32 backend[4])
{
	struct bpf_fib_lookup fib = {};
	struct addr6 *addr = NULL;
	__u32 primary = 0;
	int rc;

	rc = fib6_lookup(ctx, ifindex, proto, client, backend, 0, &fib);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH ||
	    rc == BPF_FIB_LKUP_RET_FRAG_NEEDED) {
		__u32 egress = fib.ifindex;

		addr = ebpflb_ifaddr6.lookup(&egress);
	}
	return addr ? addr : ebpflb_ifaddr6.lookup(&primary);
}

/* Decrement the IPv4 TTL of an skb (and fix the header checksum); -1 when it would
 * reach 0. */
static __always_inline int tc_dec_ttl(struct __sk_buff *skb, const struct pkt4 *pkt)
{
	__u32 off = pkt->l3_off + offsetof(struct iphdr, ttl);
	__be16 old_word, new_word;
	__u8 *bytes = (__u8 *)&new_word;

	if (bpf_skb_load_bytes(skb, off, &old_word, sizeof(old_word)) < 0)
		return -1;
	new_word = old_word;
	if (bytes[0] <= 1)
		return -1;
	bytes[0] -= 1; /* ttl is the first byte of the ttl/protocol word */
	if (bpf_l3_csum_replace(skb, pkt->l3_off + offsetof(struct iphdr, check), old_word,
				new_word, sizeof(new_word)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, off, &new_word, sizeof(new_word), 0) < 0 ? -1 : 0;
}

/* tc_dec_ttl's IPv6 duty: the hop limit (no header checksum to fix); -1 when it would
 * reach 0. */
static __always_inline int tc_dec_hop_limit(struct __sk_buff *skb, const struct pkt6 *pkt)
{
	__u32 off = pkt->l3_off + offsetof(struct ipv6hdr, hop_limit);
	__u8 hops;

	if (bpf_skb_load_bytes(skb, off, &hops, sizeof(hops)) < 0 || hops <= 1)
		return -1;
	hops -= 1;
	return bpf_skb_store_bytes(skb, off, &hops, sizeof(hops), 0) < 0 ? -1 : 0;
}

/* Send a routed skb on: `rc` and *fib from the route lookup, the TTL or hop limit already
 * decremented. */
static __always_inline int tc_redirect_routed(struct __sk_buff *skb, int rc,
					      const struct bpf_fib_lookup *fib)
{
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		/* Called by number: BCC declares an older prototype. The arguments mean "no
		 * params" on 5.10's (ifindex, flags) and on 5.11+'s (ifindex, params, plen, flags). */
		return ((long (*)(__u32, void *, int, __u64))BPF_FUNC_redirect_neigh)(fib->ifindex,
										    NULL, 0, 0);
	if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_dest), (void *)fib->dmac, ETH_ALEN,
				0) < 0 ||
	    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source), (void *)fib->smac, ETH_ALEN,
				0) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(fib->ifindex, 0);
}

/* Forward an skb that was translated already (an ICMP error: small) as saddr -> daddr;
 * one that does not fit is dropped, counted. */
static __always_inline int tc_forward4(struct __sk_buff *skb, const struct pkt4 *pkt,
				       __be32 saddr, __be32 daddr)
{
	struct bpf_fib_lookup fib = {};
	__u32 mtu = 0;
	int rc;

	switch (tc_route4(skb, pkt, saddr, daddr, &fib, &rc, &mtu)) {
	case FIB_SEND:
		break;
	case FIB_TOO_BIG:
		stat_inc(STAT_MTU_EXCEEDED);
		return TC_ACT_SHOT;
	default:
		return TC_ACT_SHOT;
	}
	if (tc_dec_ttl(skb, pkt) < 0)
		return TC_ACT_SHOT;
	return tc_redirect_routed(skb, rc, &fib);
}

/* tc_forward4's twin. */
static __always_inline int tc_forward6(struct __sk_buff *skb, const struct pkt6 *pkt,
				       const __be32 saddr[4], const __be32 daddr[4])
{
	struct bpf_fib_lookup fib = {};
	__u32 mtu = 0;
	int rc;

	switch (tc_route6(skb, pkt, saddr, daddr, &fib, &rc, &mtu)) {
	case FIB_SEND:
		break;
	case FIB_TOO_BIG:
		stat_inc(STAT_MTU_EXCEEDED);
		return TC_ACT_SHOT;
	default:
		return TC_ACT_SHOT;
	}
	if (tc_dec_hop_limit(skb, pkt) < 0)
		return TC_ACT_SHOT;
	return tc_redirect_routed(skb, rc, &fib);
}

/* Decrement the TTL of an XDP buffer and set the MACs the route lookup found; -1 when the
 * TTL would reach 0 or the headers are out of bounds. */
static __always_inline int xdp_forward4_prepare(struct xdp_md *ctx,
						const struct bpf_fib_lookup *fib)
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

/* xdp_forward4_prepare's twin for IPv6 (the hop limit has no checksum). */
static __always_inline int xdp_forward6_prepare(struct xdp_md *ctx,
						const struct bpf_fib_lookup *fib)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = data + sizeof(*eth);

	if ((void *)(ip6 + 1) > data_end || ip6->hop_limit <= 1)
		return -1;
	ip6->hop_limit -= 1;
	__builtin_memcpy(eth->h_dest, fib->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fib->smac, ETH_ALEN);
	return 0;
}

#endif /* EBPFLB_FIB_H */
