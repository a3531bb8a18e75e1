/* Hashes that pick a Maglev slot: for NodePort flows, Bob Jenkins' lookup3 final mix over
 * the 5-tuple (IPv4 or IPv6) with a cluster-wide seed, so every node hashes a flow to the
 * same slot (a flow an upstream router moves to another node keeps its backend); for
 * unconnected UDP sockets, a mix of the socket cookie. */
#ifndef EBPFLB_HASH_H
#define EBPFLB_HASH_H

#include "structs.h"

#define __rol32(x, k) (((x) << (k)) | ((x) >> (32 - (k))))

static __always_inline __u32 jhash_3words(__u32 a, __u32 b, __u32 c, __u32 initval)
{
	a += 0xdeadbeef + initval;
	b += 0xdeadbeef + initval;
	c += 0xdeadbeef + initval;
	c ^= b; c -= __rol32(b, 14);
	a ^= c; a -= __rol32(c, 11);
	b ^= a; b -= __rol32(a, 25);
	c ^= b; c -= __rol32(b, 16);
	a ^= c; a -= __rol32(c, 4);
	b ^= a; b -= __rol32(a, 14);
	c ^= b; c -= __rol32(b, 24);
	return c;
}

/* Finalizer of MurmurHash3 (fmix64): spreads sequential socket cookies over all slots. */
static __always_inline __u32 mix64(__u64 x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return (__u32)x;
}

static __always_inline __u32 flow4_hash(const struct flow4 *flow)
{
	__u32 ports = ((__u32)flow->sport << 16) | flow->dport;

	return jhash_3words(flow->saddr, flow->daddr, ports ^ flow->proto, EBPFLB_FLOW_HASH_SEED);
}

/* flow4_hash for IPv6: lookup3's mix chained over the ten words of the tuple, seeded the
 * same way, so every node picks the same slot for a flow. */
static __always_inline __u32 flow6_hash(const struct flow6 *flow)
{
	__u32 ports = ((__u32)flow->sport << 16) | flow->dport;
	__u32 h;

	h = jhash_3words(flow->saddr[0], flow->saddr[1], flow->saddr[2], EBPFLB_FLOW_HASH_SEED);
	h = jhash_3words(flow->saddr[3], flow->daddr[0], flow->daddr[1], h);
	return jhash_3words(flow->daddr[2], flow->daddr[3], ports ^ flow->proto, h);
}

/* An IPv6 source as an affinity client (aff_key.client, AFF_CLIENT_ADDR6): the two
 * halves XORed, so the addresses of one /64 (one prefix, many interface ids) stay
 * distinct. Two clients that collide share an affinity entry, nothing more. */
static __always_inline __u64 addr6_fold(const __be32 addr[4])
{
	return ((__u64)(addr[0] ^ addr[2]) << 32) | (addr[1] ^ addr[3]);
}

#endif /* EBPFLB_HASH_H */
