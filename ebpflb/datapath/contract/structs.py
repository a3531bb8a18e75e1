"""structs.h in Python: the ctypes mirror of every struct a map holds (field names, order,
sizes), each naming in `_network_order_` the fields C types __be16/__be32 (maps/layout.py
converts them), and STRUCTS, the mirrors by C name.

Over 400 lines on purpose: one mirror per struct, read top to bottom like the header.
"""

from __future__ import annotations

import ctypes as ct

from ebpflb.datapath.contract.consts import SCRATCH_SIZE, SLOTS_PER_ELEMENT, SVC_NAME_LEN

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
    "defer4_val": Defer4Val,
    "frag_ports": FragPorts,
    "scratch": Scratch,
    "lb_svc_stats": LbSvcStats,
    "aff_key": AffKey,
    "aff_val": AffVal,
    "aff_match_key": AffMatchKey,
}
