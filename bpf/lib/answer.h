/* Packets the programs answer themselves, built from the tc ingress skb (resized,
 * addresses swapped) and sent back out of the interface it came in on, from the address it
 * was sent to:
 *
 * - kube-proxy's REJECT for external traffic to a service with no endpoint at all: an
 *   IPv4 TCP segment is answered with a RST, an IPv4 UDP datagram with an ICMP port
 *   unreachable, an IPv6 packet of either protocol with an ICMPv6 port unreachable (as
 *   ip6tables' REJECT does by default; Linux fails a connecting TCP socket with
 *   ECONNREFUSED on it), so the client fails at once instead of retrying until it times
 *   out;
 * - a packet this node must forward that does not fit the next hop and may not be
 *   fragmented: fragmentation needed (IPv4 with DF, and GRO aggregates) or packet too big
 *   (IPv6), with the next hop's MTU, as a router's forwarding path does, so the sender's
 *   path MTU discovery works through the node (IPv4 without DF is fragmented: frag.h). The
 *   answer embeds the packet as its sender sent it (before any translation): that is the
 *   flow the sender's stack matches it to.
 *
 * The ICMP answers carry the offending packet's IP header and first 8 bytes of its L4
 * header (RFC 792; RFC 4443 allows more, and the 8 bytes are what the receiver matches
 * the error to its socket by: ports and, for TCP, the sequence number). */
#ifndef EBPFLB_ANSWER_H
#define EBPFLB_ANSWER_H

#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/icmp.h>
#include <uapi/linux/icmpv6.h>
#include <uapi/linux/pkt_cls.h>
#include "pkt.h"
#include "stats.h"

/* The pseudo-header the TCP checksum covers (RFC 793). */
struct pseudo4 {
	__be32 saddr;
	__be32 daddr;
	__u8 zero;
	__u8 proto;
	__be16 len;
};

/* Answer a TCP segment with a RST (RFC 793 "Reset Generation": with the segment's ACK
 * number as sequence when it has one, else sequence 0 and an ACK of what it carried).
 * TC_ACT_REDIRECT on success, TC_ACT_SHOT when the segment cannot be answered (a RST
 * itself, IP options, a failed helper). */
static __always_inline int tc_reject4_tcp(struct __sk_buff *skb, const struct pkt4 *pkt)
{
	const __u32 len = sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct tcphdr);
	struct pseudo4 pseudo = {};
	__u8 mac[ETH_ALEN];
	struct ethhdr *eth;
	struct iphdr *ip;
	struct tcphdr *tcp;
	__be32 seq, ack_seq;
	__u32 payload;
	__u16 flags;
	__s64 sum;
	void *data, *data_end;

	if (pkt->tcp_flags & TCP_FLAG_RST || pkt->l4_off != sizeof(*eth) + sizeof(*ip))
		return TC_ACT_SHOT;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ip = data + sizeof(*eth);
	tcp = (void *)(ip + 1);
	if ((void *)(tcp + 1) > data_end)
		return TC_ACT_SHOT;
	payload = bpf_ntohs(ip->tot_len) - sizeof(*ip) - tcp->doff * 4;
	if (tcp->ack) {
		seq = tcp->ack_seq;
		ack_seq = 0;
		flags = TCP_FLAG_RST;
	} else {
		seq = 0;
		ack_seq = bpf_htonl(bpf_ntohl(tcp->seq) + payload + tcp->syn + tcp->fin);
		flags = TCP_FLAG_RST | TCP_FLAG_ACK;
	}
	if (bpf_skb_change_tail(skb, len, 0) < 0)
		return TC_ACT_SHOT;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	ip = data + sizeof(*eth);
	tcp = (void *)(ip + 1);
	if ((void *)(tcp + 1) > data_end)
		return TC_ACT_SHOT;

	__builtin_memcpy(mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);

	ip->tos = 0;
	ip->tot_len = bpf_htons(sizeof(*ip) + sizeof(*tcp));
	ip->id = 0;
	ip->frag_off = bpf_htons(0x4000); /* DF */
	ip->ttl = 64;
	pseudo.saddr = pkt->flow.daddr; /* the frontend answers */
	pseudo.daddr = pkt->flow.saddr;
	ip->saddr = pseudo.saddr;
	ip->daddr = pseudo.daddr;
	ip->check = 0;
	ip->check = csum_fold32(bpf_csum_diff(0, 0, (__be32 *)ip, sizeof(*ip), 0));

	tcp->source = pkt->flow.dport;
	tcp->dest = pkt->flow.sport;
	tcp->seq = seq;
	tcp->ack_seq = ack_seq;
	((__u8 *)tcp)[12] = 5 << 4; /* data offset: 5 words, no options */
	((__u8 *)tcp)[TCP_FLAGS_OFF] = (__u8)flags;
	tcp->window = 0;
	tcp->urg_ptr = 0;
	tcp->check = 0;
	pseudo.proto = IPPROTO_TCP;
	pseudo.len = bpf_htons(sizeof(*tcp));
	sum = bpf_csum_diff(0, 0, (__be32 *)&pseudo, sizeof(pseudo), 0);
	sum = bpf_csum_diff(0, 0, (__be32 *)tcp, sizeof(*tcp), (__wsum)sum);
	tcp->check = csum_fold32(sum);
	stat_inc(STAT_NP_REJECT);
	return bpf_redirect(skb->ifindex, 0);
}

