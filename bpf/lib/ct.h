/* Conntrack for NodePort/LoadBalancer/external-IP flows and the reply translations that
 * go with it, including SNAT port allocation.
 *
 * A flow is created by its first packet: ebpflb_ct4[client -> frontend] remembers the
 * backend (and SNAT source), ebpflb_rnat4[reply tuple] how to restore the client's view on
 * the way back. Both carry a deadline refreshed by every packet, with TCP-state-aware
 * lifetimes; an SNAT port (an rnat4 entry) is handed to another flow only after its
 * deadline passed, so a live flow's replies can never reach another client.
 */
#ifndef EBPFLB_CT_H
#define EBPFLB_CT_H

#include "lb.h"
#include "pkt.h"

#define EBPFLB_NSEC_PER_SEC 1000000000ULL

/* Lifetime of a flow after this packet, from what the flow has seen so far. */
static __always_inline __u64 ct_lifetime(__u8 proto, __u16 flags)
{
	if (proto != IPPROTO_TCP)
		return EBPFLB_CT_UDP_TIMEOUT * EBPFLB_NSEC_PER_SEC;
	if (flags & CT_F_CLOSING)
		return EBPFLB_CT_TCP_CLOSE_TIMEOUT * EBPFLB_NSEC_PER_SEC;
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
	if (tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST))
		flags |= CT_F_CLOSING;
	return flags;
}

/* Record one packet on a flow; returns the flow's new deadline. */
static __always_inline __u64 ct_touch(struct ct4_entry *ct, const struct pkt4 *pkt, int reply,
				      __u64 now)
{
	__u16 flags = ct_next_flags(ct->flags, pkt->tcp_flags, reply);

	ct->flags = flags;
	ct->expires = now + ct_lifetime(pkt->flow.proto, flags);
	if (!reply) {
		ct->packets += 1;
		ct->bytes += pkt->len;
	}
	return ct->expires;
}

/* A live flow for this tuple, or NULL. A new TCP SYN restarts a closing flow. */
static __always_inline struct ct4_entry *ct4_lookup(const struct flow4 *flow,
						    const struct pkt4 *pkt, __u64 now)
{
	struct ct4_entry *ct = ebpflb_ct4.lookup((struct flow4 *)flow);

	if (!ct || ct->expires < now)
		return NULL;
	if ((ct->flags & CT_F_CLOSING) && (pkt->tcp_flags & TCP_FLAG_SYN) &&
	    !(pkt->tcp_flags & TCP_FLAG_ACK))
		return NULL;
	return ct;
}

/* The reply tuple of a translated flow: what the backend sends. */
static __always_inline void rnat4_key(struct flow4 *key, const struct ct4_entry *ct,
				      const struct flow4 *orig)
{
	key->saddr = ct->backend_addr;
	key->sport = ct->backend_port;
	key->proto = orig->proto;
	if (ct->flags & CT_F_SNAT) {
		key->daddr = ct->nat_addr;
		key->dport = ct->nat_port;
	} else {
		key->daddr = orig->saddr;
		key->dport = orig->sport;
	}
}

static __always_inline int rnat4_owned_by(const struct rnat4_val *val, const struct flow4 *orig)
{
	return val->client_addr == orig->saddr && val->client_port == orig->sport &&
	       val->frontend_addr == orig->daddr && val->frontend_port == orig->dport;
}

/* Reserve an SNAT source port on nat_addr towards the backend in *ct and store the reply
 * translation. Ports already held by this same client flow are reused (a flow whose ct
 * entry was evicted finds its port again at the first, hash-chosen, probe). 0: ok;
 * -1: every probed port is held by a live flow or the map is full. */
static __always_inline int snat4_reserve(struct ct4_entry *ct, const struct flow4 *orig,
					 __u32 hash, __u64 deadline)
{
	const __u32 range = EBPFLB_SNAT_PORT_MAX - EBPFLB_SNAT_PORT_MIN + 1;
	struct rnat4_val val = {
		.client_addr = orig->saddr,
		.frontend_addr = orig->daddr,
		.client_port = orig->sport,
		.frontend_port = orig->dport,
		.flags = RNAT_F_SNAT,
		.expires = deadline,
	};
	struct flow4 key = {
		.saddr = ct->backend_addr,
		.daddr = ct->nat_addr,
		.sport = ct->backend_port,
		.proto = orig->proto,
	};
	__u64 now = bpf_ktime_get_ns();
	__u32 i;

#pragma unroll
	for (i = 0; i < EBPFLB_SNAT_TRIES; i++) {
		__u16 port = EBPFLB_SNAT_PORT_MIN + (hash + i) % range;
		struct rnat4_val *held;

		key.dport = bpf_htons(port);
		held = ebpflb_rnat4.lookup(&key);
		if (held) {
			if (!rnat4_owned_by(held, orig) && held->expires >= now)
				continue; /* a live flow's port */
			*held = val; /* ours already, or idle past its deadline: take it */
		} else if (ebpflb_rnat4.insert(&key, &val) != 0) {
			continue; /* another CPU took it meanwhile, or the map is full */
		}
		ct->nat_port = key.dport;
		return 0;
	}
	return -1;
}

/* Store the reply translation of a flow without SNAT (local backend). 0: ok. */
static __always_inline int rnat4_store_local(const struct ct4_entry *ct, const struct flow4 *orig,
					     __u64 deadline)
{
	struct flow4 key = {};
	struct rnat4_val val = {
		.client_addr = orig->saddr,
		.frontend_addr = orig->daddr,
		.client_port = orig->sport,
		.frontend_port = orig->dport,
		.expires = deadline,
	};

	rnat4_key(&key, ct, orig);
	return ebpflb_rnat4.update(&key, &val);
}

#endif /* EBPFLB_CT_H */
