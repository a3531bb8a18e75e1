"""consts.h in Python: the fixed constants Python needs, and every family of flags and
counter indexes (``#define PREFIX_NAME value``) member for member."""

from __future__ import annotations

import enum

from ebpflb.datapath.syscall.uapi import BPF_F_INNER_MAP, BPF_F_MMAPABLE, BPF_F_NO_PREALLOC
from ebpflb.model import BackendFlags, Scope, SvcFlags

# ---- fixed constants (consts.h) ------------------------------------------------------------

SVC_NAME_LEN = 144  # EBPFLB_SVC_NAME_LEN: "namespace/name:port" + NUL in ebpflb_svcmeta
MAX_IFACES = 64  # EBPFLB_MAX_IFACES: entries of ebpflb_ifaddr4, ebpflb_ifaddr6, ebpflb_ifmtu
FRAG_MAX = 8192  # EBPFLB_FRAG_MAX: fragmented datagrams remembered (ebpflb_frag4, _frag6, _defer4)
SCRATCH_SIZE = 512  # EBPFLB_SCRATCH_SIZE: bytes of ebpflb_scratch's per-CPU element
STAT_MAX = 32  # entries of ebpflb_stats: the counters below, and room for new ones
SLOTS_PER_ELEMENT = 2  # struct lb_slot_pair: two Maglev slots per 8-byte array element
# src_range4_key.prefixlen counts the service id's bits before the address prefix.
SRC_RANGE_ID_PREFIXLEN = 32
SRC_RANGE_EXACT_PREFIXLEN = SRC_RANGE_ID_PREFIXLEN + 32  # a lookup of one address
SRC_RANGE6_EXACT_PREFIXLEN = SRC_RANGE_ID_PREFIXLEN + 128  # one IPv6 address

# Map flags from uapi/linux/bpf.h that maps.h uses (defined in syscall/uapi.py).
MAP_FLAG_NAMES = {
    "BPF_F_NO_PREALLOC": BPF_F_NO_PREALLOC,
    "BPF_F_MMAPABLE": BPF_F_MMAPABLE,
    "BPF_F_INNER_MAP": BPF_F_INNER_MAP,
}


# ---- flags and counters -------------------------------------------------------------------
# Scope, SvcFlags and BackendFlags live in ebpflb.model: every layer uses them.


class CtFlags(enum.IntFlag):
    """CT_F_*: ct4_entry.flags."""

    NONE = 0
    SNAT = 1 << 0
    REPLY_SEEN = 1 << 1
    CLOSING = 1 << 2
    ESTABLISHED = 1 << 3
    FIN_CLIENT = 1 << 4
    FIN_BACKEND = 1 << 5


class NatFlags(enum.IntFlag):
    """RNAT_F_*: rnat4_val.flags."""

    NONE = 0
    SNAT = 1 << 0


class AffClient(enum.IntEnum):
    """AFF_CLIENT_*: aff_key.netns, what aff_key.client identifies."""

    ADDR4 = 0
    NETNS = 1
    ADDR6 = 2


class Counter(enum.IntEnum):
    """STAT_*: indexes of the per-CPU ebpflb_stats array. The lower-cased name is the
    `event` label of ebpflb_datapath_events and the key in `maps dump`'s counters."""

    CONNECT_XLATED = 0
    SENDMSG_XLATED = 1
    RECVMSG_XLATED = 2
    PEER_XLATED = 3
    NO_BACKEND = 4
    SLOT_MISS = 5
    REVSK_UPDATE_FAIL = 6
    NP_NEW_FLOW = 7
    NP_FWD = 8
    NP_REPLY = 9
    NP_NO_BACKEND = 10
    SNAT_EXHAUSTED = 11
    SRC_RANGE_DROP = 12
    CT_CREATE_FAIL = 13
    FRAGMENT = 14
    FIB_FAIL = 15
    SNAT_NO_ADDR = 16
    RNAT_STORE_FAIL = 17
    AFFINITY_HIT = 18
    NP_REJECT = 19
    NP6_EXT_HEADER = 20
    MTU_EXCEEDED = 21
    ICMP_XLATED = 22
    TOO_BIG_SENT = 23
    FRAG_UNKNOWN = 24
    FRAGMENTED = 25

    @property
    def label(self) -> str:
        return self.name.lower()


# C prefix -> the Python enum holding that family, member for member.
FAMILIES: tuple[tuple[str, type[enum.IntEnum] | type[enum.IntFlag]], ...] = (
    ("LB_SCOPE_", Scope),
    ("SVC_F_", SvcFlags),
    ("BE_F_", BackendFlags),
    ("CT_F_", CtFlags),
    ("RNAT_F_", NatFlags),
    ("AFF_CLIENT_", AffClient),
    ("STAT_", Counter),
)


def c_constants() -> dict[str, int]:
    """Every consts.h macro Python mirrors, by its C name (what the contract test compares)."""
    found = {
        "EBPFLB_SVC_NAME_LEN": SVC_NAME_LEN,
        "EBPFLB_MAX_IFACES": MAX_IFACES,
        "EBPFLB_FRAG_MAX": FRAG_MAX,
        "EBPFLB_SCRATCH_SIZE": SCRATCH_SIZE,
        "STAT_MAX": STAT_MAX,
        "SRC_RANGE_ID_PREFIXLEN": SRC_RANGE_ID_PREFIXLEN,
        "SRC_RANGE_EXACT_PREFIXLEN": SRC_RANGE_EXACT_PREFIXLEN,
        "SRC_RANGE6_EXACT_PREFIXLEN": SRC_RANGE6_EXACT_PREFIXLEN,
    }
    for prefix, family in FAMILIES:
        for name, member in family.__members__.items():
            if isinstance(member, enum.IntFlag) and not member:
                continue  # NONE: Python's empty set, no C macro
            found[prefix + name] = int(member)
    return found
