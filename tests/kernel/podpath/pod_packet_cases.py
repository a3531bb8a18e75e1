"""The per-packet ClusterIP path as a table, next to NodePort's
(tests/kernel/nodeport/packet_cases.py, whose node, services and helpers these cases use):
bpf/nodeport.c built for pods' interfaces (``ebpflb_pod_in``: what a pod sends,
``ebpflb_pod_out``: what reaches it). eth2 stands for a pod's host-side interface: the pod
POD_ETH2 (and POD6_ETH2) behind it, no address of the node's on it.
"""

from __future__ import annotations

from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether

from ebpflb.datapath.contract import Counter, CtFlags
from tests.kernel.nodeport.packet_cases import (
    CLIENT,
    CLUSTER_IP,
    CLUSTER_IP6,
    LOCAL,
    MAC,
    NODE2_POD,
    OK,
    POD6_ETH2,
    POD6_LOCAL,
    POD_ETH2,
    PRIMARY,
    REDIRECT,
    SAME,
    Case,
    FlowRow,
    Frame,
    Port,
    Program,
    Ref,
    client,
)

NEW, REPLY = Counter.NP_NEW_FLOW, Counter.NP_REPLY
HAIRPIN_VIP, EMPTY_VIP = "10.96.0.91", "10.96.0.85"  # via-eth2's (POD_ETH2), no-endpoints'
POD_NEW = "a pod's SYN to a ClusterIP: DNAT, its address kept, the stack routes it"
HAIRPIN = "a pod reaching itself through its Service: SNAT to the primary address, sent back"


def from_pod(sport: Port, dst: tuple[str, Port], src: str = POD_ETH2, **fields: object) -> Frame:
    """What the pod behind eth2 sends (a SYN unless tcp_flags says otherwise)."""
    return Frame(MAC["pod-eth2"], MAC["eth2"], (src, sport), dst, **fields)  # type: ignore[arg-type]


def into_pod(src: tuple[str, Port], dport: int, dst: str = POD_ETH2, **fields: object) -> Frame:
    """What reaches the pod behind eth2, routed by this node (TTL decremented)."""
    return Frame(MAC["eth2"], MAC["pod-eth2"], src, (dst, dport), ttl=63, **fields)  # type: ignore[arg-type]


POD_CASES = (
    Case(
        POD_NEW,
        Program.POD_INGRESS,
        from_pod(40000, (CLUSTER_IP, 80)),
        OK,
        from_pod(40000, LOCAL),
        counters={NEW: 1},
        flows=(FlowRow((POD_ETH2, 40000), (CLUSTER_IP, 80), LOCAL),),
        link="eth2",
    ),
    Case(
        "its reply on the way into the pod: from the ClusterIP again",
        Program.POD_EGRESS,
        into_pod(LOCAL, 40000, tcp_flags="SA"),
        OK,
        into_pod((CLUSTER_IP, 80), 40000, tcp_flags="SA"),
        counters={REPLY: 1},
        flows=(FlowRow((POD_ETH2, 40000), (CLUSTER_IP, 80), LOCAL, flags=CtFlags.REPLY_SEEN),),
        after=(POD_NEW,),
        link="eth2",
    ),
    Case(
        "a pod's packet to no frontend passes untouched",
        Program.POD_INGRESS,
        from_pod(40000, NODE2_POD),
        OK,
        SAME,
        link="eth2",
    ),
    Case(
        "a packet into the pod of no translated flow passes untouched",
        Program.POD_EGRESS,
        into_pod(NODE2_POD, 40000, tcp_flags="SA"),
        OK,
        SAME,
        link="eth2",
    ),
    Case(
        HAIRPIN,
        Program.POD_INGRESS,
        from_pod(40000, (HAIRPIN_VIP, 80)),
        REDIRECT,
        into_pod((PRIMARY, Ref.SNAT_PORT), 8080),
        counters={NEW: 1},
        flows=(FlowRow((POD_ETH2, 40000), (HAIRPIN_VIP, 80), (POD_ETH2, 8080), snat=PRIMARY),),
        link="eth2",
    ),
    Case(
        "the hairpinned flow's reply: back to the pod from the ClusterIP",
        Program.POD_INGRESS,
        from_pod(8080, (PRIMARY, Ref.SNAT_PORT), tcp_flags="SA"),
        REDIRECT,
        into_pod((HAIRPIN_VIP, 80), 40000, tcp_flags="SA"),
        counters={REPLY: 1},
        flows=(
            FlowRow(
                (POD_ETH2, 40000),
                (HAIRPIN_VIP, 80),
                (POD_ETH2, 8080),
                snat=PRIMARY,
                flags=CtFlags.REPLY_SEEN,
            ),
        ),
        after=(HAIRPIN,),
        link="eth2",
    ),
    Case(
        "a ClusterIP without endpoints: a TCP RST back to the pod (socket-LB refuses too)",
        Program.POD_INGRESS,
        from_pod(40000, (EMPTY_VIP, 80)),
        REDIRECT,
        Ether(src=MAC["eth2"], dst=MAC["pod-eth2"])
        / IP(src=EMPTY_VIP, dst=POD_ETH2, ttl=64, flags="DF", id=0)
        / TCP(sport=80, dport=40000, seq=0, ack=1, flags="RA", window=0),
        counters={Counter.NP_NO_BACKEND: 1, Counter.NP_REJECT: 1},
        link="eth2",
    ),
    Case(
        "IPv6: a pod's SYN to a ClusterIP: DNAT, its address kept",
        Program.POD_INGRESS,
        from_pod(40000, (CLUSTER_IP6, 80), src=POD6_ETH2),
        OK,
        from_pod(40000, (POD6_LOCAL, 8080), src=POD6_ETH2),
        counters={NEW: 1},
        flows=(FlowRow((POD6_ETH2, 40000), (CLUSTER_IP6, 80), (POD6_LOCAL, 8080)),),
        link="eth2",
    ),
    # The contrast: the node's own program never translates a ClusterIP (a client outside
    # the cluster reaches Services only through NodePorts, LoadBalancer and external IPs).
    Case(
        "the node's ingress leaves a packet to a ClusterIP alone",
        Program.TC_INGRESS,
        client(40000, (CLUSTER_IP, 80), src=CLIENT),
        OK,
        SAME,
    ),
)
