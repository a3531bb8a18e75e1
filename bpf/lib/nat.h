/* The reply side of a translated flow: ebpflb_rnat4[reply tuple] holds how to restore the
 * client's view on the way back, and, for a SNATed flow, is the reservation of its SNAT
 * source port. An entry carries a deadline refreshed with the flow's; a port is handed to
 * another flow only after that deadline passed, so a live flow's replies can never reach
 * another client. */
#ifndef EBPFLB_NAT_H
#define EBPFLB_NAT_H

#include <linux/errno.h>
#include "maps.h"

enum snat_result {
	SNAT_OK,       /* port reserved, reply translation stored */
	SNAT_NO_PORT,  /* every port tried is held by a live flow */
	SNAT_MAP_FULL, /* ebpflb_rnat4 has no room for the reservation */
};

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

/* The client's flow that a reply translation belongs to. */
static __always_inline void rnat4_orig(struct flow4 *orig, const struct rnat4_val *rnat, __u8 proto)
{
	orig->saddr = rnat->client_addr;
	orig->daddr = rnat->frontend_addr;
	orig->sport = rnat->client_port;
	orig->dport = rnat->frontend_port;
	orig->proto = proto;
}

static __always_inline int rnat4_owned_by(const struct rnat4_val *val, const struct flow4 *orig)
{
	return val->client_addr == orig->saddr && val->client_port == orig->sport &&
	       val->frontend_addr == orig->daddr && val->frontend_port == orig->dport;
}

/* Reserve an SNAT source port on nat_addr towards the backend in *ct and store the reply
 * translation. Ports already held by this same client flow are reused (a flow whose ct
 * entry was evicted finds its port again at the first, hash-chosen, probe). A full map
 * ends the search: tracking it across probes would double the verifier's work. */
static __always_inline enum snat_result snat4_reserve(struct ct4_entry *ct,
						      const struct flow4 *orig, __u32 hash,
						      __u64 deadline)
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
		int err;

		key.dport = bpf_htons(port);
		held = ebpflb_rnat4.lookup(&key);
		if (held) {
			if (!rnat4_owned_by(held, orig) && held->expires >= now)
				continue; /* a live flow's port */
			*held = val; /* ours already, or idle past its deadline: take it */
		} else {
			err = ebpflb_rnat4.insert(&key, &val);
			if (err == -E2BIG)
				return SNAT_MAP_FULL;
			if (err)
				continue; /* another CPU took it meanwhile */
		}
		ct->nat_port = key.dport;
		return SNAT_OK;
	}
	return SNAT_NO_PORT;
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

#endif /* EBPFLB_NAT_H */
