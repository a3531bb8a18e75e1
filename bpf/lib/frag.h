/* IP fragments of translated flows. Only a datagram's first fragment carries its ports, so
 * the programs remember them (ebpflb_frag4/6, keyed by what names the datagram: source,
 * destination, protocol, identification) when they translate a first fragment, and give
 * them to each later fragment, which is then translated as the first one was (addresses
 * only: it has no L4 header; the first fragment's checksum covers the whole datagram).
 *
 * A later fragment that arrives before its first (reordered) or whose first never came
 * finds nothing: it passes untranslated and is counted (STAT_FRAG_UNKNOWN), as is every
 * later fragment of a datagram that is not ours; the datagram is lost, as with Cilium's
 * fragment tracking. kube-proxy gets reassembly from netfilter's conntrack instead.
 *
 * An IPv4 packet (or fragment) too big for the next hop that may be fragmented (DF clear)
 * is fragmented by the stack, as a router does, where a program cannot: its destination
 * is translated at ingress and it goes on to the stack with its own source (a node
 * address, the translated source, would be dropped there as a martian); the egress
 * program gives each fragment the stack made the translated source (ebpflb_defer4). */
#ifndef EBPFLB_FRAG_H
#define EBPFLB_FRAG_H

#include "maps.h"
#include "pkt.h"
#include "stats.h"

static __always_inline void frag4_key_of(struct frag4_key *key, const struct pkt4 *pkt)
{
	key->saddr = pkt->flow.saddr;
	key->daddr = pkt->flow.daddr;
	key->id = pkt->frag_id;
	key->proto = pkt->flow.proto;
}

static __always_inline void frag6_key_of(struct frag6_key *key, const struct pkt6 *pkt)
{
	addr6_copy(key->saddr, pkt->flow.saddr);
	addr6_copy(key->daddr, pkt->flow.daddr);
	key->id = pkt->frag_id;
	key->proto = pkt->flow.proto;
}

/* A first fragment about to be translated: its ports, for the later fragments. */
static __always_inline void frag4_remember(const struct pkt4 *pkt)
{
	struct frag_ports ports = {.sport = pkt->flow.sport, .dport = pkt->flow.dport};
	struct frag4_key key = {};

	if (pkt->frag != FRAG_FIRST)
		return;
	frag4_key_of(&key, pkt);
	ebpflb_frag4.update(&key, &ports);
}

/* frag4_remember's twin. */
static __always_inline void frag6_remember(const struct pkt6 *pkt)
{
	struct frag_ports ports = {.sport = pkt->flow.sport, .dport = pkt->flow.dport};
	struct frag6_key key = {};

	if (pkt->frag != FRAG_FIRST)
		return;
	frag6_key_of(&key, pkt);
	ebpflb_frag6.update(&key, &ports);
}

/* A later fragment's ports from its first fragment; false (counted) when none is known. */
static __always_inline bool frag4_recall(struct pkt4 *pkt)
{
	struct frag4_key key = {};
	struct frag_ports *ports;

	frag4_key_of(&key, pkt);
	ports = ebpflb_frag4.lookup(&key);
	if (!ports) {
		stat_inc(STAT_FRAG_UNKNOWN);
		return false;
	}
	pkt->flow.sport = ports->sport;
	pkt->flow.dport = ports->dport;
	return true;
}

/* frag4_recall's twin. */
static __always_inline bool frag6_recall(struct pkt6 *pkt)
{
	struct frag6_key key = {};
	struct frag_ports *ports;

	frag6_key_of(&key, pkt);
	ports = ebpflb_frag6.lookup(&key);
	if (!ports) {
		stat_inc(STAT_FRAG_UNKNOWN);
		return false;
	}
	pkt->flow.sport = ports->sport;
	pkt->flow.dport = ports->dport;
	return true;
}

/* Hand a packet too big for the next hop, DF clear, to the stack to fragment: its
 * destination translated now, its source (*out's) left to the egress program. TC_ACT_OK,
 * or TC_ACT_SHOT (counted) when that cannot be arranged. */
static __always_inline int tc_fragment4(struct __sk_buff *skb, const struct pkt4 *pkt,
					const struct xlate4 *out)
{
	struct frag4_key key = {
		.saddr = pkt->flow.saddr,
		.daddr = out->daddr,
		.proto = pkt->flow.proto,
	};
	struct defer4_val val = {.saddr = out->saddr, .sport = out->sport};

	if (bpf_skb_load_bytes(skb, pkt->l3_off + offsetof(struct iphdr, id), &key.id,
			       sizeof(key.id)) < 0 ||
	    ebpflb_defer4.update(&key, &val) != 0 ||
	    pkt4_rewrite(skb, pkt, 0, out->daddr, out->dport) < 0) {
		stat_inc(STAT_MTU_EXCEEDED);
		return TC_ACT_SHOT;
	}
	stat_inc(STAT_FRAGMENTED);
	return TC_ACT_OK;
}

/* A fragment leaving whose datagram tc_fragment4 handed to the stack: given the source it
 * leaves with. True when it was one (*rc: its verdict). */
static __always_inline bool tc_fragmented4_out(struct __sk_buff *skb, const struct pkt4 *pkt,
					       int *rc)
{
	struct frag4_key key = {};
	struct defer4_val *val;

	frag4_key_of(&key, pkt);
	val = ebpflb_defer4.lookup(&key);
	if (!val)
		return false;
	*rc = pkt4_rewrite(skb, pkt, 1, val->saddr, val->sport) < 0 ? TC_ACT_SHOT : TC_ACT_OK;
	stat_inc(STAT_FRAGMENT);
	return true;
}

#endif /* EBPFLB_FRAG_H */
