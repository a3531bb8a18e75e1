/* One TCP/UDP packet, IPv4 or IPv6: parsing it (shared by tc and XDP) and rewriting its
 * addresses and ports with checksums kept right. In an skb with the kernel's helpers
 * (bpf_l3/l4_csum_replace handle both complete checksums and CHECKSUM_PARTIAL packets from
 * interfaces with checksum offload), in an XDP buffer by stores and lib/csum.h.
 *
 * IPv6 has no header checksum; the TCP/UDP checksum covers the addresses through the
 * pseudo-header, so an address change is one checksum difference over its 16 bytes
 * (bpf_csum_diff in tc, RFC 1624 word updates in XDP). Hop-by-hop and destination-options
 * headers are walked (at most IPV6_MAX_EXT_HEADERS); a fragment is recognised and passed
 * untranslated, as IPv4's. A routing header is not walked: its packet's final destination
 * is not the header's (nor is its checksum's), so it passes untranslated, counted.
 * Anything else (ICMP and ICMPv6 among it: neighbour discovery, errors) is not ours.
 *
 * Each family's structs and helpers sit side by side, the IPv6 one right after its IPv4
 * twin (tests/unit/datapath/test_c_twins.py checks every IPv4 helper has one, or a stated reason). */
#ifndef EBPFLB_PKT_H
#define EBPFLB_PKT_H

#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/pkt_cls.h>
#include <linux/in.h>
#include "csum.h"
#include "structs.h"

#define IP_FRAG_MASK 0x3fff   /* MF flag + fragment offset, host order after ntohs */
#define IP_OFFSET_MASK 0x1fff /* the fragment offset alone */
#ifndef IP_DF
#define IP_DF 0x4000 /* do not fragment, host order */
#endif
#define TCP_FLAGS_OFF 13    /* byte of the TCP header holding the flags below */
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

/* The headers the parsers need in an skb's linear data for the common packet: Ethernet,
 * an IP header without options or extension headers, and a TCP header (a UDP one is
 * shorter). pkt_pull_headers makes them directly readable when a sender or driver left
 * them in page fragments. */
#define PKT4_PULL_LEN (ETH_HLEN + sizeof(struct iphdr) + sizeof(struct tcphdr))
#define PKT6_PULL_LEN (ETH_HLEN + sizeof(struct ipv6hdr) + sizeof(struct tcphdr))

#define IPV6_MAX_EXT_HEADERS 4 /* extension headers walked before giving up */
#define PKT6_L4_OFF_MAX 0x1ff  /* L4 header offsets past this are not walked (XDP masks by it) */
#define NEXTHDR_HOP 0          /* hop-by-hop options */
#define NEXTHDR_ROUTING 43
#define NEXTHDR_FRAGMENT 44
#define NEXTHDR_DEST 60        /* destination options */
#ifndef IPPROTO_ICMPV6
#define IPPROTO_ICMPV6 58
#endif
#define IP6_OFFSET_MASK 0xfff8 /* a fragment header's offset (host order; M is bit 0) */

/* The IPv6 fragment header (RFC 8200 4.5). */
struct frag_hdr6 {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;       /* offset in 8-byte units << 3 | M flag */
	__be32 identification; /* the datagram's id, with its source and destination */
};

/* What parsing a packet found. */
enum pkt_parse {
	PKT_OK,          /* a TCP/UDP packet (or a fragment of one), parsed */
	PKT_NOT_OURS,    /* anything else: passed untouched */
	PKT_EXT_HEADERS, /* IPv6 extension headers the programs do not walk: counted, passed */
	PKT_ICMP,        /* an ICMP (ICMPv6) message, not a fragment: lib/icmp.h looks closer */
};

/* Where a packet stands in its datagram. A first fragment carries the L4 header, so its
 * ports are parsed; a later one has none: its ports are the first one's, remembered by
 * lib/frag.h under the datagram's (source, destination, protocol, identification). */
enum pkt_frag {
	FRAG_NONE,  /* a whole datagram */
	FRAG_FIRST, /* offset 0, more fragments follow: ports parsed */
	FRAG_LATER, /* offset > 0: no L4 header, ports unknown until recalled */
};

