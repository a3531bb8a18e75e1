/* Conntrack for NodePort/LoadBalancer/external-IP flows of both families:
 * ebpflb_ct4[client -> frontend] (ebpflb_ct6 for IPv6) remembers a flow's backend (and
 * SNAT source) from its first packet on, with a deadline that every packet pushes out by a
 * TCP-state-aware lifetime. The lifetimes and TCP state are one set of rules; each family
 * has its table (reached through a one-slot map, so the agent can swap in a larger one)
 * and its typed accessors, the IPv6 one after its IPv4 twin. The reply side of a flow is
 * lib/nat.h's. */
#ifndef EBPFLB_CONNTRACK_H
#define EBPFLB_CONNTRACK_H

#include "maps.h"
#include "pkt.h"

/* Lifetime of a flow after this packet, from what the flow has seen so far. */
static __always_inline __u64 ct_lifetime(__u8 proto, __u16 flags)
{
	if (proto != IPPROTO_TCP)
		return EBPFLB_CT_UDP_TIMEOUT * EBPFLB_NSEC_PER_SEC;
	if (flags & CT_F_CLOSING)
		return EBPFLB_CT_TCP_CLOSE_TIMEOUT * EBPFLB_NSEC_PER_SEC;
	if (flags & (CT_F_FIN_CLIENT | CT_F_FIN_BACKEND))
		return EBPFLB_CT_TCP_CLOSE_WAIT_TIMEOUT * EBPFLB_NSEC_PER_SEC;
	if (flags & CT_F_ESTABLISHED)
		return EBPFLB_CT_TCP_TIMEOUT * EBPFLB_NSEC_PER_SEC;
	return EBPFLB_CT_TCP_SYN_TIMEOUT * EBPFLB_NSEC_PER_SEC;
}

/* Fold one packet's TCP flags into the flow's state. `reply`: sent by the backend. */
static __always_inline __u16 ct_next_flags(__u16 flags, __u8 tcp_flags, int reply)
{
	if (reply)
		flags |= CT_F_REPLY_SEEN;
	else if ((flags & CT_F_REPLY_SEEN) && (tcp_flags & TCP_FLAG_ACK))
		flags |= CT_F_ESTABLISHED; /* the client acknowledged the backend's answer */
	if (tcp_flags & TCP_FLAG_FIN)
		flags |= reply ? CT_F_FIN_BACKEND : CT_F_FIN_CLIENT;
	/* A FIN of one side half-closes the flow: the other may still send (CLOSE_WAIT). */
	if ((tcp_flags & TCP_FLAG_RST) ||
	    (flags & (CT_F_FIN_CLIENT | CT_F_FIN_BACKEND)) == (CT_F_FIN_CLIENT | CT_F_FIN_BACKEND))
		flags |= CT_F_CLOSING;
	return flags;
}

/* Record one packet on a flow, given its entry's state fields (struct ct4_entry and
 * ct6_entry have the same ones); returns the flow's new deadline. */
static __always_inline __u64 ct_touch_state(__u16 *flags, __u64 *expires, __u64 *packets,
					    __u64 *bytes, __u8 proto, __u8 tcp_flags, __u32 len,
					    int reply, __u64 now)
{
	__u16 next = ct_next_flags(*flags, tcp_flags, reply);

	*flags = next;
	*expires = now + ct_lifetime(proto, next);
	if (!reply) {
		*packets += 1;
		*bytes += len;
	}
	return *expires;
}

/* Record one packet on an IPv4 flow; its new deadline. */
static __always_inline __u64 ct4_touch(struct ct4_entry *ct, const struct pkt4 *pkt, int reply,
				       __u64 now)
{
	return ct_touch_state(&ct->flags, &ct->expires, &ct->packets, &ct->bytes,
			      pkt->flow.proto, pkt->tcp_flags, pkt->len, reply, now);
}

/* ct4_touch's twin. */
static __always_inline __u64 ct6_touch(struct ct6_entry *ct, const struct pkt6 *pkt, int reply,
				       __u64 now)
{
	return ct_touch_state(&ct->flags, &ct->expires, &ct->packets, &ct->bytes,
			      pkt->flow.proto, pkt->tcp_flags, pkt->len, reply, now);
}

/* The conntrack table in use: the agent swaps in a larger one as flows fill it (maps.h). */
static __always_inline void *ct4_table(void)
{
	__u32 zero = 0;

	return ebpflb_ct4ref.lookup(&zero);
}

/* The IPv6 conntrack table in use (the agent swaps in a larger one as flows fill it). */
static __always_inline void *ct6_table(void)
{
	__u32 zero = 0;

	return ebpflb_ct6ref.lookup(&zero);
}

/* The entry of this tuple in the table in use, live or not; NULL if none. */
static __always_inline struct ct4_entry *ct4_get(const struct flow4 *flow)
{
	void *table = ct4_table();

	return table ? bpf_map_lookup_elem(table, (void *)flow) : NULL;
}

/* ct4_get's twin. */
static __always_inline struct ct6_entry *ct6_get(const struct flow6 *flow)
{
	void *table = ct6_table();

	return table ? bpf_map_lookup_elem(table, (void *)flow) : NULL;
}

/* Store a flow's entry in the table in use; non-zero on failure. */
static __always_inline int ct4_store(const struct flow4 *flow, const struct ct4_entry *ct)
{
	void *table = ct4_table();

	return table ? bpf_map_update_elem(table, (void *)flow, (void *)ct, BPF_ANY) : -1;
}

/* ct4_store's twin. */
static __always_inline int ct6_store(const struct flow6 *flow, const struct ct6_entry *ct)
{
	void *table = ct6_table();

	return table ? bpf_map_update_elem(table, (void *)flow, (void *)ct, BPF_ANY) : -1;
}

/* A live flow for this tuple, or NULL. A new TCP SYN restarts a closing or half-closed
 * flow (the client reuses its port for a new connection). */
static __always_inline struct ct4_entry *ct4_lookup(const struct flow4 *flow,
						    const struct pkt4 *pkt, __u64 now)
{
	struct ct4_entry *ct = ct4_get(flow);

	if (!ct || ct->expires < now)
		return NULL;
	if ((ct->flags & CT_MASK_ENDING) && (pkt->tcp_flags & TCP_FLAG_SYN) &&
	    !(pkt->tcp_flags & TCP_FLAG_ACK))
		return NULL;
	return ct;
}

/* ct4_lookup's twin. */
static __always_inline struct ct6_entry *ct6_lookup(const struct flow6 *flow,
						    const struct pkt6 *pkt, __u64 now)
{
	struct ct6_entry *ct = ct6_get(flow);

	if (!ct || ct->expires < now)
		return NULL;
	if ((ct->flags & CT_MASK_ENDING) && (pkt->tcp_flags & TCP_FLAG_SYN) &&
	    !(pkt->tcp_flags & TCP_FLAG_ACK))
		return NULL;
	return ct;
}

#endif /* EBPFLB_CONNTRACK_H */
