/* ICMP and ICMPv6 errors about a translated flow: what the error is about (the packet it
 * embeds), and rewriting it so its receiver recognises the packet as one it sent. A router
 * that cannot forward a translated packet (too big, TTL exceeded) or the backend refusing
 * it (port unreachable) reports about the packet as it saw it, after translation; the
 * flow's other end only knows it from before. kube-proxy gets this from netfilter's
 * conntrack (RELATED). The decisions, which flow and which way, are lib/nodeport.h's.
 *
 * A rewrite changes the outer addresses, the embedded packet's addresses and ports, the
 * embedded IPv4 header's checksum, the embedded L4 checksum (UDP's is in the first 8
 * bytes every error carries; TCP's only when the error carries the whole TCP header, as
 * Linux's do), and the ICMP checksum over all of it (ICMPv6's also over the outer
 * addresses). Embedded headers are read and written through the skb helpers (tc only),
 * copied to a per-CPU scratch element (ebpflb_icmpscratch) rather than the stack; XDP
 * passes ICMP to tc. */
#ifndef EBPFLB_ICMP_H
#define EBPFLB_ICMP_H

#include <uapi/linux/icmp.h>
#include <uapi/linux/icmpv6.h>
#include "csum.h"
#include "maps.h"
#include "pkt.h"

#define ICMP_HDR_LEN 8 /* type, code, checksum, one word; then the embedded packet */

/* What an ICMP error is about: the embedded packet's tuple as it was sent. */
struct icmp4_err {
	struct flow4 inner;  /* source, destination, ports and protocol of the embedded packet */
	__u32 inner_l3_off;  /* its IPv4 header (no options) */
	__u32 inner_l4_off;  /* its TCP/UDP header: at least the first 8 bytes are there */
	bool inner_tcp_whole; /* the embedded TCP header is whole: its checksum is there */
};

/* struct icmp4_err's twin: the embedded IPv6 packet (no extension headers). */
struct icmp6_err {
	struct flow6 inner;
	__u32 inner_l3_off;
	__u32 inner_l4_off;
	bool inner_tcp_whole;
};

/* The first bytes of an ICMP message. */
struct icmp_head {
	__u8 type;
	__u8 code;
	__sum16 check;
	__be32 rest;
};

/* An embedded L4 header's first 8 bytes, as 16-bit words (icmp_scratch.old_l4): ports,
 * then UDP's length and checksum (TCP's sequence number). */
#define L4_HEAD_UDP_CHECK 3 /* the word of a UDP header's checksum */
#define TCP_CHECK_OFF 16    /* the TCP checksum's offset in its header */

static __always_inline bool icmp4_is_error(__u8 type)
{
	return type == ICMP_DEST_UNREACH || type == ICMP_TIME_EXCEEDED ||
	       type == ICMP_PARAMETERPROB;
}

static __always_inline bool icmp6_is_error(__u8 type)
{
	return type == ICMPV6_DEST_UNREACH || type == ICMPV6_PKT_TOOBIG ||
	       type == ICMPV6_TIME_EXCEED || type == ICMPV6_PARAMPROB;
}

/* PKT_OK when the ICMP message at pkt->l4_off is an error about a TCP/UDP packet whose
 * headers it carries (an IP header without options, the first 8 L4 bytes), and *err what
 * it is about; PKT_NOT_OURS for anything else (echo, redirects, cut-short errors). */
static __always_inline enum pkt_parse icmp4_err_parse(struct __sk_buff *skb,
						      const struct pkt4 *pkt, struct icmp4_err *err)
{
	struct icmp_head icmp;
	struct iphdr inner;
	__be16 ports[2];

	if (bpf_skb_load_bytes(skb, pkt->l4_off, &icmp, sizeof(icmp)) < 0 ||
	    !icmp4_is_error(icmp.type))
		return PKT_NOT_OURS;
	err->inner_l3_off = pkt->l4_off + ICMP_HDR_LEN;
	if (bpf_skb_load_bytes(skb, err->inner_l3_off, &inner, sizeof(inner)) < 0)
		return PKT_NOT_OURS;
	if (inner.version != 4 || inner.ihl != 5 ||
	    (inner.protocol != IPPROTO_TCP && inner.protocol != IPPROTO_UDP) ||
	    (bpf_ntohs(inner.frag_off) & IP_OFFSET_MASK)) /* a later fragment: no ports */
		return PKT_NOT_OURS;
	err->inner_l4_off = err->inner_l3_off + sizeof(inner);
	if (bpf_skb_load_bytes(skb, err->inner_l4_off, ports, sizeof(ports)) < 0)
		return PKT_NOT_OURS;
	err->inner.saddr = inner.saddr;
	err->inner.daddr = inner.daddr;
	err->inner.sport = ports[0];
	err->inner.dport = ports[1];
	err->inner.proto = inner.protocol;
	err->inner_tcp_whole = inner.protocol == IPPROTO_TCP &&
			       skb->len >= err->inner_l4_off + sizeof(struct tcphdr);
	return PKT_OK;
}