/* What the programs need of one packet. Offsets are from the start of the skb data. */
struct pkt4 {
	struct flow4 flow; /* addresses and ports as on the wire (a later fragment's: recalled) */
	__u32 l3_off;      /* IPv4 header */
	__u32 l4_off;      /* TCP/UDP (or ICMP) header; a later fragment: its payload */
	__u32 len;         /* skb length, for byte counters */
	__u8 tcp_flags;    /* TCP_FLAG_*; 0 for UDP */
	__u8 frag;         /* enum pkt_frag */
	__be16 frag_id;    /* IPv4 identification, when a fragment */
};

/* New addresses and ports for a translated packet. */
struct xlate4 {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u32 svc_id; /* frontend's service id towards a backend (counters); 0 for a reply */
};

/* struct pkt4's twin for IPv6. */
struct pkt6 {
	struct flow6 flow; /* addresses and ports as on the wire (a later fragment's: recalled) */
	__u32 l3_off;      /* IPv6 header */
	__u32 l4_off;      /* TCP/UDP (or ICMPv6) header, after any extension headers */
	__u32 len;         /* packet length, for byte counters */
	__u8 tcp_flags;    /* TCP_FLAG_*; 0 for UDP */
	__u8 frag;         /* enum pkt_frag */
	__be32 frag_id;    /* the fragment header's identification, when a fragment */
};

/* struct xlate4's twin: new addresses and ports of a translated packet. */
struct xlate6 {
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u32 svc_id; /* frontend's service id towards a backend (counters); 0 for a reply */
};

static __always_inline bool addr6_equal(const __be32 a[4], const __be32 b[4])
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

static __always_inline void addr6_copy(__be32 dst[4], const __be32 src[4])
{
	dst[0] = src[0];
	dst[1] = src[1];
	dst[2] = src[2];
	dst[3] = src[3];
}

/* The ports (and TCP flags) of the TCP/UDP header at `l4`; false when it is cut short. */
static __always_inline bool l4_ports_parse(void *l4, void *data_end, __u8 proto, __be16 *sport,
					   __be16 *dport, __u8 *tcp_flags)
{
	if (proto == IPPROTO_TCP) {
		struct tcphdr *tcp = l4;

		if ((void *)(tcp + 1) > data_end)
			return false;
		*sport = tcp->source;
		*dport = tcp->dest;
		*tcp_flags = ((__u8 *)tcp)[TCP_FLAGS_OFF];
		return true;
	}
	struct udphdr *udp = l4;

	if ((void *)(udp + 1) > data_end)
		return false;
	*sport = udp->source;
	*dport = udp->dest;
	return true;
}

/* An skb's first `want` bytes (all of a shorter one) made directly readable. A frame
 * whose headers sit in page fragments (an AF_PACKET TX_RING sender, a NIC that splits
 * headers) shows only its Ethernet header to direct access: parsed as it is, it would
 * pass untranslated. Pulled only when short: a GRO aggregate's headers are already
 * linear, and pulling a cloned skb copies its head. Invalidates packet pointers; `want`
 * is one of the *_PULL_LEN constants. */
static __always_inline void pkt_pull_headers(struct __sk_buff *skb, const __u32 want)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	/* Opaque to the compiler: every program is one inlined function, and it would fold this
	 * check and the parsers' into arithmetic on data_end, which the verifier refuses. */
	asm volatile("" : "+r"(data_end));
	if (data + want <= data_end)
		return;
	bpf_skb_pull_data(skb, skb->len < want ? skb->len : want);
}

/* An IPv4 TCP/UDP packet or fragment parsed into *pkt (PKT_OK), an ICMP message
 * (PKT_ICMP: addresses and l4_off set), or PKT_NOT_OURS. Takes the packet bounds rather
 * than a context so tc (skb) and xdp share it. */
