/* Parsing an IPv4 TCP/UDP packet (shared by tc and XDP) and rewriting its addresses and
 * ports with checksums kept right: in an skb with the kernel's helpers (bpf_l3/l4_csum_
 * replace handle both complete checksums and CHECKSUM_PARTIAL packets from interfaces with
 * checksum offload), in an XDP buffer by stores and lib/csum.h. */
#ifndef EBPFLB_PKT_H
#define EBPFLB_PKT_H

#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/pkt_cls.h>
#include <linux/in.h>
#include "csum.h"
#include "structs.h"

#define IP_FRAG_MASK 0x3fff /* MF flag + fragment offset, host order after ntohs */
#define TCP_FLAGS_OFF 13    /* byte of the TCP header holding the flags below */
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

/* New addresses and ports for a translated packet. */
struct xlate4 {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u32 svc_id; /* frontend's service id towards a backend (counters); 0 for a reply */
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
		pkt->tcp_flags = ((__u8 *)tcp)[TCP_FLAGS_OFF];
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

/* Apply a translation to an skb. 0 on success. */
static __always_inline int pkt4_xlate_skb(struct __sk_buff *skb, const struct pkt4 *pkt,
					  const struct xlate4 *out)
{
	if (pkt4_rewrite(skb, pkt, 0, out->daddr, out->dport) < 0 ||
	    pkt4_rewrite(skb, pkt, 1, out->saddr, out->sport) < 0)
		return -1;
	return 0;
}

/* Fix an L4 checksum for new addresses and ports (each protocol's header in its branch of
 * the caller, so the verifier keeps every packet pointer's bounds). */
static __always_inline void l4_csum_update(__u16 *check, const struct iphdr *ip,
					   const __u16 *ports, const struct xlate4 *out)
{
	csum_replace4(check, ip->saddr, out->saddr);
	csum_replace4(check, ip->daddr, out->daddr);
	csum_replace2(check, ports[0], out->sport);
	csum_replace2(check, ports[1], out->dport);
}

/* Apply a translation to an XDP buffer in place; -1 if the headers are out of bounds. */
static __always_inline int pkt4_xlate_xdp(struct xdp_md *ctx, const struct xlate4 *out)
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
				udp->check = CSUM_MANGLED_0;
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

#endif /* EBPFLB_PKT_H */
