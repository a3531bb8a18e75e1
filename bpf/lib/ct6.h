/* ct.h's twin for IPv6 flows: ebpflb_ct6[client -> frontend] remembers an IPv6 flow's
 * backend (and SNAT source), reached through ebpflb_ct6ref as ebpflb_ct4 is, with the
 * lifetimes and TCP state of ct.h. */
#ifndef EBPFLB_CT6_H
#define EBPFLB_CT6_H

#include "ct.h"
#include "pkt6.h"

static __always_inline __u64 ct6_touch(struct ct6_entry *ct, const struct pkt6 *pkt, int reply,
				       __u64 now)
{
	return ct_touch_state(&ct->flags, &ct->expires, &ct->packets, &ct->bytes,
			      pkt->flow.proto, pkt->tcp_flags, pkt->len, reply, now);
}

/* The IPv6 conntrack table in use (the agent swaps in a larger one as flows fill it). */
static __always_inline void *ct6_table(void)
{
	__u32 zero = 0;

	return ebpflb_ct6ref.lookup(&zero);
}

static __always_inline struct ct6_entry *ct6_get(const struct flow6 *flow)
{
	void *table = ct6_table();

	return table ? bpf_map_lookup_elem(table, flow) : NULL;
}

static __always_inline int ct6_store(const struct flow6 *flow, const struct ct6_entry *ct)
{
	void *table = ct6_table();

	return table ? bpf_map_update_elem(table, flow, ct, BPF_ANY) : -1;
}

/* A live flow for this tuple, or NULL. A new TCP SYN restarts a closing flow. */
static __always_inline struct ct6_entry *ct6_lookup(const struct flow6 *flow,
						    const struct pkt6 *pkt, __u64 now)
{
	struct ct6_entry *ct = ct6_get(flow);

	if (!ct || ct->expires < now)
		return NULL;
	if ((ct->flags & CT_F_CLOSING) && (pkt->tcp_flags & TCP_FLAG_SYN) &&
	    !(pkt->tcp_flags & TCP_FLAG_ACK))
		return NULL;
	return ct;
}

#endif /* EBPFLB_CT6_H */