static __always_inline enum pkt_parse pkt4_parse(void *data, void *data_end, __u32 len,
						 struct pkt4 *pkt)
{
	struct ethhdr *eth = data;
	struct iphdr *ip;
	__u16 frag_off;
	__u32 ihl;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return PKT_NOT_OURS;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->version != 4)
		return PKT_NOT_OURS;
	ihl = ip->ihl * 4;
	if (ihl < sizeof(*ip))
		return PKT_NOT_OURS;
	frag_off = bpf_ntohs(ip->frag_off) & IP_FRAG_MASK;
	if (ip->protocol == IPPROTO_ICMP && !frag_off) {
		pkt->flow.saddr = ip->saddr;
		pkt->flow.daddr = ip->daddr;
		pkt->flow.proto = IPPROTO_ICMP;
		pkt->l3_off = sizeof(*eth);
		pkt->l4_off = sizeof(*eth) + ihl;
		pkt->len = len;
		return PKT_ICMP;
	}
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return PKT_NOT_OURS;
	pkt->flow.saddr = ip->saddr;
	pkt->flow.daddr = ip->daddr;
	pkt->flow.proto = ip->protocol;
	pkt->l3_off = sizeof(*eth);
	pkt->l4_off = sizeof(*eth) + ihl;
	pkt->len = len;
	pkt->tcp_flags = 0;
	pkt->frag = FRAG_NONE;
	if (frag_off) {
		pkt->frag_id = ip->id;
		if (frag_off & IP_OFFSET_MASK) {
			pkt->frag = FRAG_LATER;
			return PKT_OK;
		}
		pkt->frag = FRAG_FIRST;
	}
	if (!l4_ports_parse(data + pkt->l4_off, data_end, pkt->flow.proto, &pkt->flow.sport,
			    &pkt->flow.dport, &pkt->tcp_flags))
		return PKT_NOT_OURS;
	return PKT_OK;
}

/* pkt4_parse's twin: PKT_EXT_HEADERS for extension headers the programs do not walk (a
 * routing header, more than IPV6_MAX_EXT_HEADERS, or longer ones than PKT6_L4_OFF_MAX
 * allows). A fragment header is the last header walked: a first fragment's L4 header
 * follows it. */
static __always_inline enum pkt_parse pkt6_parse(void *data, void *data_end, __u32 len,
						 struct pkt6 *pkt)
{
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6;
	__u32 off, i;
	__u8 next;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IPV6))
		return PKT_NOT_OURS;
	ip6 = (void *)(eth + 1);
	if ((void *)(ip6 + 1) > data_end || ip6->version != 6)
		return PKT_NOT_OURS;
	addr6_copy(pkt->flow.saddr, ip6->saddr.in6_u.u6_addr32);
	addr6_copy(pkt->flow.daddr, ip6->daddr.in6_u.u6_addr32);
	pkt->l3_off = sizeof(*eth);
	pkt->len = len;
	pkt->tcp_flags = 0;
	pkt->frag = FRAG_NONE;
	next = ip6->nexthdr;
	off = sizeof(*eth) + sizeof(*ip6);
#pragma unroll
	for (i = 0; i < IPV6_MAX_EXT_HEADERS; i++) {
		__u8 *ext = data + off;

		if (next != NEXTHDR_HOP && next != NEXTHDR_DEST)
			break;
		if ((void *)(ext + 2) > data_end)
			return PKT_NOT_OURS;
		next = ext[0];
		off += ((__u32)ext[1] + 1) * 8; /* hdr ext len: 8-byte units after the first 8 */
	}
	if (next == NEXTHDR_HOP || next == NEXTHDR_ROUTING || next == NEXTHDR_DEST ||
	    off > PKT6_L4_OFF_MAX)
		return PKT_EXT_HEADERS;
	if (next == NEXTHDR_FRAGMENT) {
		struct frag_hdr6 *frag = data + off;

		if ((void *)(frag + 1) > data_end)
			return PKT_NOT_OURS;
		next = frag->nexthdr;
		pkt->frag_id = frag->identification;
		off += sizeof(*frag);
		pkt->frag = bpf_ntohs(frag->frag_off) & IP6_OFFSET_MASK ? FRAG_LATER : FRAG_FIRST;
	}
	if (next == IPPROTO_ICMPV6 && pkt->frag == FRAG_NONE) {
		pkt->flow.proto = IPPROTO_ICMPV6;
		pkt->l4_off = off;
		return PKT_ICMP;
	}
	if (next != IPPROTO_TCP && next != IPPROTO_UDP)
		return PKT_NOT_OURS;
	pkt->flow.proto = next;
	pkt->l4_off = off;
	if (pkt->frag == FRAG_LATER)
		return PKT_OK;
	if (!l4_ports_parse(data + (off & PKT6_L4_OFF_MAX), data_end, next, &pkt->flow.sport,
			    &pkt->flow.dport, &pkt->tcp_flags))
		return PKT_NOT_OURS;
	return PKT_OK;
}

