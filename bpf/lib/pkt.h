/* Parsing an IPv4 TCP/UDP packet in an skb and rewriting its addresses and ports with
 * checksums kept right. The skb helpers (bpf_l3/l4_csum_replace) handle both complete
 * checksums and CHECKSUM_PARTIAL packets from interfaces with checksum offload. */
#ifndef EBPFLB_PKT_H
#define EBPFLB_PKT_H

#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/pkt_cls.h>
#include <linux/in.h>
#include "structs.h"

#define IP_FRAG_MASK 0x3fff /* MF flag + fragment offset, host order after ntohs */
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

/* What the programs need of one packet. Offsets are from the start of the skb data. */
struct pkt4 {
	struct flow4 flow; /* addresses and ports as on the wire */
	__u32 l3_off;      /* IPv4 header */
	__u32 l4_off;      /* TCP/UDP header */
	__u32 len;         /* skb length, for byte counters */
	__u8 tcp_flags;    /* TCP_FLAG_*; 0 for UDP */
	__u8 fragment;     /* 1: a fragment, ports unknown (or not the first) */
};

/* 0: an IPv4 TCP/UDP packet parsed into *pkt; -1: anything else (passed untouched).
 * Takes the packet bounds rather than a context so tc (skb) and xdp share it. */
static __always_inline int pkt4_parse(void *data, void *data_end, __u32 len, struct pkt4 *pkt)
{
	struct ethhdr *eth = data;
	struct iphdr *ip;
	__u32 ihl;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->version != 4)
		return -1;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return -1;
	ihl = ip->ihl * 4;
	if (ihl < sizeof(*ip))
		return -1;
	pkt->flow.saddr = ip->saddr;
	pkt->flow.daddr = ip->daddr;
	pkt->flow.proto = ip->protocol;
	pkt->l3_off = sizeof(*eth);
	pkt->l4_off = sizeof(*eth) + ihl;
	pkt->len = len;
	pkt->tcp_flags = 0;
	pkt->fragment = (bpf_ntohs(ip->frag_off) & IP_FRAG_MASK) != 0;
	if (pkt->fragment)
		return 0;
	if (ip->protocol == IPPROTO_TCP) {
		struct tcphdr *tcp = data + pkt->l4_off;

		if ((void *)(tcp + 1) > data_end)
			return -1;
		pkt->flow.sport = tcp->source;
		pkt->flow.dport = tcp->dest;
		pkt->tcp_flags = ((__u8 *)tcp)[13];
	} else {
		struct udphdr *udp = data + pkt->l4_off;

		if ((void *)(udp + 1) > data_end)
			return -1;
		pkt->flow.sport = udp->source;
		pkt->flow.dport = udp->dest;
	}
	return 0;
}

static __always_inline __u32 pkt4_l4_csum_off(const struct pkt4 *pkt)
{
	return pkt->l4_off + (pkt->flow.proto == IPPROTO_TCP ? offsetof(struct tcphdr, check)
							     : offsetof(struct udphdr, check));
}

/* A UDP checksum of 0 means "none" and must stay 0 (BPF_F_MARK_MANGLED_0). */
static __always_inline __u64 pkt4_l4_csum_flags(const struct pkt4 *pkt)
{
	return pkt->flow.proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
}

/* Rewrite the source (is_src) or destination address and port of an skb. 0 on success. */
static __always_inline int pkt4_rewrite(struct __sk_buff *skb, const struct pkt4 *pkt,
					int is_src, __be32 addr, __be16 port)
{
	__u32 addr_off = pkt->l3_off + (is_src ? offsetof(struct iphdr, saddr)
					       : offsetof(struct iphdr, daddr));
	__u32 port_off = pkt->l4_off + (is_src ? 0 : sizeof(__be16)); /* same in TCP and UDP */
	__u32 csum_off = pkt4_l4_csum_off(pkt);
	__be32 old_addr = is_src ? pkt->flow.saddr : pkt->flow.daddr;
	__be16 old_port = is_src ? pkt->flow.sport : pkt->flow.dport;
	__u64 l4_flags = pkt4_l4_csum_flags(pkt);

	if (addr != old_addr) {
		if (bpf_l4_csum_replace(skb, csum_off, old_addr, addr,
					l4_flags | BPF_F_PSEUDO_HDR | sizeof(addr)) < 0)
			return -1;
		if (bpf_l3_csum_replace(skb, pkt->l3_off + offsetof(struct iphdr, check),
					old_addr, addr, sizeof(addr)) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, addr_off, &addr, sizeof(addr), 0) < 0)
			return -1;
	}
	if (port != old_port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, port, l4_flags | sizeof(port)) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), 0) < 0)
			return -1;
	}
	return 0;
}

#endif /* EBPFLB_PKT_H */
