"""What the C programs and the control plane must agree on, said once, in Python.

bpf/lib/consts.h, structs.h and maps.h are the C side; this module is the Python side,
and everything else in Python takes its numbers from here:

- the ctypes mirror of every struct a map holds (field names, order, sizes), with the
  fields C types __be16/__be32 (network byte order; layout.py converts them);
- flags and counter indexes (families of ``#define PREFIX_NAME value``), and the few
  fixed constants Python needs;
- ``MAPS``: each pinned map's name, type, key and value structs, where its max_entries
  comes from and its map flags: the loader's pin check (pins.py) and KernelMapSet read it;
- ``DEFINES``: the -D flags that carry the configured sizes into the C code
  (``Config.cflags()``), so a size exists once, as a Config field.

tests/unit/test_contract.py parses the headers and fails on any constant, flag, counter,
struct field or map that differs; tests/kernel/test_layout.py checks the same table against
the types BCC generates and the maps the kernel pins.

Over 400 lines on purpose: it is one table, read top to bottom like the three headers it
mirrors; split, the contract would be scattered again.
"""

from __future__ import annotations

import ctypes as ct
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from ebpflb.model import BackendFlags, Scope, SvcFlags

if TYPE_CHECKING:
    from ebpflb.config import Config

CType: TypeAlias = "type[ct.Structure] | type[ct._SimpleCData[Any]]"

# ---- fixed constants (consts.h) ------------------------------------------------------------

SVC_NAME_LEN = 144  # EBPFLB_SVC_NAME_LEN: "namespace/name:port" + NUL in ebpflb_svcmeta
MAX_IFACES = 64  # EBPFLB_MAX_IFACES: entries of ebpflb_ifaddr4, ebpflb_ifaddr6, ebpflb_ifmtu
FRAG_MAX = 8192  # EBPFLB_FRAG_MAX: fragmented datagrams remembered (ebpflb_frag4, _frag6)
SCRATCH_SIZE = 512  # EBPFLB_SCRATCH_SIZE: bytes of ebpflb_scratch's per-CPU element
STAT_MAX = 32  # entries of ebpflb_stats: the counters below, and room for new ones
SLOTS_PER_ELEMENT = 2  # struct lb_slot_pair: two Maglev slots per 8-byte array element
# src_range4_key.prefixlen counts the service id's bits before the address prefix.
SRC_RANGE_ID_PREFIXLEN = 32
SRC_RANGE_EXACT_PREFIXLEN = SRC_RANGE_ID_PREFIXLEN + 32  # a lookup of one address
SRC_RANGE6_EXACT_PREFIXLEN = SRC_RANGE_ID_PREFIXLEN + 128  # one IPv6 address

# Map flags from uapi/linux/bpf.h that maps.h uses.
BPF_F_NO_PREALLOC = 1 << 0
BPF_F_MMAPABLE = 1 << 10
BPF_F_INNER_MAP = 1 << 12  # an inner map of any max_entries (5.10)
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


# ---- struct mirrors (structs.h) --------------------------------------------------------
# `_network_order_` names the fields C types __be16/__be32.


class Lb4SvcKey(ct.Structure):
    """struct lb4_svc_key"""

    _fields_ = [
        ("addr", ct.c_uint32),
        ("port", ct.c_uint16),
        ("proto", ct.c_uint8),
        ("scope", ct.c_uint8),
    ]
    _network_order_ = ("addr", "port")


class LbSvcVal(ct.Structure):
    """struct lb_svc_val"""

    _fields_ = [
        ("svc_id", ct.c_uint32),
        ("table_off", ct.c_uint32),
        ("table_size", ct.c_uint32),
        ("backend_count", ct.c_uint16),
        ("flags", ct.c_uint16),
    ]
    _network_order_ = ()


class LbSlotPair(ct.Structure):
    """struct lb_slot_pair"""

    _fields_ = [("backend_id", ct.c_uint32 * SLOTS_PER_ELEMENT)]
    _network_order_ = ()


class Lb4Backend(ct.Structure):
    """struct lb4_backend"""

    _fields_ = [
        ("addr", ct.c_uint32),
        ("port", ct.c_uint16),
        ("proto", ct.c_uint8),
        ("flags", ct.c_uint8),
    ]
    _network_order_ = ("addr", "port")