static __always_inline __u32 pkt4_l4_csum_off(const struct pkt4 *pkt)
{
	return pkt->l4_off + (pkt->flow.proto == IPPROTO_TCP ? offsetof(struct tcphdr, check)
							     : offsetof(struct udphdr, check));
}

static __always_inline __u32 pkt6_l4_csum_off(const struct pkt6 *pkt)
{
	return pkt->l4_off + (pkt->flow.proto == IPPROTO_TCP ? offsetof(struct tcphdr, check)
							     : offsetof(struct udphdr, check));
}

/* A UDP checksum of 0 means "none" and must stay 0 (BPF_F_MARK_MANGLED_0). */
static __always_inline __u64 pkt4_l4_csum_flags(const struct pkt4 *pkt)
{
	return pkt->flow.proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
}

/* pkt4_l4_csum_flags' twin (a zero UDP checksum is not allowed over IPv6, but a sender
 * that put one there still gets it back unchanged). */
static __always_inline __u64 pkt6_l4_csum_flags(const struct pkt6 *pkt)
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

	/* A later fragment has no L4 header: the first fragment's checksum covers the whole
	 * datagram and takes the address change. */
	bool has_l4 = pkt->frag != FRAG_LATER;

	if (addr != old_addr) {
		if (has_l4 && bpf_l4_csum_replace(skb, csum_off, old_addr, addr,
						  l4_flags | BPF_F_PSEUDO_HDR | sizeof(addr)) < 0)
			return -1;
		if (bpf_l3_csum_replace(skb, pkt->l3_off + offsetof(struct iphdr, check),
					old_addr, addr, sizeof(addr)) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, addr_off, &addr, sizeof(addr), 0) < 0)
			return -1;
	}
	if (has_l4 && port != old_port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, port, l4_flags | sizeof(port)) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), 0) < 0)
			return -1;
	}
	return 0;
}

