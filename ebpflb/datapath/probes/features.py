"""Every kernel feature the agent uses, with the trial that finds it and what its absence
costs: one table (the README's kernel table follows its order).
"""

from __future__ import annotations

import enum
import errno
from collections.abc import Mapping
from dataclasses import dataclass

from ebpflb.datapath.probes.trials import (
    EXIT,
    Probe,
    batch_ops,
    call,
    inner_map,
    links,
    load,
    mov,
    new_map,
    sk_storage,
    sk_storage_in_sock_addr,
    sock_addr,
)
from ebpflb.datapath.syscall import uapi
from ebpflb.datapath.syscall.uapi import MapType


class Need(enum.Enum):
    """When the agent cannot start without a feature."""

    ALWAYS = "always"  # socket-LB, which every agent runs
    NODEPORT = "with --interfaces"  # the tc programs
    OPTIONAL = "optional"  # the agent works around its absence
    UNUSED = "unused"  # reported for operators; this version does not use it


@dataclass(frozen=True, slots=True)
class Feature:
    key: str  # the name in /status, the metric's label and the matrix's features.json
    name: str
    since: str  # first mainline kernel with it
    need: Need
    used_for: str  # what the agent does with it
    fallback: str  # what a user gets without it


_REFUSE = "the agent does not start"

