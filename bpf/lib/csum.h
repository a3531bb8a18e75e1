/* One's-complement checksums: updates (RFC 1624) for headers rewritten in place (XDP, and
 * headers copied to the stack, where the skb checksum helpers do not reach), and folding
 * bpf_csum_diff's 32-bit sums. They work on 16-bit words as they sit in memory: the sum is
 * byte-order independent, so no conversion is needed. */
#ifndef EBPFLB_CSUM_H
#define EBPFLB_CSUM_H

#include <linux/types.h>

/* A UDP checksum that computes to 0 is sent as this: 0 on the wire means "none". */
#define CSUM_MANGLED_0 0xffff

static __always_inline __u16 csum16_add(__u16 csum, __u16 addend)
{
	__u32 res = (__u32)csum + addend;

	return (__u16)((res & 0xffff) + (res >> 16));
}

static __always_inline void csum_replace2(__u16 *sum, __u16 from, __u16 to)
{
	__u16 csum = ~*sum;

	csum = csum16_add(csum, ~from);
	csum = csum16_add(csum, to);
	*sum = ~csum;
}

static __always_inline void csum_replace4(__u16 *sum, __u32 from, __u32 to)
{
	csum_replace2(sum, (__u16)(from >> 16), (__u16)(to >> 16));
	csum_replace2(sum, (__u16)from, (__u16)to);
}

/* The checksum of data whose 32-bit one's-complement sum is `sum` (bpf_csum_diff's). */
static __always_inline __u16 csum_fold32(__s64 sum)
{
	__u32 s = (__u32)sum;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

#endif /* EBPFLB_CSUM_H */