/* An ICMP destination unreachable as built here: the offending datagram's IP header and
 * first 8 bytes (RFC 792), all of the reply but its Ethernet header checksummed in place. */
struct icmp4_unreach {
	struct ethhdr eth;
	struct iphdr ip;
	__u8 type;
	__u8 code;
	__sum16 check;
	__be32 unused;
	struct iphdr inner;
	__u8 inner_l4[8];
} __attribute__((packed));

/* Answer an IPv4 packet (IP header without options) with an ICMP message of `type`/`code`
 * from the address it was sent to; `rest` is the header's second word (the next hop's
 * MTU for fragmentation needed), `stat` counts it. TC_ACT_REDIRECT on success, TC_ACT_SHOT
 * when it cannot be answered (IP options, a failed helper). */
static __always_inline int tc_icmp4_answer(struct __sk_buff *skb, const struct pkt4 *pkt,
					   __u8 type, __u8 code, __be32 rest, __u32 stat)
{
	struct icmp4_unreach reply = {};
	__s64 sum;

	if (pkt->l4_off != sizeof(struct ethhdr) + sizeof(struct iphdr))
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, 0, &reply.eth, sizeof(reply.eth)) < 0 ||
	    bpf_skb_load_bytes(skb, pkt->l3_off, &reply.inner, sizeof(reply.inner)) < 0 ||
	    bpf_skb_load_bytes(skb, pkt->l4_off, reply.inner_l4, sizeof(reply.inner_l4)) < 0)
		return TC_ACT_SHOT;
	__builtin_memcpy(reply.eth.h_dest, reply.eth.h_source, ETH_ALEN);
	if (bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_dest), reply.eth.h_source,
			       ETH_ALEN) < 0)
		return TC_ACT_SHOT;
	reply.ip.version = 4;
	reply.ip.ihl = 5;
	reply.ip.tot_len = bpf_htons(sizeof(reply) - sizeof(reply.eth));
	reply.ip.ttl = 64;
	reply.ip.protocol = IPPROTO_ICMP;
	reply.ip.saddr = pkt->flow.daddr; /* the address it was sent to answers */
	reply.ip.daddr = pkt->flow.saddr;
	reply.ip.check = csum_fold32(bpf_csum_diff(0, 0, (__be32 *)&reply.ip, sizeof(reply.ip), 0));
	reply.type = type;
	reply.code = code;
	reply.unused = rest;
	sum = bpf_csum_diff(0, 0, (__be32 *)&reply.type,
			    sizeof(reply) - offsetof(struct icmp4_unreach, type), 0);
	reply.check = csum_fold32(sum);
	if (bpf_skb_change_tail(skb, sizeof(reply), 0) < 0 ||
	    bpf_skb_store_bytes(skb, 0, &reply, sizeof(reply), 0) < 0)
		return TC_ACT_SHOT;
	stat_inc(stat);
	return bpf_redirect(skb->ifindex, 0);
}

/* Answer a UDP datagram with ICMP port unreachable (REJECT). */
static __always_inline int tc_reject4_udp(struct __sk_buff *skb, const struct pkt4 *pkt)
{
	return tc_icmp4_answer(skb, pkt, ICMP_DEST_UNREACH, ICMP_PORT_UNREACH, 0, STAT_NP_REJECT);
}

/* Whether an IPv4 packet too big for the next hop may be fragmented instead of answered:
 * DF clear, and not a GRO aggregate (whose segments the stack cuts, not fragments). */
static __always_inline bool tc_may_fragment4(struct __sk_buff *skb, const struct pkt4 *pkt)
{
	__be16 frag_off;

	if (skb->gso_size || bpf_skb_load_bytes(skb, pkt->l3_off + offsetof(struct iphdr, frag_off),
						&frag_off, sizeof(frag_off)) < 0)
		return false;
	return !(frag_off & bpf_htons(IP_DF));
}

/* A packet to forward that does not fit the next hop (`mtu`; 0: unknown) and may not be
 * fragmented: fragmentation needed, as the forwarding path answers. */