/* icmp4_err_parse's twin for ICMPv6 errors (destination unreachable, packet too big,
 * time exceeded, parameter problem) about an IPv6 packet without extension headers. */
static __always_inline enum pkt_parse icmp6_err_parse(struct __sk_buff *skb,
						      const struct pkt6 *pkt, struct icmp6_err *err)
{
	struct icmp_head icmp;
	struct ipv6hdr inner;
	__be16 ports[2];

	if (bpf_skb_load_bytes(skb, pkt->l4_off, &icmp, sizeof(icmp)) < 0 ||
	    !icmp6_is_error(icmp.type))
		return PKT_NOT_OURS;
	err->inner_l3_off = pkt->l4_off + ICMP_HDR_LEN;
	if (bpf_skb_load_bytes(skb, err->inner_l3_off, &inner, sizeof(inner)) < 0)
		return PKT_NOT_OURS;
	if (inner.version != 6 || (inner.nexthdr != IPPROTO_TCP && inner.nexthdr != IPPROTO_UDP))
		return PKT_NOT_OURS;
	err->inner_l4_off = err->inner_l3_off + sizeof(inner);
	if (bpf_skb_load_bytes(skb, err->inner_l4_off, ports, sizeof(ports)) < 0)
		return PKT_NOT_OURS;
	addr6_copy(err->inner.saddr, inner.saddr.in6_u.u6_addr32);
	addr6_copy(err->inner.daddr, inner.daddr.in6_u.u6_addr32);
	err->inner.sport = ports[0];
	err->inner.dport = ports[1];
	err->inner.proto = inner.nexthdr;
	err->inner_tcp_whole = inner.nexthdr == IPPROTO_TCP &&
			       skb->len >= err->inner_l4_off + sizeof(struct tcphdr);
	return PKT_OK;
}

/* An embedded TCP checksum (whole TCP header carried) updated for the new tuple, and the
 * ICMP checksum for that update. */
static __always_inline int icmp_inner_tcp_check(struct __sk_buff *skb, __u32 check_off,
						__u32 icmp_check_off, const __be32 *old_addrs,
						const __be32 *new_addrs, __u32 addr_words,
						const __be16 *old_ports, const __be16 *new_ports)
{
	__u16 old_check, check;
	__u32 i;

	if (bpf_skb_load_bytes(skb, check_off, &old_check, sizeof(old_check)) < 0)
		return -1;
	check = old_check;
#pragma unroll
	for (i = 0; i < 8; i++) /* both addresses: 2 words (IPv4) or 8 (IPv6) */
		if (i < addr_words)
			csum_replace4(&check, old_addrs[i], new_addrs[i]);
	csum_replace2(&check, old_ports[0], new_ports[0]);
	csum_replace2(&check, old_ports[1], new_ports[1]);
	if (bpf_l4_csum_replace(skb, icmp_check_off, old_check, check, sizeof(check)) < 0 ||
	    bpf_skb_store_bytes(skb, check_off, &check, sizeof(check), 0) < 0)
		return -1;
	return 0;
}

/* What an ICMP error's rewrite works with, in this CPU's ebpflb_scratch element: the
 * embedded addresses and L4 header's first 8 bytes before and after (the outer addresses
 * too, for ICMPv6's pseudo-header), and the embedded IPv4 header before and after. */
struct icmp_copies {
	__be32 old_addrs[8];
	__be32 new_addrs[8];
	__be16 old_l4[4];
	__be16 new_l4[4];
	struct iphdr old_ip;
	struct iphdr new_ip;
};

/* The whole ICMP path's working set, per family: the packet, what the error is about and
 * the outer header's new addresses, then the rewrite's copies. */
struct icmp4_work {
	struct pkt4 pkt;
	struct icmp4_err err;
	struct xlate4 out;
	struct icmp_copies copies;
};

struct icmp6_work {
	struct pkt6 pkt;
	struct icmp6_err err;
	struct xlate6 out;
	struct icmp_copies copies;
};

