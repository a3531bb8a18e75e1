/* The reply side of a translated flow, both families: ebpflb_rnat4[reply tuple]
 * (ebpflb_rnat6 for IPv6) holds how to restore the client's view on the way back, and,
 * for a SNATed flow, is the reservation of its SNAT source port. An entry carries a
 * deadline refreshed with the flow's; a port is handed to another flow only after that
 * deadline passed, so a live flow's replies can never reach another client. Each IPv6
 * helper follows its IPv4 twin. */
#ifndef EBPFLB_NAT_H
#define EBPFLB_NAT_H

#include <linux/errno.h>
#include "maps.h"
#include "pkt.h"

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

/* The reply tuple of a translated IPv6 flow: what the backend sends. */
static __always_inline void rnat6_key(struct flow6 *key, const struct ct6_entry *ct,
				      const struct flow6 *orig)
{
	addr6_copy(key->saddr, ct->backend_addr);
	key->sport = ct->backend_port;
	key->proto = orig->proto;
	if (ct->flags & CT_F_SNAT) {
		addr6_copy(key->daddr, ct->nat_addr);
		key->dport = ct->nat_port;
	} else {
		addr6_copy(key->daddr, orig->saddr);
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

/* rnat4_orig's twin. */
static __always_inline void rnat6_orig(struct flow6 *orig, const struct rnat6_val *rnat,
				       __u8 proto)
{
	addr6_copy(orig->saddr, rnat->client_addr);
	addr6_copy(orig->daddr, rnat->frontend_addr);
	orig->sport = rnat->client_port;
	orig->dport = rnat->frontend_port;
	orig->proto = proto;
}

/* Whether a reply translation belongs to this client flow. */
static __always_inline int rnat4_owned_by(const struct rnat4_val *val, const struct flow4 *orig)
{
	return val->client_addr == orig->saddr && val->client_port == orig->sport &&
	       val->frontend_addr == orig->daddr && val->frontend_port == orig->dport;
}

/* rnat4_owned_by's twin. */
static __always_inline int rnat6_owned_by(const struct rnat6_val *val, const struct flow6 *orig)
{
	return addr6_equal(val->client_addr, orig->saddr) && val->client_port == orig->sport &&
	       addr6_equal(val->frontend_addr, orig->daddr) && val->frontend_port == orig->dport;
}

/* The reply translation of the client flow `orig`. */
static __always_inline void rnat4_val_of(struct rnat4_val *val, const struct flow4 *orig,
					 __u16 flags, __u64 deadline)
{
	val->client_addr = orig->saddr;
	val->frontend_addr = orig->daddr;
	val->client_port = orig->sport;
	val->frontend_port = orig->dport;
	val->flags = flags;
	val->expires = deadline;
}

/* rnat4_val_of's twin. */
static __always_inline void rnat6_val_of(struct rnat6_val *val, const struct flow6 *orig,
					 __u16 flags, __u64 deadline)
{
	addr6_copy(val->client_addr, orig->saddr);
	addr6_copy(val->frontend_addr, orig->daddr);
	val->client_port = orig->sport;
	val->frontend_port = orig->dport;
	val->flags = flags;
	val->expires = deadline;
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
	struct rnat4_val val = {};
	struct flow4 key = {
		.saddr = ct->backend_addr,
		.daddr = ct->nat_addr,
		.sport = ct->backend_port,
		.proto = orig->proto,
	};
	__u64 now = bpf_ktime_get_ns();
	__u32 i;

	rnat4_val_of(&val, orig, RNAT_F_SNAT, deadline);
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

/* snat4_reserve's twin: a SNAT source port on ct->nat_addr towards the backend, tried at
 * EBPFLB_SNAT_TRIES hash-chosen ports, the reply translation stored. */
static __always_inline enum snat_result snat6_reserve(struct ct6_entry *ct,
						      const struct flow6 *orig, __u32 hash,
						      __u64 deadline)
{
	const __u32 range = EBPFLB_SNAT_PORT_MAX - EBPFLB_SNAT_PORT_MIN + 1;
	struct rnat6_val val = {};
	struct flow6 key = {};
	__u64 now = bpf_ktime_get_ns();
	__u32 i;

	rnat6_val_of(&val, orig, RNAT_F_SNAT, deadline);
	addr6_copy(key.saddr, ct->backend_addr);
	addr6_copy(key.daddr, ct->nat_addr);
	key.sport = ct->backend_port;
	key.proto = orig->proto;
#pragma unroll
	for (i = 0; i < EBPFLB_SNAT_TRIES; i++) {
		__u16 port = EBPFLB_SNAT_PORT_MIN + (hash + i) % range;
		struct rnat6_val *held;
		int err;

		key.dport = bpf_htons(port);
		held = ebpflb_rnat6.lookup(&key);
		if (held) {
			if (!rnat6_owned_by(held, orig) && held->expires >= now)
				continue; /* a live flow's port */
			*held = val; /* ours already, or idle past its deadline: take it */
		} else {
			err = ebpflb_rnat6.insert(&key, &val);
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
	struct rnat4_val val = {};

	rnat4_val_of(&val, orig, 0, deadline);
	rnat4_key(&key, ct, orig);
	return ebpflb_rnat4.update(&key, &val);
}

/* The reply translation of an IPv6 flow without SNAT (local backend). 0: ok. */
static __always_inline int rnat6_store_local(const struct ct6_entry *ct,
					     const struct flow6 *orig, __u64 deadline)
{
	struct flow6 key = {};
	struct rnat6_val val = {};

	rnat6_val_of(&val, orig, 0, deadline);
	rnat6_key(&key, ct, orig);
	return ebpflb_rnat6.update(&key, &val);
}

#endif /* EBPFLB_NAT_H */