/* Rewrite the source (is_src) or destination address and port of an skb. 0 on success. */
static __always_inline int pkt6_rewrite(struct __sk_buff *skb, const struct pkt6 *pkt,
					int is_src, const __be32 addr[4], __be16 port)
{
	__u32 addr_off = pkt->l3_off + (is_src ? offsetof(struct ipv6hdr, saddr)
					       : offsetof(struct ipv6hdr, daddr));
	__u32 port_off = pkt->l4_off + (is_src ? 0 : sizeof(__be16)); /* same in TCP and UDP */
	__u32 csum_off = pkt6_l4_csum_off(pkt);
	const __be32 *old_addr = is_src ? pkt->flow.saddr : pkt->flow.daddr;
	__be16 old_port = is_src ? pkt->flow.sport : pkt->flow.dport;
	__u64 l4_flags = pkt6_l4_csum_flags(pkt);
	__u32 diff;

	/* Both addresses are on the stack already (struct pkt6, struct xlate6): the helpers
	 * read them there (casts: BCC's prototypes take non-const pointers). */
	bool has_l4 = pkt->frag != FRAG_LATER; /* see pkt4_rewrite */

	if (!addr6_equal(addr, old_addr)) {
		/* A 32-bit sum, unfolded before Linux 6.12 on x86, which BCC's `int` return type
		 * shows as negative from 2^31 on: not an error (the helper fails only for sizes
		 * that are not multiples of 4, and these are constant). */
		diff = (__u32)bpf_csum_diff((void *)old_addr, 16, (void *)addr, 16, 0);
		/* size 0: `diff` is a checksum difference, not one old/new field */
		if (has_l4 &&
		    bpf_l4_csum_replace(skb, csum_off, 0, diff, l4_flags | BPF_F_PSEUDO_HDR) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, addr_off, (void *)addr, 16, 0) < 0)
			return -1;
	}
	if (has_l4 && port != old_port) {
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

/* Apply a translation to an skb. 0 on success. */
static __always_inline int pkt6_xlate_skb(struct __sk_buff *skb, const struct pkt6 *pkt,
					  const struct xlate6 *out)
{
	if (pkt6_rewrite(skb, pkt, 0, out->daddr, out->dport) < 0 ||
	    pkt6_rewrite(skb, pkt, 1, out->saddr, out->sport) < 0)
		return -1;
	return 0;
}

/* Fix an L4 checksum for new addresses and ports (each protocol's header in its branch of
 * the caller, so the verifier keeps every packet pointer's bounds). */
static __always_inline void l4_csum_update4(__u16 *check, const struct iphdr *ip,
					   const __u16 *ports, const struct xlate4 *out)
{
	csum_replace4(check, ip->saddr, out->saddr);
	csum_replace4(check, ip->daddr, out->daddr);
	csum_replace2(check, ports[0], out->sport);
	csum_replace2(check, ports[1], out->dport);
}

/* l4_csum_update4's twin: an L4 checksum fixed for new addresses and ports. */
static __always_inline void l4_csum_update6(__u16 *check, const struct ipv6hdr *ip6,
					    const __u16 *ports, const struct xlate6 *out)
{
	__u32 i;

#pragma unroll
	for (i = 0; i < 4; i++) {
		csum_replace4(check, ip6->saddr.in6_u.u6_addr32[i], out->saddr[i]);
		csum_replace4(check, ip6->daddr.in6_u.u6_addr32[i], out->daddr[i]);
	}
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
		l4_csum_update4(&tcp->check, ip, (__u16 *)tcp, out);
		tcp->source = out->sport;
		tcp->dest = out->dport;
	} else {
		struct udphdr *udp = (void *)ip + ihl;

		if ((void *)(udp + 1) > data_end)
			return -1;
		if (udp->check) { /* 0: no UDP checksum, keep it that way */
			l4_csum_update4(&udp->check, ip, (__u16 *)udp, out);
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

/* Apply a translation to an XDP buffer in place; -1 if the headers are out of bounds. */
static __always_inline int pkt6_xlate_xdp(struct xdp_md *ctx, const struct pkt6 *pkt,
					  const struct xlate6 *out)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
	__u32 l4_off = pkt->l4_off & PKT6_L4_OFF_MAX; /* a no-op (pkt6_parse), for the verifier */

	if ((void *)(ip6 + 1) > data_end)
		return -1;
	if (pkt->flow.proto == IPPROTO_TCP) {
		struct tcphdr *tcp = data + l4_off;

		if ((void *)(tcp + 1) > data_end)
			return -1;
		l4_csum_update6(&tcp->check, ip6, (__u16 *)tcp, out);
		tcp->source = out->sport;
		tcp->dest = out->dport;
	} else {
		struct udphdr *udp = data + l4_off;

		if ((void *)(udp + 1) > data_end)
			return -1;
		if (udp->check) { /* mandatory over IPv6; a zero one is left as the sender made it */
			l4_csum_update6(&udp->check, ip6, (__u16 *)udp, out);
			if (udp->check == 0)
				udp->check = CSUM_MANGLED_0;
		}
		udp->source = out->sport;
		udp->dest = out->dport;
	}
	addr6_copy(ip6->saddr.in6_u.u6_addr32, out->saddr);
	addr6_copy(ip6->daddr.in6_u.u6_addr32, out->daddr);
	return 0;
}

#endif /* EBPFLB_PKT_H */