_Static_assert(sizeof(struct icmp4_work) <= EBPFLB_SCRATCH_SIZE, "icmp4_work fits ebpflb_scratch");
_Static_assert(sizeof(struct icmp6_work) <= EBPFLB_SCRATCH_SIZE, "icmp6_work fits ebpflb_scratch");

/* This CPU's scratch element as the ICMP path's working set, zeroed; NULL only when the
 * map is missing. The element is this CPU's while the program runs. */
static __always_inline void *icmp_work(__u32 size)
{
	__u32 zero = 0;
	struct scratch *sc = ebpflb_scratch.lookup(&zero);

	if (!sc)
		return NULL;
	__builtin_memset(sc->bytes, 0, size);
	return sc->bytes;
}

/* Rewrite an ICMP error about a translated flow: the outer source and destination to
 * `saddr` and `daddr`, the embedded packet to the tuple `inner`, with `copies` for room.
 * 0 on success. */
static __always_inline int icmp4_err_xlate(struct __sk_buff *skb, const struct pkt4 *pkt,
					   const struct icmp4_err *err, __be32 saddr,
					   __be32 daddr, const struct flow4 *inner,
					   struct icmp_copies *copies)
{
	__u32 icmp_check = pkt->l4_off + offsetof(struct icmp_head, check);
	struct icmp_copies *sc = copies;
	struct iphdr *old_ip = &sc->old_ip, *new_ip = &sc->new_ip;
	__u32 diff;

	if (bpf_skb_load_bytes(skb, err->inner_l3_off, old_ip, sizeof(*old_ip)) < 0 ||
	    bpf_skb_load_bytes(skb, err->inner_l4_off, sc->old_l4, sizeof(sc->old_l4)) < 0)
		return -1;
	__builtin_memcpy(new_ip, old_ip, sizeof(*new_ip));
	new_ip->saddr = inner->saddr;
	new_ip->daddr = inner->daddr;
	new_ip->check = 0;
	new_ip->check = csum_fold32(bpf_csum_diff(0, 0, (__be32 *)new_ip, sizeof(*new_ip), 0));
	__builtin_memcpy(sc->new_l4, sc->old_l4, sizeof(sc->new_l4));
	sc->new_l4[0] = inner->sport;
	sc->new_l4[1] = inner->dport;
	if (inner->proto == IPPROTO_UDP && sc->old_l4[L4_HEAD_UDP_CHECK]) {
		__u16 *check = &sc->new_l4[L4_HEAD_UDP_CHECK];

		csum_replace4(check, old_ip->saddr, new_ip->saddr);
		csum_replace4(check, old_ip->daddr, new_ip->daddr);
		csum_replace2(check, sc->old_l4[0], sc->new_l4[0]);
		csum_replace2(check, sc->old_l4[1], sc->new_l4[1]);
		if (*check == 0)
			*check = CSUM_MANGLED_0;
	}
	if (err->inner_tcp_whole) {
		sc->old_addrs[0] = old_ip->saddr;
		sc->old_addrs[1] = old_ip->daddr;
		sc->new_addrs[0] = new_ip->saddr;
		sc->new_addrs[1] = new_ip->daddr;
		if (icmp_inner_tcp_check(skb, err->inner_l4_off + TCP_CHECK_OFF, icmp_check,
					 sc->old_addrs, sc->new_addrs, 2, sc->old_l4,
					 sc->new_l4) < 0)
			return -1;
	}
	/* The ICMP checksum covers the embedded bytes: one difference over both headers. */
	diff = (__u32)bpf_csum_diff((__be32 *)old_ip, sizeof(*old_ip), (__be32 *)new_ip,
				    sizeof(*new_ip), 0);
	diff = (__u32)bpf_csum_diff((__be32 *)sc->old_l4, sizeof(sc->old_l4),
				    (__be32 *)sc->new_l4, sizeof(sc->new_l4), diff);
	if (bpf_l4_csum_replace(skb, icmp_check, 0, diff, 0) < 0 ||
	    bpf_skb_store_bytes(skb, err->inner_l3_off, new_ip, sizeof(*new_ip), 0) < 0 ||
	    bpf_skb_store_bytes(skb, err->inner_l4_off, sc->new_l4, sizeof(sc->new_l4), 0) < 0)
		return -1;
	/* The outer header: the ICMPv4 checksum does not cover it. */
	if (saddr != pkt->flow.saddr &&
	    (bpf_l3_csum_replace(skb, pkt->l3_off + offsetof(struct iphdr, check),
				 pkt->flow.saddr, saddr, sizeof(saddr)) < 0 ||
	     bpf_skb_store_bytes(skb, pkt->l3_off + offsetof(struct iphdr, saddr), &saddr,
				 sizeof(saddr), 0) < 0))
		return -1;
	if (daddr != pkt->flow.daddr &&
	    (bpf_l3_csum_replace(skb, pkt->l3_off + offsetof(struct iphdr, check),
				 pkt->flow.daddr, daddr, sizeof(daddr)) < 0 ||
	     bpf_skb_store_bytes(skb, pkt->l3_off + offsetof(struct iphdr, daddr), &daddr,
				 sizeof(daddr), 0) < 0))
		return -1;
	return 0;
}

