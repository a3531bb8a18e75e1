"""What the C programs and the control plane must agree on, said once, in Python.

bpf/lib/consts.h, structs.h and maps.h are the C side; this package is the Python side,
one module per header (consts.py, structs.py, maps.py; defines.py for the -D flags), and
everything else in Python takes its numbers from here (``contract.X`` names them all):

- the ctypes mirror of every struct a map holds (field names, order, sizes), with the
  fields C types __be16/__be32 (network byte order; maps/layout.py converts them);
- flags and counter indexes (families of ``#define PREFIX_NAME value``), and the few
  fixed constants Python needs;
- ``MAPS``: each pinned map's name, type, key and value structs, where its max_entries
  comes from and its map flags: the loader's pin check (maps/pins.py) and KernelMapSet read it;
- ``DEFINES``: the -D flags that carry the configured sizes into the C code
  (``cflags(config)``), so a size exists once, as a Config field.

tests/unit/datapath/test_contract.py parses the headers and fails on any constant, flag, counter,
struct field or map that differs; tests/kernel/datapath/test_layout.py checks the same table against
the types BCC generates and the maps the kernel pins.
"""

from __future__ import annotations

from ebpflb.datapath.contract.consts import (
    FAMILIES,
    MAP_FLAG_NAMES,
    MAX_IFACES,
    SLOTS_PER_ELEMENT,
    SRC_RANGE6_EXACT_PREFIXLEN,
    SRC_RANGE_EXACT_PREFIXLEN,
    SRC_RANGE_ID_PREFIXLEN,
    STAT_MAX,
    SVC_NAME_LEN,
    AffClient,
    Counter,
    CtFlags,
    NatFlags,
    c_constants,
)
from ebpflb.datapath.contract.defines import (
    AFFINITY_MAX,
    CT_MAX,
    DEFINES,
    FEATURE_MACROS,
    HAVE_SET_RETVAL,
    HAVE_SK_STORAGE,
    MAX_BACKENDS,
    MAX_SERVICES,
    PIN_DIR,
    REV_SK_MAX,
    RNAT_MAX,
    SLOT_POOL_SIZE,
    SRC_RANGE_MAX,
    Define,
    cflags,
)
from ebpflb.datapath.contract.maps import (
    GROWABLE,
    INITIAL_ENTRIES,
    MAPS,
    CType,
    MapLayout,
    MapName,
    MapSpec,
)
from ebpflb.datapath.contract.structs import (
    STRUCTS,
    Addr6,
    Aff4Key,
    Aff4MatchKey,
    Aff4Val,
    Ct4Entry,
    Ct6Entry,
    Flow4,
    Flow6,
    Lb4Backend,
    Lb4RevskKey,
    Lb4RevskVal,
    Lb4SlotPair,
    Lb4SockRev,
    Lb4SvcKey,
    Lb4SvcMeta,
    Lb4SvcStats,
    Lb4SvcVal,
    Lb6Backend,
    Lb6RevskKey,
    Lb6RevskVal,
    Lb6SockRev,
    Lb6SvcKey,
    Rnat4Val,
    Rnat6Val,
    SrcRange4Key,
    SrcRange6Key,
)
from ebpflb.datapath.syscall.uapi import (
    BPF_F_INNER_MAP,
    BPF_F_MMAPABLE,
    BPF_F_NO_PREALLOC,
    MapType,
)

__all__ = [
    "AFFINITY_MAX",
    "BPF_F_INNER_MAP",
    "BPF_F_MMAPABLE",
    "BPF_F_NO_PREALLOC",
    "CT_MAX",
    "DEFINES",
    "FAMILIES",
    "FEATURE_MACROS",
    "GROWABLE",
    "HAVE_SET_RETVAL",
    "HAVE_SK_STORAGE",
    "INITIAL_ENTRIES",
    "MAPS",
    "MAP_FLAG_NAMES",
    "MAX_BACKENDS",
    "MAX_IFACES",
    "MAX_SERVICES",
    "PIN_DIR",
    "REV_SK_MAX",
    "RNAT_MAX",
    "SLOTS_PER_ELEMENT",
    "SLOT_POOL_SIZE",
    "SRC_RANGE6_EXACT_PREFIXLEN",
    "SRC_RANGE_EXACT_PREFIXLEN",
    "SRC_RANGE_ID_PREFIXLEN",
    "SRC_RANGE_MAX",
    "STAT_MAX",
    "STRUCTS",
    "SVC_NAME_LEN",
    "Addr6",
    "Aff4Key",
    "Aff4MatchKey",
    "Aff4Val",
    "AffClient",
    "CType",
    "Counter",
    "Ct4Entry",
    "Ct6Entry",
    "CtFlags",
    "Define",
    "Flow4",
    "Flow6",
    "Lb4Backend",
    "Lb4RevskKey",
    "Lb4RevskVal",
    "Lb4SlotPair",
    "Lb4SockRev",
    "Lb4SvcKey",
    "Lb4SvcMeta",
    "Lb4SvcStats",
    "Lb4SvcVal",
    "Lb6Backend",
    "Lb6RevskKey",
    "Lb6RevskVal",
    "Lb6SockRev",
    "Lb6SvcKey",
    "MapLayout",
    "MapName",
    "MapSpec",
    "MapType",
    "NatFlags",
    "Rnat4Val",
    "Rnat6Val",
    "SrcRange4Key",
    "SrcRange6Key",
    "c_constants",
    "cflags",
]