class Lb6SvcKey(ct.Structure):
    """struct lb6_svc_key"""

    _fields_ = [
        ("addr", ct.c_uint32 * 4),
        ("port", ct.c_uint16),
        ("proto", ct.c_uint8),
        ("scope", ct.c_uint8),
    ]
    _network_order_ = ("addr", "port")


class Lb6Backend(ct.Structure):
    """struct lb6_backend"""

    _fields_ = [
        ("addr", ct.c_uint32 * 4),
        ("port", ct.c_uint16),
        ("proto", ct.c_uint8),
        ("flags", ct.c_uint8),
    ]
    _network_order_ = ("addr", "port")


class Lb6RevskKey(ct.Structure):
    """struct lb6_revsk_key"""

    _fields_ = [
        ("cookie", ct.c_uint64),
        ("addr", ct.c_uint32 * 4),
        ("port", ct.c_uint16),
        ("pad", ct.c_uint16 * 3),
    ]
    _network_order_ = ("addr", "port")


class Lb6RevskVal(ct.Structure):
    """struct lb6_revsk_val"""

    _fields_ = [
        ("addr", ct.c_uint32 * 4),
        ("port", ct.c_uint16),
        ("pad", ct.c_uint16),
    ]
    _network_order_ = ("addr", "port")


class LbSvcMeta(ct.Structure):
    """struct lb_svc_meta"""

    _fields_ = [("name", ct.c_char * SVC_NAME_LEN)]
    _network_order_ = ()


class Lb4RevskKey(ct.Structure):
    """struct lb4_revsk_key"""

    _fields_ = [
        ("cookie", ct.c_uint64),
        ("addr", ct.c_uint32),
        ("port", ct.c_uint16),
        ("pad", ct.c_uint16),
    ]
    _network_order_ = ("addr", "port")


class Lb4RevskVal(ct.Structure):
    """struct lb4_revsk_val"""

    _fields_ = [
        ("addr", ct.c_uint32),
        ("port", ct.c_uint16),
        ("pad", ct.c_uint16),
    ]
    _network_order_ = ("addr", "port")


class Lb4SockRev(ct.Structure):
    """struct lb4_sock_rev (value of the socket storage ebpflb_sockrev4)"""

    _fields_ = [
        ("backend_addr", ct.c_uint32),
        ("frontend_addr", ct.c_uint32),
        ("backend_port", ct.c_uint16),
        ("frontend_port", ct.c_uint16),
    ]
    _network_order_ = ("backend_addr", "frontend_addr", "backend_port", "frontend_port")


class Lb6SockRev(ct.Structure):
    """struct lb6_sock_rev (value of the socket storage ebpflb_sockrev6)"""

    _fields_ = [
        ("backend_addr", ct.c_uint32 * 4),
        ("frontend_addr", ct.c_uint32 * 4),
        ("backend_port", ct.c_uint16),
        ("frontend_port", ct.c_uint16),
    ]
    _network_order_ = ("backend_addr", "frontend_addr", "backend_port", "frontend_port")


class Flow4(ct.Structure):
    """struct flow4"""

    _fields_ = [
        ("saddr", ct.c_uint32),
        ("daddr", ct.c_uint32),
        ("sport", ct.c_uint16),
        ("dport", ct.c_uint16),
        ("proto", ct.c_uint8),
        ("pad", ct.c_uint8 * 3),
    ]
    _network_order_ = ("saddr", "daddr", "sport", "dport")


class Ct4Entry(ct.Structure):
    """struct ct4_entry"""

    _fields_ = [
        ("backend_addr", ct.c_uint32),
        ("backend_port", ct.c_uint16),
        ("flags", ct.c_uint16),
        ("nat_addr", ct.c_uint32),
        ("nat_port", ct.c_uint16),
        ("pad", ct.c_uint16),
        ("svc_id", ct.c_uint32),
        ("backend_id", ct.c_uint32),
        ("expires", ct.c_uint64),
        ("packets", ct.c_uint64),
        ("bytes", ct.c_uint64),
    ]
    _network_order_ = ("backend_addr", "backend_port", "nat_addr", "nat_port")