/* icmp4_err_xlate's twin. The embedded IPv6 header has no checksum; the ICMPv6 checksum
 * also covers the outer addresses (its pseudo-header). */
static __always_inline int icmp6_err_xlate(struct __sk_buff *skb, const struct pkt6 *pkt,
					   const struct icmp6_err *err, const __be32 saddr[4],
					   const __be32 daddr[4], const struct flow6 *inner,
					   struct icmp_copies *copies)
{
	__u32 icmp_check = pkt->l4_off + offsetof(struct icmp_head, check);
	struct icmp_copies *sc = copies;
	__u32 diff, i;

	if (bpf_skb_load_bytes(skb, err->inner_l3_off + offsetof(struct ipv6hdr, saddr),
			       sc->old_addrs, sizeof(sc->old_addrs)) < 0 ||
	    bpf_skb_load_bytes(skb, err->inner_l4_off, sc->old_l4, sizeof(sc->old_l4)) < 0)
		return -1;
	addr6_copy(sc->new_addrs, inner->saddr);
	addr6_copy(&sc->new_addrs[4], inner->daddr);
	__builtin_memcpy(sc->new_l4, sc->old_l4, sizeof(sc->new_l4));
	sc->new_l4[0] = inner->sport;
	sc->new_l4[1] = inner->dport;
	if (inner->proto == IPPROTO_UDP && sc->old_l4[L4_HEAD_UDP_CHECK]) {
		__u16 *check = &sc->new_l4[L4_HEAD_UDP_CHECK];

#pragma unroll
		for (i = 0; i < 8; i++)
			csum_replace4(check, sc->old_addrs[i], sc->new_addrs[i]);
		csum_replace2(check, sc->old_l4[0], sc->new_l4[0]);
		csum_replace2(check, sc->old_l4[1], sc->new_l4[1]);
		if (*check == 0)
			*check = CSUM_MANGLED_0;
	}
	if (err->inner_tcp_whole &&
	    icmp_inner_tcp_check(skb, err->inner_l4_off + TCP_CHECK_OFF, icmp_check, sc->old_addrs,
				 sc->new_addrs, 8, sc->old_l4, sc->new_l4) < 0)
		return -1;
	diff = (__u32)bpf_csum_diff(sc->old_addrs, sizeof(sc->old_addrs), sc->new_addrs,
				    sizeof(sc->new_addrs), 0);
	diff = (__u32)bpf_csum_diff((__be32 *)sc->old_l4, sizeof(sc->old_l4),
				    (__be32 *)sc->new_l4, sizeof(sc->new_l4), diff);
	if (bpf_l4_csum_replace(skb, icmp_check, 0, diff, 0) < 0 ||
	    bpf_skb_store_bytes(skb, err->inner_l3_off + offsetof(struct ipv6hdr, saddr),
				sc->new_addrs, sizeof(sc->new_addrs), 0) < 0 ||
	    bpf_skb_store_bytes(skb, err->inner_l4_off, sc->new_l4, sizeof(sc->new_l4), 0) < 0)
		return -1;
	/* The outer addresses, in the ICMPv6 pseudo-header. */
	addr6_copy(sc->old_addrs, pkt->flow.saddr);
	addr6_copy(&sc->old_addrs[4], pkt->flow.daddr);
	addr6_copy(sc->new_addrs, saddr);
	addr6_copy(&sc->new_addrs[4], daddr);
	diff = (__u32)bpf_csum_diff(sc->old_addrs, sizeof(sc->old_addrs), sc->new_addrs,
				    sizeof(sc->new_addrs), 0);
	if (bpf_l4_csum_replace(skb, icmp_check, 0, diff, BPF_F_PSEUDO_HDR) < 0 ||
	    bpf_skb_store_bytes(skb, pkt->l3_off + offsetof(struct ipv6hdr, saddr), sc->new_addrs,
				sizeof(sc->new_addrs), 0) < 0)
		return -1;
	return 0;
}

#endif /* EBPFLB_ICMP_H */
