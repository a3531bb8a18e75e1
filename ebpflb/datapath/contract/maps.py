"""maps.h in Python: ``MAPS``, each pinned map's name, type, key and value structs, where
its max_entries comes from and its map flags (the loader's pin check, maps/pins.py, and
KernelMapSet read it), and which maps grow."""

from __future__ import annotations

import ctypes as ct
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from ebpflb.config import Config
from ebpflb.datapath.contract.consts import FRAG_MAX, MAX_IFACES, SLOTS_PER_ELEMENT, STAT_MAX
from ebpflb.datapath.contract.defines import (
    AFFINITY_MAX,
    CT_MAX,
    MAX_BACKENDS,
    MAX_SERVICES,
    REV_SK_MAX,
    RNAT_MAX,
    SLOT_POOL_SIZE,
    SRC_RANGE_MAX,
    Define,
)
from ebpflb.datapath.contract.structs import (
    Addr6,
    AffKey,
    AffMatchKey,
    AffVal,
    Ct4Entry,
    Ct6Entry,
    Defer4Val,
    Flow4,
    Flow6,
    Frag4Key,
    Frag6Key,
    FragPorts,
    Lb4Backend,
    Lb4RevskKey,
    Lb4RevskVal,
    Lb4SockRev,
    Lb4SvcKey,
    Lb6Backend,
    Lb6RevskKey,
    Lb6RevskVal,
    Lb6SockRev,
    Lb6SvcKey,
    LbSlotPair,
    LbSvcMeta,
    LbSvcStats,
    LbSvcVal,
    Rnat4Val,
    Rnat6Val,
    Scratch,
    SrcRange4Key,
    SrcRange6Key,
)
from ebpflb.datapath.syscall.uapi import (
    BPF_F_INNER_MAP,
    BPF_F_MMAPABLE,
    BPF_F_NO_PREALLOC,
    MapType,
)

CType: TypeAlias = "type[ct.Structure] | type[ct._SimpleCData[Any]]"

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
    FRAG_DEFER = "ebpflb_defer4"
    SCRATCH = "ebpflb_scratch"


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

# Growable maps (ebpflb.datapath.maps.growable): the map -> the ref map the programs reach it
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