class Rnat4Val(ct.Structure):
    """struct rnat4_val"""

    _fields_ = [
        ("client_addr", ct.c_uint32),
        ("frontend_addr", ct.c_uint32),
        ("client_port", ct.c_uint16),
        ("frontend_port", ct.c_uint16),
        ("flags", ct.c_uint16),
        ("pad", ct.c_uint16),
        ("expires", ct.c_uint64),
    ]
    _network_order_ = ("client_addr", "frontend_addr", "client_port", "frontend_port")


class SrcRange4Key(ct.Structure):
    """struct src_range4_key (svc_id is stored big-endian but typed __u32 in C: the LPM
    trie matches bytes in order, so the id's most significant byte must come first)"""

    _fields_ = [
        ("prefixlen", ct.c_uint32),
        ("svc_id", ct.c_uint32),
        ("addr", ct.c_uint32),
    ]
    _network_order_ = ("addr",)


class Flow6(ct.Structure):
    """struct flow6"""

    _fields_ = [
        ("saddr", ct.c_uint32 * 4),
        ("daddr", ct.c_uint32 * 4),
        ("sport", ct.c_uint16),
        ("dport", ct.c_uint16),
        ("proto", ct.c_uint8),
        ("pad", ct.c_uint8 * 3),
    ]
    _network_order_ = ("saddr", "daddr", "sport", "dport")


class Ct6Entry(ct.Structure):
    """struct ct6_entry"""

    _fields_ = [
        ("backend_addr", ct.c_uint32 * 4),
        ("nat_addr", ct.c_uint32 * 4),
        ("backend_port", ct.c_uint16),
        ("flags", ct.c_uint16),
        ("nat_port", ct.c_uint16),
        ("pad", ct.c_uint16),
        ("svc_id", ct.c_uint32),
        ("backend_id", ct.c_uint32),
        ("expires", ct.c_uint64),
        ("packets", ct.c_uint64),
        ("bytes", ct.c_uint64),
    ]
    _network_order_ = ("backend_addr", "nat_addr", "backend_port", "nat_port")


class Rnat6Val(ct.Structure):
    """struct rnat6_val"""

    _fields_ = [
        ("client_addr", ct.c_uint32 * 4),
        ("frontend_addr", ct.c_uint32 * 4),
        ("client_port", ct.c_uint16),
        ("frontend_port", ct.c_uint16),
        ("flags", ct.c_uint16),
        ("pad", ct.c_uint16),
        ("expires", ct.c_uint64),
    ]
    _network_order_ = ("client_addr", "frontend_addr", "client_port", "frontend_port")


class SrcRange6Key(ct.Structure):
    """struct src_range6_key (svc_id big-endian, as in SrcRange4Key)"""

    _fields_ = [
        ("prefixlen", ct.c_uint32),
        ("svc_id", ct.c_uint32),
        ("addr", ct.c_uint32 * 4),
    ]
    _network_order_ = ("addr",)


class Addr6(ct.Structure):
    """struct addr6 (value of ebpflb_ifaddr6)"""

    _fields_ = [("addr", ct.c_uint32 * 4)]
    _network_order_ = ("addr",)


class Frag4Key(ct.Structure):
    """struct frag4_key"""

    _fields_ = [
        ("saddr", ct.c_uint32),
        ("daddr", ct.c_uint32),
        ("id", ct.c_uint16),
        ("proto", ct.c_uint8),
        ("pad", ct.c_uint8),
    ]
    _network_order_ = ("saddr", "daddr", "id")


class Frag6Key(ct.Structure):
    """struct frag6_key"""

    _fields_ = [
        ("saddr", ct.c_uint32 * 4),
        ("daddr", ct.c_uint32 * 4),
        ("id", ct.c_uint32),
        ("proto", ct.c_uint8),
        ("pad", ct.c_uint8 * 3),
    ]
    _network_order_ = ("saddr", "daddr", "id")


class Defer4Val(ct.Structure):
    """struct defer4_val"""

    _fields_ = [("saddr", ct.c_uint32), ("sport", ct.c_uint16), ("pad", ct.c_uint16)]
    _network_order_ = ("saddr", "sport")


