/* IP fragments of translated flows. Only a datagram's first fragment carries its ports, so
 * the programs remember them (ebpflb_frag4/6, keyed by what names the datagram: source,
 * destination, protocol, identification) when they translate a first fragment, and give
 * them to each later fragment, which is then translated as the first one was (addresses
 * only: it has no L4 header; the first fragment's checksum covers the whole datagram).
 *
 * A later fragment that arrives before its first (reordered) or whose first never came
 * finds nothing: it passes untranslated and is counted (STAT_FRAG_UNKNOWN), as is every
 * later fragment of a datagram that is not ours; the datagram is lost, as with Cilium's
 * fragment tracking. kube-proxy gets reassembly from netfilter's conntrack instead. */
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

#endif /* EBPFLB_FRAG_H */