static __always_inline int tc_too_big4(struct __sk_buff *skb, const struct pkt4 *pkt, __u32 mtu)
{
	/* RFC 1191: the next-hop MTU in the low 16 bits of the second word; with none known,
	 * 0 (the sender falls back to RFC 1191's plateaus) */
	return tc_icmp4_answer(skb, pkt, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED,
			       bpf_htonl(mtu & 0xffff), STAT_TOO_BIG_SENT);
}

/* The pseudo-header the ICMPv6 checksum covers (RFC 8200 8.1). */
struct pseudo6 {
	__be32 saddr[4];
	__be32 daddr[4];
	__be32 len;       /* upper-layer packet length */
	__u8 zero[3];
	__u8 nexthdr;
};

/* An ICMPv6 destination unreachable as built here: the offending packet's IPv6 header
 * and first 8 bytes of its TCP/UDP header (RFC 4443 allows any amount up to the minimum
 * MTU; that is what the client's stack matches the error to its socket by). */
struct icmp6_unreach {
	struct ethhdr eth;
	struct ipv6hdr ip6;
	__u8 type;
	__u8 code;
	__sum16 check;
	__be32 unused;
	struct ipv6hdr inner;
	__u8 inner_l4[8];
} __attribute__((packed));

/* tc_icmp4_answer's twin: an ICMPv6 message of `type`/`code` about an IPv6 packet without
 * extension headers, from the address it was sent to; `rest` is the header's second word
 * (the MTU of packet too big). */
static __always_inline int tc_icmp6_answer(struct __sk_buff *skb, const struct pkt6 *pkt,
					   __u8 type, __u8 code, __be32 rest, __u32 stat)
{
	const __u32 message = sizeof(struct icmp6_unreach) - offsetof(struct icmp6_unreach, type);
	struct icmp6_unreach reply = {};
	struct pseudo6 pseudo = {};
	__s64 sum;

	if (pkt->l4_off != sizeof(struct ethhdr) + sizeof(struct ipv6hdr))
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, 0, &reply.eth, sizeof(reply.eth)) < 0 ||
	    bpf_skb_load_bytes(skb, pkt->l3_off, &reply.inner, sizeof(reply.inner)) < 0 ||
	    bpf_skb_load_bytes(skb, pkt->l4_off, reply.inner_l4, sizeof(reply.inner_l4)) < 0)
		return TC_ACT_SHOT;
	__builtin_memcpy(reply.eth.h_dest, reply.eth.h_source, ETH_ALEN);
	if (bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_dest), reply.eth.h_source,
			       ETH_ALEN) < 0)
		return TC_ACT_SHOT;
	reply.ip6.version = 6;
	reply.ip6.payload_len = bpf_htons(message);
	reply.ip6.nexthdr = IPPROTO_ICMPV6;
	reply.ip6.hop_limit = 64;
	/* memcpy, not addr6_copy: the packed struct's addresses are not 4-byte aligned */
	__builtin_memcpy(&reply.ip6.saddr, pkt->flow.daddr, 16); /* the address it was sent to */
	__builtin_memcpy(&reply.ip6.daddr, pkt->flow.saddr, 16);
	reply.type = type;
	reply.code = code;
	reply.unused = rest;
	addr6_copy(pseudo.saddr, pkt->flow.daddr);
	addr6_copy(pseudo.daddr, pkt->flow.saddr);
	pseudo.len = bpf_htonl(message);
	pseudo.nexthdr = IPPROTO_ICMPV6;
	sum = bpf_csum_diff(0, 0, (__be32 *)&pseudo, sizeof(pseudo), 0);
	sum = bpf_csum_diff(0, 0, (__be32 *)&reply.type, message, (__wsum)sum);
	reply.check = csum_fold32(sum);
	if (bpf_skb_change_tail(skb, sizeof(reply), 0) < 0 ||
	    bpf_skb_store_bytes(skb, 0, &reply, sizeof(reply), 0) < 0)
		return TC_ACT_SHOT;
	stat_inc(stat);
	return bpf_redirect(skb->ifindex, 0);
}

/* Answer an IPv6 TCP segment or UDP datagram with ICMPv6 port unreachable (REJECT). */
static __always_inline int tc_reject6(struct __sk_buff *skb, const struct pkt6 *pkt)
{
	return tc_icmp6_answer(skb, pkt, ICMPV6_DEST_UNREACH, ICMPV6_PORT_UNREACH, 0,
			       STAT_NP_REJECT);
}

/* tc_too_big4's twin: IPv6 routers never fragment, so packet too big is always the answer
 * (with the IPv6 minimum MTU when the next hop's is unknown). */
static __always_inline int tc_too_big6(struct __sk_buff *skb, const struct pkt6 *pkt, __u32 mtu)
{
	return tc_icmp6_answer(skb, pkt, ICMPV6_PKT_TOOBIG, 0, bpf_htonl(mtu ? mtu : 1280),
			       STAT_TOO_BIG_SENT);
}

#endif /* EBPFLB_ANSWER_H */