class FragPorts(ct.Structure):
    """struct frag_ports"""

    _fields_ = [("sport", ct.c_uint16), ("dport", ct.c_uint16)]
    _network_order_ = ("sport", "dport")


class Scratch(ct.Structure):
    """struct scratch"""

    _fields_ = [("bytes", ct.c_uint8 * SCRATCH_SIZE)]
    _network_order_ = ()


class LbSvcStats(ct.Structure):
    """struct lb_svc_stats (one CPU's counters of one frontend)"""

    _fields_ = [
        ("sock_xlated", ct.c_uint64),
        ("refused", ct.c_uint64),
        ("np_flows", ct.c_uint64),
        ("np_packets", ct.c_uint64),
        ("np_bytes", ct.c_uint64),
    ]
    _network_order_ = ()


class AffKey(ct.Structure):
    """struct aff_key (client: a netns cookie, or an IPv4 address in network order in
    its first four bytes; the control plane never writes it)"""

    _fields_ = [
        ("client", ct.c_uint64),
        ("svc_id", ct.c_uint32),
        ("netns", ct.c_uint8),
        ("pad", ct.c_uint8 * 3),
    ]
    _network_order_ = ()


class AffVal(ct.Structure):
    """struct aff_val"""

    _fields_ = [
        ("last_used", ct.c_uint64),
        ("backend_id", ct.c_uint32),
        ("pad", ct.c_uint32),
    ]
    _network_order_ = ()


class AffMatchKey(ct.Structure):
    """struct aff_match_key"""

    _fields_ = [
        ("svc_id", ct.c_uint32),
        ("backend_id", ct.c_uint32),
    ]
    _network_order_ = ()


STRUCTS: dict[str, type[ct.Structure]] = {
    "lb4_svc_key": Lb4SvcKey,
    "lb_svc_val": LbSvcVal,
    "lb_slot_pair": LbSlotPair,
    "lb4_backend": Lb4Backend,
    "lb_svc_meta": LbSvcMeta,
    "lb6_svc_key": Lb6SvcKey,
    "lb6_backend": Lb6Backend,
    "lb6_revsk_key": Lb6RevskKey,
    "lb6_revsk_val": Lb6RevskVal,
    "lb6_sock_rev": Lb6SockRev,
    "lb4_revsk_key": Lb4RevskKey,
    "lb4_revsk_val": Lb4RevskVal,
    "lb4_sock_rev": Lb4SockRev,
    "flow4": Flow4,
    "ct4_entry": Ct4Entry,
    "rnat4_val": Rnat4Val,
    "src_range4_key": SrcRange4Key,
    "flow6": Flow6,
    "ct6_entry": Ct6Entry,
    "rnat6_val": Rnat6Val,
    "src_range6_key": SrcRange6Key,
    "addr6": Addr6,
    "frag4_key": Frag4Key,
    "frag6_key": Frag6Key,
    "frag_ports": FragPorts,
    "defer4_val": Defer4Val,
    "scratch": Scratch,
    "lb_svc_stats": LbSvcStats,
    "aff_key": AffKey,
    "aff_val": AffVal,
    "aff_match_key": AffMatchKey,
}


# ---- sizes passed as -D flags (consts.h #ifndef defaults) --------------------------------


@dataclass(frozen=True, slots=True)
class Define:
    """One -D flag: a consts.h macro and the configuration value that sets it."""

    macro: str
    value: Callable[[Config], int | str]
    literal: str = "{}"  # how the value is spelled in C

    def flag(self, config: Config) -> str:
        return f"-D{self.macro}={self.literal.format(self.value(config))}"


PIN_DIR = Define("EBPFLB_PIN_DIR", lambda c: str(c.bpffs_dir), '"{}"')
MAX_SERVICES = Define("EBPFLB_MAX_SERVICES", lambda c: c.max_services)
MAX_BACKENDS = Define("EBPFLB_MAX_BACKENDS", lambda c: c.max_backends)
SLOT_POOL_SIZE = Define("EBPFLB_SLOT_POOL_SIZE", lambda c: c.slot_pool_size)
REV_SK_MAX = Define("EBPFLB_REV_SK_MAX", lambda c: c.rev_sk_max)
CT_MAX = Define("EBPFLB_CT_MAX", lambda c: c.ct_max)
RNAT_MAX = Define("EBPFLB_RNAT_MAX", lambda c: c.rnat_max)
SRC_RANGE_MAX = Define("EBPFLB_SRC_RANGE_MAX", lambda c: c.src_range_max)
AFFINITY_MAX = Define("EBPFLB_AFFINITY_MAX", lambda c: c.affinity_max)

