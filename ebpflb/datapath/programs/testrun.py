"""Running the NodePort programs on one packet in the kernel (BPF_PROG_TEST_RUN), as
Katran's and Cilium's datapath tests do: the packet in, the verdict and the packet out.

The kernel builds an skb (tc) or an xdp_buff (XDP) around a copy of the frame, as if it
had arrived on `ifindex`, runs the program and hands back what it returned and the frame
as it left it; nothing is sent, a redirect only shows in the verdict. Maps are the real
ones, so conntrack entries and counters change as for real traffic. Route lookups
(bpf_fib_lookup) and the device resolve in the caller's network namespace.

Only tests and measurements use this module; the agent never runs programs itself.
"""

from __future__ import annotations

import ctypes as ct
import enum
from dataclasses import dataclass

from ebpflb.datapath.syscall import bpfsys


class TcVerdict(enum.IntEnum):
    """TC_ACT_* a tc program returns (uapi/linux/pkt_cls.h)."""

    OK = 0
    SHOT = 2
    REDIRECT = 7


class XdpVerdict(enum.IntEnum):
    """XDP_* an XDP program returns (uapi/linux/bpf.h)."""

    ABORTED = 0
    DROP = 1
    PASS = 2
    TX = 3
    REDIRECT = 4


Verdict = TcVerdict | XdpVerdict


class _SkbContext(ct.Structure):
    """struct __sk_buff up to gso_size (uapi/linux/bpf.h, 5.7+): the kernel takes a
    prefix and zero for the rest. Of these only mark, priority, ingress_ifindex, ifindex,
    cb, tstamp, wire_len, gso_segs and gso_size may be set; ifindex names the device the
    skb comes from, and a gso_size makes it a GSO skb (skb_is_gso) whose segments carry
    that many payload bytes, as after GRO."""

    _fields_ = [
        ("len", ct.c_uint32),
        ("pkt_type", ct.c_uint32),
        ("mark", ct.c_uint32),
        ("queue_mapping", ct.c_uint32),
        ("protocol", ct.c_uint32),
        ("vlan_present", ct.c_uint32),
        ("vlan_tci", ct.c_uint32),
        ("vlan_proto", ct.c_uint32),
        ("priority", ct.c_uint32),
        ("ingress_ifindex", ct.c_uint32),
        ("ifindex", ct.c_uint32),
        ("_tc_index_to_data_meta", ct.c_uint32 * 25),  # tc_index .. data_meta: must be 0
        ("_flow_keys", ct.c_uint64),
        ("tstamp", ct.c_uint64),
        ("wire_len", ct.c_uint32),
        ("gso_segs", ct.c_uint32),
        ("_sk", ct.c_uint64),
        ("gso_size", ct.c_uint32),
    ]


class _XdpContext(ct.Structure):
    """struct xdp_md. data_end must be the frame's length; ingress_ifindex and
    rx_queue_index choose the receive queue the program sees."""

    _fields_ = [
        ("data", ct.c_uint32),
        ("data_end", ct.c_uint32),
        ("data_meta", ct.c_uint32),
        ("ingress_ifindex", ct.c_uint32),
        ("rx_queue_index", ct.c_uint32),
        ("egress_ifindex", ct.c_uint32),
    ]


@dataclass(frozen=True, slots=True)
class ProgramRun:
    verdict: Verdict | int  # an int only for a code the enums do not know
    data: bytes  # the frame as the program left it
    duration_ns: int  # per repetition, measured by the kernel around the program
    repeat: int


def _verdict(kind: type[TcVerdict] | type[XdpVerdict], code: int) -> Verdict | int:
    try:
        return kind(code)
    except ValueError:
        return code


def run_tc(
    prog_fd: int,
    frame: bytes,
    ifindex: int,
    *,
    repeat: int = 1,
    name: str = "",
    gso_size: int = 0,
) -> ProgramRun:
    """Run a tc (SCHED_CLS) program on an Ethernet frame arriving on (or, for an egress
    program, leaving through) `ifindex`. With repeat > 1 every repetition sees the frame
    as the previous one left it. A gso_size makes the skb a GRO/GSO aggregate of segments
    carrying that many payload bytes each."""
    ctx = _SkbContext(ifindex=ifindex, gso_size=gso_size)
    done = bpfsys.prog_test_run(prog_fd, frame, ctx, repeat, name or f"tc program fd {prog_fd}")
    return ProgramRun(_verdict(TcVerdict, done.retval), done.data, done.duration_ns, repeat)


def run_xdp(
    prog_fd: int, frame: bytes, ifindex: int, *, repeat: int = 1, name: str = ""
) -> ProgramRun:
    """Run an XDP program on a frame received on `ifindex` (queue 0); as run_tc."""
    ctx = _XdpContext(data_end=len(frame), ingress_ifindex=ifindex)
    done = bpfsys.prog_test_run(prog_fd, frame, ctx, repeat, name or f"XDP program fd {prog_fd}")
    return ProgramRun(_verdict(XdpVerdict, done.retval), done.data, done.duration_ns, repeat)
