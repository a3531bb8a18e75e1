"""Python mirrors of the datapath's slot hashes (bpf/lib/hash.h), bit for bit, so
`ebpflb explain` computes the slot a packet gets. The kernel test checks them against
where real packets go."""

from __future__ import annotations

from ipaddress import IPv6Address

from ebpflb.datapath.maps import Flow
from ebpflb.datapath.maps.layout import addr_to_be32, addr_to_be32x4, port_to_be16, v4, v6

MASK32 = (1 << 32) - 1
MASK64 = (1 << 64) - 1


def _rol32(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & MASK32


def jhash_3words(a: int, b: int, c: int, initval: int) -> int:
    """jhash_3words() of hash.h: lookup3's final mix."""
    a = (a + 0xDEADBEEF + initval) & MASK32
    b = (b + 0xDEADBEEF + initval) & MASK32
    c = (c + 0xDEADBEEF + initval) & MASK32
    c = ((c ^ b) - _rol32(b, 14)) & MASK32
    a = ((a ^ c) - _rol32(c, 11)) & MASK32
    b = ((b ^ a) - _rol32(a, 25)) & MASK32
    c = ((c ^ b) - _rol32(b, 16)) & MASK32
    a = ((a ^ c) - _rol32(c, 4)) & MASK32
    b = ((b ^ a) - _rol32(a, 14)) & MASK32
    c = ((c ^ b) - _rol32(b, 24)) & MASK32
    return c


def flow4_hash(flow: Flow, seed: int) -> int:
    """flow4_hash(): the NodePort slot hash of a client -> frontend packet. The C code
    hashes the fields as loaded from the packet (network byte order in a host-order
    register), which is what addr_to_be32/port_to_be16 give."""
    ports = (port_to_be16(flow.source.port) << 16) | port_to_be16(flow.destination.port)
    return jhash_3words(
        addr_to_be32(v4(flow.source.address)),
        addr_to_be32(v4(flow.destination.address)),
        ports ^ int(flow.protocol),
        seed,
    )


def flow6_hash(flow: Flow, seed: int) -> int:
    """flow6_hash(): flow4_hash for an IPv6 packet, lookup3's mix chained over the ten
    words of the tuple (each __be32 as loaded, as addr_to_be32x4 gives them)."""
    s = addr_to_be32x4(v6(flow.source.address))
    d = addr_to_be32x4(v6(flow.destination.address))
    ports = (port_to_be16(flow.source.port) << 16) | port_to_be16(flow.destination.port)
    h = jhash_3words(s[0], s[1], s[2], seed)
    h = jhash_3words(s[3], d[0], d[1], h)
    return jhash_3words(d[2], d[3], ports ^ int(flow.protocol), h)


def flow_hash(flow: Flow, seed: int) -> int:
    """The slot hash tc/XDP computes for a flow of either family."""
    return flow4_hash(flow, seed) if flow.family == 4 else flow6_hash(flow, seed)


def addr6_fold(address: IPv6Address) -> int:
    """addr6_fold(): an IPv6 source as an affinity client (aff_key.client with
    AFF_CLIENT_ADDR6), its two 64-bit halves XORed word by word."""
    a = addr_to_be32x4(address)
    return ((a[0] ^ a[2]) << 32) | (a[1] ^ a[3])


def mix64(x: int) -> int:
    """mix64(): MurmurHash3's fmix64 truncated to 32 bits (unconnected UDP's socket hash)."""
    x &= MASK64
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK64
    x ^= x >> 33
    return x & MASK32