DEFINES: tuple[Define, ...] = (
    PIN_DIR,
    MAX_SERVICES,
    MAX_BACKENDS,
    SLOT_POOL_SIZE,
    REV_SK_MAX,
    CT_MAX,
    RNAT_MAX,
    SRC_RANGE_MAX,
    AFFINITY_MAX,
    Define("EBPFLB_SNAT_PORT_MIN", lambda c: c.snat_port_min),
    Define("EBPFLB_SNAT_PORT_MAX", lambda c: c.snat_port_max),
    Define("EBPFLB_FLOW_HASH_SEED", lambda c: c.flow_hash_seed, "{}U"),
    Define("EBPFLB_CT_TCP_TIMEOUT", lambda c: c.ct_tcp_timeout),
    Define("EBPFLB_CT_TCP_SYN_TIMEOUT", lambda c: c.ct_tcp_syn_timeout),
    Define("EBPFLB_CT_TCP_CLOSE_TIMEOUT", lambda c: c.ct_tcp_close_timeout),
    Define("EBPFLB_CT_UDP_TIMEOUT", lambda c: c.ct_udp_timeout),
)
# Set from the kernel feature probe (loader.Features), not from the configuration.
HAVE_SET_RETVAL = "EBPFLB_HAVE_SET_RETVAL"
HAVE_SK_STORAGE = "EBPFLB_HAVE_SK_STORAGE"
FEATURE_MACROS = (HAVE_SET_RETVAL, HAVE_SK_STORAGE)


def cflags(config: Config) -> list[str]:
    """The -D flags that size the maps and place the pins."""
    return [define.flag(config) for define in DEFINES]


# ---- the maps (maps.h) ------------------------------------------------------------------


class MapName(enum.StrEnum):
    """Pinned map names; also the file names under the bpffs directory."""

    SERVICES = "ebpflb_svc4"
    BACKENDS = "ebpflb_be4"
    SLOTS = "ebpflb_slots"
    SLOTS_REF = "ebpflb_slotref"
    SERVICE_META = "ebpflb_svcmeta"
    REVERSE_SOCK = "ebpflb_revsk4"
    SOCK_STORAGE = "ebpflb_sockrev4"
    STATS = "ebpflb_stats"
    CONNTRACK = "ebpflb_ct4"
    CONNTRACK_REF = "ebpflb_ct4ref"
    REPLY_NAT = "ebpflb_rnat4"
    SOURCE_RANGES = "ebpflb_srcrng4"
    IFACE_ADDRS = "ebpflb_ifaddr4"
    SERVICE_STATS = "ebpflb_svcstats"
    AFFINITY = "ebpflb_aff4"
    AFFINITY_MATCH = "ebpflb_affpair4"
    SERVICES6 = "ebpflb_svc6"
    BACKENDS6 = "ebpflb_be6"
    REVERSE_SOCK6 = "ebpflb_revsk6"
    SOCK_STORAGE6 = "ebpflb_sockrev6"
    CONNTRACK6 = "ebpflb_ct6"
    CONNTRACK6_REF = "ebpflb_ct6ref"
    REPLY_NAT6 = "ebpflb_rnat6"
    SOURCE_RANGES6 = "ebpflb_srcrng6"
    IFACE_ADDRS6 = "ebpflb_ifaddr6"
    IFACE_MTUS = "ebpflb_ifmtu"
    FRAGMENTS = "ebpflb_frag4"
    FRAGMENTS6 = "ebpflb_frag6"
    SCRATCH = "ebpflb_scratch"
    FRAG_DEFER = "ebpflb_defer4"