FEATURES: tuple[tuple[Feature, Probe], ...] = (
    (
        Feature(
            "connect4",
            "cgroup connect4 hook",
            "4.17",
            Need.ALWAYS,
            "ClusterIP TCP (and connected UDP) translated at connect()",
            _REFUSE,
        ),
        sock_addr(uapi.BPF_CGROUP_INET4_CONNECT, "a probe connect4 program"),
    ),
    (
        Feature(
            "sendmsg4",
            "cgroup sendmsg4 hook",
            "4.18",
            Need.ALWAYS,
            "unconnected UDP to a ClusterIP translated per sendmsg()",
            _REFUSE,
        ),
        sock_addr(uapi.BPF_CGROUP_UDP4_SENDMSG, "a probe sendmsg4 program"),
    ),
    (
        Feature(
            "recvmsg4",
            "cgroup recvmsg4 hook",
            "5.2",
            Need.ALWAYS,
            "UDP replies seen from the ClusterIP",
            _REFUSE,
        ),
        sock_addr(uapi.BPF_CGROUP_UDP4_RECVMSG, "a probe recvmsg4 program"),
    ),
    (
        Feature(
            "getpeername4",
            "cgroup getpeername4 hook",
            "5.8",
            Need.ALWAYS,
            "getpeername() answers the ClusterIP",
            _REFUSE,
        ),
        sock_addr(uapi.BPF_CGROUP_INET4_GETPEERNAME, "a probe getpeername4 program"),
    ),
    (
        Feature(
            "connect6",
            "cgroup connect6 hook",
            "4.17",
            Need.ALWAYS,
            "IPv6 (and IPv4-mapped) ClusterIP TCP and connected UDP translated at connect()",
            _REFUSE,
        ),
        sock_addr(uapi.BPF_CGROUP_INET6_CONNECT, "a probe connect6 program"),
    ),
    (
        Feature(
            "sendmsg6",
            "cgroup sendmsg6 hook",
            "4.18",
            Need.ALWAYS,
            "unconnected UDP to an IPv6 ClusterIP translated per sendmsg()",
            _REFUSE,
        ),
        sock_addr(uapi.BPF_CGROUP_UDP6_SENDMSG, "a probe sendmsg6 program"),
    ),
    (
        Feature(
            "recvmsg6",
            "cgroup recvmsg6 hook",
            "5.2",
            Need.ALWAYS,
            "UDP replies seen from the IPv6 ClusterIP",
            _REFUSE,
        ),
        sock_addr(uapi.BPF_CGROUP_UDP6_RECVMSG, "a probe recvmsg6 program"),
    ),
    (
        Feature(
            "getpeername6",
            "cgroup getpeername6 hook",
            "5.8",
            Need.ALWAYS,
            "getpeername() on an IPv6 socket answers the ClusterIP",
            _REFUSE,
        ),
        sock_addr(uapi.BPF_CGROUP_INET6_GETPEERNAME, "a probe getpeername6 program"),
    ),
    (
        Feature(
            "mmapable_array",
            "memory-mapped array (BPF_F_MMAPABLE)",
            "5.5",
            Need.ALWAYS,
            "Maglev slot pool written as memory",
            _REFUSE,
        ),
        new_map(MapType.ARRAY, "a probe mmapable array", uapi.BPF_F_MMAPABLE),
    ),
    (
        Feature(
            "inner_map",
            "inner maps of any size (BPF_F_INNER_MAP)",
            "5.10",
            Need.ALWAYS,
            "slot pool and conntrack that start small and grow (a larger map swapped in)",
            _REFUSE,
        ),
        inner_map,
    ),
    (
        Feature(
            "set_retval",
            "bpf_set_retval",
            "5.18",
            Need.OPTIONAL,
            "ECONNREFUSED for a Service without endpoints",
            "connect() to a Service without endpoints fails with EPERM, not ECONNREFUSED",
        ),
        sock_addr(
            uapi.BPF_CGROUP_INET4_CONNECT,
            "a probe program calling bpf_set_retval",
            mov(1, -errno.ECONNREFUSED) + call(uapi.BPF_FUNC_SET_RETVAL) + mov(0, 1) + EXIT,
        ),
    ),
    (
        Feature(
            "batch_ops",
            "batched map operations",
            "5.6",
            Need.OPTIONAL,
            "maps read and written in batches",
            "one syscall per map entry (slower syncs)",
        ),
        batch_ops,
    ),
    (
        Feature(
            "tc",
            "tc (clsact) BPF programs",
            "4.5",
            Need.NODEPORT,
            "NodePort, LoadBalancer and external IPs (--interfaces)",
            "the agent does not start with --interfaces",
        ),
        load(uapi.BPF_PROG_TYPE_SCHED_CLS, mov(0, 0) + EXIT, "a probe tc program"),
    ),
    (
        Feature(
            "redirect_neigh",
            "bpf_redirect_neigh (tc)",
            "5.10",
            Need.NODEPORT,
            "NodePort DNAT/SNAT forwarded to other nodes",
            "the agent does not start with --interfaces",
        ),
        load(
            uapi.BPF_PROG_TYPE_SCHED_CLS,
            mov(1, 1)
            + mov(2, 0)
            + mov(3, 0)
            + mov(4, 0)
            + call(uapi.BPF_FUNC_REDIRECT_NEIGH)
            + EXIT,
            "a probe program calling bpf_redirect_neigh",
        ),
    ),
    (
        Feature(
            "xdp",
            "XDP programs",
            "4.8",
            Need.OPTIONAL,
            "NodePort ingress in XDP (--xdp; native or generic is decided per interface)",
            "NodePort ingress in tc",
        ),
        load(uapi.BPF_PROG_TYPE_XDP, mov(0, 2) + EXIT, "a probe XDP program"),
    ),
    (
        Feature(
            "sk_storage",
            "socket storage (SK_STORAGE)",
            "5.2",
            Need.ALWAYS,
            "the map ebpflb_sockrev4 (pinned with the others, used where sk_storage_sock_addr"
            " allows)",
            _REFUSE,
        ),
        sk_storage,
    ),
    (
        Feature(
            "sk_storage_sock_addr",
            "bpf_sk_storage_get in cgroup sock_addr programs",
            "5.3",
            Need.OPTIONAL,
            "a TCP socket's reverse entry (getpeername) kept in the socket: no hash insert"
            " per connect(), gone with the socket",
            "TCP reverse entries in the LRU ebpflb_revsk4: one hash insert per connect(), and"
            " a closed socket's entry stays until evicted",
        ),
        sk_storage_in_sock_addr,
    ),
    (
        Feature(
            "links",
            "bpf links for cgroup programs",
            "5.7",
            Need.UNUSED,
            "nothing yet (cgroup programs attach with BPF_PROG_ATTACH, multi-attach)",
            "nothing lost",
        ),
        links,
    ),
)

BY_KEY: Mapping[str, Feature] = {feature.key: feature for feature, _ in FEATURES}
