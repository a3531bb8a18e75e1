"""The bpf(2) ABI values ebpflb uses (include/uapi/linux/bpf.h, stable ABI), defined here
once: commands, program, attach and map types, flags, helper ids and the two instruction
encodings Python reads or writes. bpfsys.py issues the commands; the contract, the loader,
the program store, the growable maps and the feature probe take their numbers from here.
"""

from __future__ import annotations

import enum

# enum bpf_cmd
BPF_MAP_CREATE = 0
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_PROG_LOAD = 5
BPF_OBJ_PIN = 6
BPF_OBJ_GET = 7
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_TEST_RUN = 10
BPF_PROG_GET_FD_BY_ID = 13
BPF_MAP_GET_FD_BY_ID = 14
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_QUERY = 16
BPF_BTF_LOAD = 18
BPF_MAP_LOOKUP_BATCH = 24
BPF_MAP_UPDATE_BATCH = 26
BPF_LINK_CREATE = 28

# enum bpf_prog_type
BPF_PROG_TYPE_SCHED_CLS = 3
BPF_PROG_TYPE_XDP = 6
BPF_PROG_TYPE_CGROUP_SOCK_ADDR = 18

# enum bpf_attach_type
BPF_CGROUP_INET4_CONNECT = 10
BPF_CGROUP_INET6_CONNECT = 11
BPF_CGROUP_UDP4_SENDMSG = 14
BPF_CGROUP_UDP6_SENDMSG = 15
BPF_CGROUP_UDP4_RECVMSG = 19
BPF_CGROUP_UDP6_RECVMSG = 20
BPF_CGROUP_INET4_GETPEERNAME = 29
BPF_CGROUP_INET6_GETPEERNAME = 30


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


# Map flags (BPF_MAP_CREATE's map_flags) that maps.h uses.
BPF_F_NO_PREALLOC = 1 << 0
BPF_F_MMAPABLE = 1 << 10
BPF_F_INNER_MAP = 1 << 12  # an inner map of any max_entries (5.10)

# BPF_PROG_ATTACH's attach_flags.
BPF_F_ALLOW_MULTI = 1 << 1

# BPF_MAP_UPDATE_ELEM's flags.
BPF_ANY = 0
BPF_NOEXIST = 1
BPF_EXIST = 2

# enum bpf_func_id: helpers the feature probe calls.
BPF_FUNC_SK_STORAGE_GET = 107
BPF_FUNC_REDIRECT_NEIGH = 152
BPF_FUNC_SET_RETVAL = 187

# offsetof(struct bpf_sock_addr, sk): where a sock_addr program reads its socket.
SOCK_ADDR_SK_OFFSET = 64

# Instructions: BPF_LD | BPF_IMM | BPF_DW loads a 64-bit immediate over two instruction
# slots; with src_reg BPF_PSEUDO_MAP_FD its immediate is a map fd (what a loader patches).
BPF_LD_IMM64 = 0x18
BPF_PSEUDO_MAP_FD = 1