class MapType(enum.IntEnum):
    """BPF_MAP_TYPE_* (uapi/linux/bpf.h) of the maps ebpflb pins."""

    HASH = 1
    ARRAY = 2
    PERCPU_ARRAY = 6
    LRU_HASH = 9
    LPM_TRIE = 11
    ARRAY_OF_MAPS = 12
    SK_STORAGE = 24

    @property
    def c_name(self) -> str:
        """As BCC's BPF_TABLE spells it (a map-in-map adds "$" and its inner map)."""
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class MapLayout:
    """What the kernel reports of a map (BPF_OBJ_GET_INFO_BY_FD), to compare with a pin."""

    type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int


@dataclass(frozen=True, slots=True)
class MapSpec:
    name: MapName
    type: MapType
    key: CType
    value: CType
    # The -D size its max_entries follows (divided by `per_entry`, plus `extra`), or a
    # fixed number.
    size: Define | int
    per_entry: int = 1
    flags: int = 0
    extra: int = 0

    def max_entries(self, config: Config) -> int:
        if isinstance(self.size, int):
            return self.size
        return int(self.size.value(config)) // self.per_entry + self.extra

    def layout(self, config: Config) -> MapLayout:
        return MapLayout(
            int(self.type),
            ct.sizeof(self.key),
            ct.sizeof(self.value),
            self.max_entries(config),
            self.flags,
        )


MAPS: dict[MapName, MapSpec] = {
    spec.name: spec
    for spec in (
        MapSpec(
            MapName.SERVICES,
            MapType.HASH,
            Lb4SvcKey,
            LbSvcVal,
            MAX_SERVICES,
            flags=BPF_F_NO_PREALLOC,
        ),
        # Indexed by backend id, 1..max_backends (0 is never allocated).
        MapSpec(MapName.BACKENDS, MapType.ARRAY, ct.c_uint32, Lb4Backend, MAX_BACKENDS, extra=1),
        MapSpec(
            MapName.SERVICES6,
            MapType.HASH,
            Lb6SvcKey,
            LbSvcVal,
            MAX_SERVICES,
            flags=BPF_F_NO_PREALLOC,
        ),
        # Indexed by the backend ids of IPv6 backends (one id space with ebpflb_be4).
        MapSpec(MapName.BACKENDS6, MapType.ARRAY, ct.c_uint32, Lb6Backend, MAX_BACKENDS, extra=1),
        MapSpec(
            MapName.SLOTS,
            MapType.ARRAY,
            ct.c_uint32,
            LbSlotPair,
            SLOT_POOL_SIZE,
            per_entry=SLOTS_PER_ELEMENT,
            flags=BPF_F_MMAPABLE | BPF_F_INNER_MAP,
        ),
        # The slot pool the programs use (growable.py): one slot holding ebpflb_slots.
        MapSpec(MapName.SLOTS_REF, MapType.ARRAY_OF_MAPS, ct.c_uint32, ct.c_uint32, 1),
        MapSpec(
            MapName.SERVICE_META,
            MapType.HASH,
            ct.c_uint32,
            LbSvcMeta,
            MAX_SERVICES,
            flags=BPF_F_NO_PREALLOC,
        ),
        MapSpec(MapName.REVERSE_SOCK, MapType.LRU_HASH, Lb4RevskKey, Lb4RevskVal, REV_SK_MAX),
        # A quarter of ebpflb_revsk4's entries (maps.h says why).
        MapSpec(
            MapName.REVERSE_SOCK6,
            MapType.LRU_HASH,
            Lb6RevskKey,
            Lb6RevskVal,
            REV_SK_MAX,
            per_entry=4,
            extra=1,  # never 0, whatever --rev-sk-max
        ),
        # Per-socket storage: no entries of its own (max_entries 0); keyed by a socket fd.
        MapSpec(
            MapName.SOCK_STORAGE,
            MapType.SK_STORAGE,
            ct.c_int32,
            Lb4SockRev,
            0,
            flags=BPF_F_NO_PREALLOC,
        ),
        MapSpec(
            MapName.SOCK_STORAGE6,
            MapType.SK_STORAGE,
            ct.c_int32,
            Lb6SockRev,
            0,
            flags=BPF_F_NO_PREALLOC,
        ),
        MapSpec(MapName.CONNTRACK, MapType.LRU_HASH, Flow4, Ct4Entry, CT_MAX),
        # The conntrack table the programs use (growable.py): one slot holding ebpflb_ct4.
        MapSpec(MapName.CONNTRACK_REF, MapType.ARRAY_OF_MAPS, ct.c_uint32, ct.c_uint32, 1),
        MapSpec(
            MapName.REPLY_NAT, MapType.HASH, Flow4, Rnat4Val, RNAT_MAX, flags=BPF_F_NO_PREALLOC
        ),
        MapSpec(
            MapName.SOURCE_RANGES,
            MapType.LPM_TRIE,
            SrcRange4Key,
            ct.c_uint8,
            SRC_RANGE_MAX,
            flags=BPF_F_NO_PREALLOC,
        ),
        MapSpec(
            MapName.IFACE_ADDRS,
            MapType.HASH,
            ct.c_uint32,
            ct.c_uint32,
            MAX_IFACES,
            flags=BPF_F_NO_PREALLOC,
        ),
        MapSpec(MapName.CONNTRACK6, MapType.LRU_HASH, Flow6, Ct6Entry, CT_MAX),
        MapSpec(MapName.CONNTRACK6_REF, MapType.ARRAY_OF_MAPS, ct.c_uint32, ct.c_uint32, 1),
        MapSpec(
            MapName.REPLY_NAT6, MapType.HASH, Flow6, Rnat6Val, RNAT_MAX, flags=BPF_F_NO_PREALLOC
        ),
        MapSpec(
            MapName.SOURCE_RANGES6,
            MapType.LPM_TRIE,
            SrcRange6Key,
            ct.c_uint8,
            SRC_RANGE_MAX,
            flags=BPF_F_NO_PREALLOC,
        ),
        MapSpec(
            MapName.IFACE_ADDRS6,
            MapType.HASH,
            ct.c_uint32,
            Addr6,
            MAX_IFACES,
            flags=BPF_F_NO_PREALLOC,
        ),
        MapSpec(
            MapName.IFACE_MTUS,
            MapType.HASH,
            ct.c_uint32,
            ct.c_uint32,
            MAX_IFACES,
            flags=BPF_F_NO_PREALLOC,
        ),
        MapSpec(MapName.FRAGMENTS, MapType.LRU_HASH, Frag4Key, FragPorts, FRAG_MAX),
        MapSpec(MapName.FRAGMENTS6, MapType.LRU_HASH, Frag6Key, FragPorts, FRAG_MAX),
        MapSpec(MapName.FRAG_DEFER, MapType.LRU_HASH, Frag4Key, Defer4Val, FRAG_MAX),
        # The ICMP error path's per-CPU working set: one element.
        MapSpec(MapName.SCRATCH, MapType.PERCPU_ARRAY, ct.c_uint32, Scratch, 1),
        MapSpec(MapName.AFFINITY, MapType.LRU_HASH, AffKey, AffVal, AFFINITY_MAX),
        MapSpec(
            MapName.AFFINITY_MATCH,
            MapType.HASH,
            AffMatchKey,
            ct.c_uint32,
            AFFINITY_MAX,
            flags=BPF_F_NO_PREALLOC,
        ),
        MapSpec(MapName.STATS, MapType.PERCPU_ARRAY, ct.c_uint32, ct.c_uint64, STAT_MAX),
        # Indexed by service id, 1..max_services (0 is never allocated).
        MapSpec(
            MapName.SERVICE_STATS,
            MapType.PERCPU_ARRAY,
            ct.c_uint32,
            LbSvcStats,
            MAX_SERVICES,
            extra=1,
        ),
    )
}

# Growable maps (ebpflb.datapath.growable): the map -> the ref map the programs reach it
# through. Its MapSpec's max_entries is the limit it may grow to; it starts at
# INITIAL_ENTRIES (at most the limit) and doubles when full.
GROWABLE: dict[MapName, MapName] = {
    MapName.SLOTS: MapName.SLOTS_REF,
    MapName.CONNTRACK: MapName.CONNTRACK_REF,
    MapName.CONNTRACK6: MapName.CONNTRACK6_REF,
}
INITIAL_ENTRIES: dict[MapName, Callable[[Config], int]] = {
    MapName.SLOTS: lambda c: c.slot_pool_initial // SLOTS_PER_ELEMENT,
    MapName.CONNTRACK: lambda c: c.ct_initial,
    MapName.CONNTRACK6: lambda c: c.ct_initial,
}
