"""The NodePort datapath as a table: packet in -> verdict, packet out, counters, flows.

In the style of Katran's lib/testing/KatranTestFixtures.h: each case is a description,
the input frame, what the program must return, the frame it must leave and (beyond
Katran) the datapath counters that move and the conntrack entries left behind. The
programs are bpf/nodeport.c (tc ingress ``ebpflb_np_in``, tc egress ``ebpflb_np_out``) and
bpf/nodeport_xdp.c (``ebpflb_np_xdp``); tests/kernel/nodeport/test_packets.py runs every case
through BPF_PROG_TEST_RUN on the real programs and maps, in a namespace holding the node
described below (its route lookups are the kernel's).

The node: eth0 on the client network, eth1 on the node network, eth2 without an address
of its own; pods of node2 (reachable over eth1, neighbour known), node3 (over eth0, so XDP
sends back out of the receiving interface), node4 (over eth1, neighbour not resolved yet)
and node5 (on eth2's link). Every link has an MTU of 1500. A SNATed flow takes the address
of the interface it leaves by (eth1's for node2's pods), or the node's primary address
(eth0's) for eth2; there is no IPv6 primary. Services are model values,
programmed by the real control plane (ebpflb.desired + Reconciler); every service has one
backend, so a case's backend does not depend on the flow hash. The SNAT port does:
``Ref.SNAT_PORT`` stands for the port in the flow's conntrack entry, which the runner
also checks is in SNAT_PORTS.

Each case starts with empty conntrack and NAT maps; ``after`` names cases whose packets
run first (the same program's variant when there is one). ``flows`` is every conntrack
entry there must be afterwards; each also implies its reply translation (ebpflb_rnat4).

Over 400 lines on purpose: one table, read top to bottom; the runner is packet_runner.py.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address, IPv4Network, ip_address

from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import (
    ICMPv6DestUnreach,
    ICMPv6ND_NS,
    ICMPv6PacketTooBig,
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop,
    IPv6ExtHdrRouting,
    RouterAlert,
)
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Packet, Raw

from ebpflb.datapath.contract import Counter, CtFlags
from ebpflb.datapath.programs.testrun import TcVerdict, Verdict, XdpVerdict
from ebpflb.model import (
    Endpoint,
    NamespacedName,
    Proto,
    ServicePort,
    ServicePortName,
    ServiceType,
    TrafficPolicy,
)

# ---- the node ------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    name: str
    address: str | None  # the node's address on it, /24 (None: no address, no SNAT source)
    mac: str
    neighbours: Mapping[str, str]  # address -> MAC (permanent entries), either family
    address6: str | None = None  # the node's IPv6 address on it, /64


NODE, NODE_ETH1 = "192.168.100.1", "192.168.200.1"
PRIMARY = NODE  # ebpflb_ifaddr4's primary entry (no IPv6 one)
MTU = 1500  # of every link (ebpflb_ifmtu)
ROUTER, ROUTER_CLIENT_SIDE = "192.168.200.254", "192.168.100.254"  # ICMP errors come from
CLIENT, OUTSIDER = "192.168.100.100", "192.168.100.200"
NODE2, NODE3, NODE4 = "192.168.200.2", "192.168.100.3", "192.168.200.4"
# The same node in IPv6: eth0 on fd00:100::/64, eth1 on fd00:200::/64.
NODE6, NODE6_ETH1, CLIENT6, NODE2_6 = "fd00:100::1", "fd00:200::1", "fd00:100::64", "fd00:200::2"
ROUTER6 = "fd00:200::fe"
MAC = {
    "eth0": "02:00:00:00:01:00",
    "eth1": "02:00:00:00:02:00",
    CLIENT: "02:00:00:00:01:64",
    OUTSIDER: "02:00:00:00:01:c8",
    NODE2: "02:00:00:00:02:02",
    NODE3: "02:00:00:00:01:03",
    CLIENT6: "02:00:00:00:01:64",  # the client's, in IPv6
    NODE2_6: "02:00:00:00:02:02",
    "eth2": "02:00:00:00:03:00",
    "pod-eth2": "02:00:00:00:03:33",  # POD_ETH2's and POD6_ETH2's
}
LINKS = (
    Link(
        "eth0",
        NODE,
        MAC["eth0"],
        {CLIENT: MAC[CLIENT], NODE3: MAC[NODE3], CLIENT6: MAC[CLIENT6]},
        NODE6,
    ),
    # NODE4: not resolved
    Link("eth1", NODE_ETH1, MAC["eth1"], {NODE2: MAC[NODE2], NODE2_6: MAC[NODE2_6]}, NODE6_ETH1),
    Link(
        "eth2",
        None,
        MAC["eth2"],
        {"10.244.5.51": MAC["pod-eth2"], "fd00:244:5::51": MAC["pod-eth2"]},
    ),
)
ROUTES = {  # no default
    "10.244.2.0/24": NODE2,
    "10.244.3.0/24": NODE3,
    "10.244.4.0/24": NODE4,
    "10.244.5.0/24": "dev eth2",
    "fd00:244:2::/64": NODE2_6,
    "fd00:244:5::/64": "dev eth2",
}
NODE_NAME = "node1"
SNAT_PORTS = (50000, 59999)  # --snat-port-range: above every client port used here

# ---- the services ----------------------------------------------------------------------

POD_LOCAL, POD_NODE2, POD_NODE3 = "10.244.1.11", "10.244.2.21", "10.244.3.31"
POD_NODE4, POD_UNROUTED = "10.244.4.41", "10.244.9.91"
POD_ETH2, POD6_ETH2 = "10.244.5.51", "fd00:244:5::51"
CLUSTER_IP, LB_IP = "10.96.0.10", "192.168.100.50"
POD6_LOCAL, POD6_NODE2, CLUSTER_IP6 = "fd00:244:1::11", "fd00:244:2::21", "fd00:96::10"


def service(
    name: str,
    node_port: int,
    endpoints: tuple[tuple[str, str], ...],  # (address, node)
    *,
    proto: Proto = Proto.TCP,
    target: int = 8080,
    policy: TrafficPolicy = TrafficPolicy.CLUSTER,
    lb_ip: str | None = None,
    ranges: tuple[str, ...] = (),
    cluster_ip: str | None = None,
) -> tuple[ServicePort, tuple[Endpoint, ...]]:
    """An IPv4 NodePort (or LoadBalancer) service; an IPv6 one with an IPv6 cluster_ip."""
    port = ServicePort(
        ServicePortName(NamespacedName("default", name), "p", proto),
        ServiceType.LOAD_BALANCER if lb_ip else ServiceType.NODE_PORT,
        (ip_address(cluster_ip),) if cluster_ip else (),
        80,
        target,
        node_port=node_port,
        load_balancer_ips=(IPv4Address(lb_ip),) if lb_ip else (),
        load_balancer_source_ranges=tuple(IPv4Network(r) for r in ranges),
        external_traffic_policy=policy,
    )
    return port, tuple(Endpoint(ip_address(a), target, node_name=n) for a, n in endpoints)


SERVICES = (
    service("local", 30080, ((POD_LOCAL, NODE_NAME),), cluster_ip=CLUSTER_IP),
    service("remote", 30081, ((POD_NODE2, "node2"),)),
    service("same-link", 30082, ((POD_NODE3, "node3"),)),
    service("unresolved", 30083, ((POD_NODE4, "node4"),)),
    service("etp-local", 30084, ((POD_NODE2, "node2"),), policy=TrafficPolicy.LOCAL),
    service(
        "etp-local-mixed",
        30088,
        ((POD_LOCAL, NODE_NAME), (POD_NODE2, "node2")),
        policy=TrafficPolicy.LOCAL,
    ),
    service("no-endpoints", 30085, (), cluster_ip="10.96.0.85"),
    service("no-endpoints-udp", 30089, (), proto=Proto.UDP),
    service("unrouted", 30087, ((POD_UNROUTED, "node9"),)),
    service("lb", 30086, ((POD_LOCAL, NODE_NAME),), lb_ip=LB_IP, ranges=(f"{CLIENT}/32",)),
    service("dns", 30053, ((POD_LOCAL, NODE_NAME),), proto=Proto.UDP, target=5353),
    service("dns-remote", 30054, ((POD_NODE2, "node2"),), proto=Proto.UDP, target=5353),
    service("via-eth2", 30091, ((POD_ETH2, "node5"),), cluster_ip="10.96.0.91"),
    # IPv6: frontends on the node's IPv6 addresses, backends IPv6.
    service("local6", 30180, ((POD6_LOCAL, NODE_NAME),), cluster_ip=CLUSTER_IP6),
    service("remote6", 30181, ((POD6_NODE2, "node2"),), cluster_ip="fd00:96::11"),
    service("no-endpoints6", 30185, (), cluster_ip="fd00:96::12"),
    service("dns6", 30153, ((POD6_NODE2, "node2"),), proto=Proto.UDP, cluster_ip="fd00:96::13"),
    service("via-eth2-6", 30191, ((POD6_ETH2, "node5"),), cluster_ip="fd00:96::14"),
)

# ---- how a case is written -------------------------------------------------------------


class Ref(enum.Enum):
    SNAT_PORT = "the flow's SNAT port (its conntrack entry's)"


Port = int | Ref


@dataclass(frozen=True)
class Frame:
    """An Ethernet/IP/TCP-or-UDP frame, field by field; checksums are computed (scapy)
    unless udp_checksum says otherwise. IPv6 when its addresses are (ttl is the hop limit;
    ip_flags and ip_options are IPv4's)."""

    smac: str
    dmac: str
    src: tuple[str, Port]
    dst: tuple[str, Port]
    proto: Proto = Proto.TCP
    tcp_flags: str = "S"
    ttl: int = 64
    ip_flags: str = ""  # "MF": a fragment (the first: it still has its ports)
    ip_options: bytes = b""
    payload: bytes = b""
    udp_checksum: int | None = None
    # A fragment of a datagram (IPv4 identification / IPv6 fragment header): its id, its
    # offset in 8-byte units (> 0: a later fragment, no L4 header, `payload` its bytes),
    # and whether more follow.
    frag_id: int | None = None
    frag_offset: int = 0
    more_fragments: bool = False


# A frame as scapy builds it around the flow's SNAT port (an ICMP error embedding a
# SNATed packet, say), where a Frame's fields do not reach.
Packetish = Frame | Packet | Callable[[int], Packet]


class Out(enum.Enum):
    SAME = "the input frame, byte for byte"
    UNCHECKED = "not compared (the packet is dropped)"


class Program(enum.Enum):
    TC_INGRESS = "tc-in"
    TC_EGRESS = "tc-out"
    XDP = "xdp"
    # The same source built for pods' interfaces (the per-packet ClusterIP path; its cases:
    # tests/kernel/podpath/pod_packet_cases.py).
    POD_INGRESS = "pod-in"
    POD_EGRESS = "pod-out"


@dataclass(frozen=True)
class FlowRow:
    """A conntrack entry (client -> frontend) that must exist after the case."""

    client: tuple[str, int]
    frontend: tuple[str, int]
    backend: tuple[str, int]
    proto: Proto = Proto.TCP
    snat: str | None = None  # the SNAT address (its port: Ref.SNAT_PORT); flags get SNAT
    flags: CtFlags = CtFlags.NONE  # besides SNAT
    packets: int = 1  # client -> backend packets counted
    lifetime_s: int | None = None  # if given: the entry expires this many seconds from now
    reply_nat: bool = True  # its reply translation still exists


@dataclass(frozen=True)
class Case:
    name: str
    program: Program
    packet: Packetish
    verdict: Verdict
    out: Packetish | Out
    counters: Mapping[Counter, int] = field(default_factory=dict)  # the ones that move
    flows: tuple[FlowRow, ...] = ()
    after: tuple[str, ...] = ()  # case names; "xdp: name" picks a program's variant
    link: str = "eth0"  # the interface the packet arrives on (leaves through, egress)
    gso_size: int = 0  # tc: the skb is a GRO/GSO aggregate of segments this big (payload)

    @property
    def id(self) -> str:
        return f"{self.program.value}: {self.name}"

    def __str__(self) -> str:
        return self.id


def ingress(
    name: str,
    packet: Packetish,
    verdicts: tuple[TcVerdict, XdpVerdict],
    out: Packetish | Out,
    *,
    xdp_out: Packetish | Out | None = None,
    **common: object,
) -> tuple[Case, Case]:
    """The same packet through the tc and the XDP ingress program: the same frame out
    unless xdp_out says otherwise."""
    tc, xdp = verdicts
    return (
        Case(name, Program.TC_INGRESS, packet, tc, out, **common),  # type: ignore[arg-type]
        Case(name, Program.XDP, packet, xdp, out if xdp_out is None else xdp_out, **common),  # type: ignore[arg-type]
    )


def client(port: int, frontend: tuple[str, int], *, src: str = CLIENT, **fields: object) -> Frame:
    """A client's packet arriving on eth0 (a SYN unless tcp_flags says otherwise)."""
    return Frame(MAC[src], MAC["eth0"], (src, port), frontend, **fields)  # type: ignore[arg-type]


def to_pod(port: int, pod: tuple[str, int], **fields: object) -> Frame:
    """What a DNAT-only translation leaves of client(port, ...): same MACs, the pod as
    destination, the stack routes it (TTL unchanged)."""
    return Frame(MAC[CLIENT], MAC["eth0"], (CLIENT, port), pod, **fields)  # type: ignore[arg-type]


SNAT_SOURCE = {"eth0": NODE, "eth1": NODE_ETH1, "eth2": PRIMARY}  # by egress interface


def snat_to(link: str, next_hop: str | None, pod: tuple[str, int], **fields: object) -> Frame:
    """What a DNAT + SNAT translation forwarded here leaves: the egress interface's MAC to
    the next hop's (None: unresolved, the MACs as they came), from the egress interface's
    address (MASQUERADE's) at the flow's SNAT port, TTL decremented."""
    smac, dmac = (MAC[link], MAC[next_hop]) if next_hop else (MAC[CLIENT], MAC["eth0"])
    source = (SNAT_SOURCE[link], Ref.SNAT_PORT)
    return Frame(smac, dmac, source, pod, ttl=63, **fields)  # type: ignore[arg-type]


def client6(port: int, frontend: tuple[str, int], **fields: object) -> Frame:
    """client()'s twin: the client's IPv6 packet arriving on eth0."""
    return Frame(MAC[CLIENT6], MAC["eth0"], (CLIENT6, port), frontend, **fields)  # type: ignore[arg-type]


def to_pod6(port: int, pod: tuple[str, int], **fields: object) -> Frame:
    """to_pod()'s twin (hop limit unchanged: the stack routes it)."""
    return Frame(MAC[CLIENT6], MAC["eth0"], (CLIENT6, port), pod, **fields)  # type: ignore[arg-type]


def snat6_to(pod: tuple[str, int], **fields: object) -> Frame:
    """snat_to("eth1", NODE2_6, pod)'s twin: from the node's IPv6 address on eth1 (the
    egress interface's, as IPv4), hop limit decremented."""
    return Frame(MAC["eth1"], MAC[NODE2_6], (NODE6_ETH1, Ref.SNAT_PORT), pod, ttl=63, **fields)  # type: ignore[arg-type]


OK, SHOT, REDIRECT = TcVerdict.OK, TcVerdict.SHOT, TcVerdict.REDIRECT
PASS, DROP, TX, XREDIRECT = XdpVerdict.PASS, XdpVerdict.DROP, XdpVerdict.TX, XdpVerdict.REDIRECT
SAME, UNCHECKED = Out.SAME, Out.UNCHECKED
NEW, FWD, REPLY = Counter.NP_NEW_FLOW, Counter.NP_FWD, Counter.NP_REPLY

LOCAL, NODE2_POD = (POD_LOCAL, 8080), (POD_NODE2, 8080)
LOCAL_NEW = "new flow to a local backend: DNAT, checksums updated"
REMOTE_NEW = "new flow to a remote backend: DNAT + SNAT to the node, forwarded"
REMOTE_REPLY = Frame(MAC[NODE2], MAC["eth1"], NODE2_POD, (NODE_ETH1, Ref.SNAT_PORT), tcp_flags="SA")
LOCAL_FLOW = FlowRow((CLIENT, 40000), (NODE, 30080), LOCAL)
HALF_CLOSED = "the client's FIN half-closes the flow: CLOSE_WAIT's lifetime"
CLOSE_TIMEOUT, CLOSE_WAIT_TIMEOUT = 10, 3600  # Config's defaults, the tests' datapath's
REMOTE_FLOW = FlowRow((CLIENT, 40001), (NODE, 30081), NODE2_POD, snat=NODE_ETH1)
ROUTER_ALERT = b"\x94\x04\x00\x00"  # an IPv4 option (RFC 2113): the header grows to 24 bytes
# Its last 16-bit word makes the translated datagram's checksum compute to 0.
ZERO_SUM_PAYLOAD = b"ebpflb:\x56\xa1"

LOCAL6, NODE2_POD6 = (POD6_LOCAL, 8080), (POD6_NODE2, 8080)
LOCAL6_NEW = "IPv6: new flow to a local backend: DNAT, checksum updated"
REMOTE6_NEW = "IPv6: new flow to a remote backend: DNAT + SNAT to the node, forwarded"
LOCAL6_FLOW = FlowRow((CLIENT6, 40000), (NODE6, 30180), LOCAL6)
REMOTE6_FLOW = FlowRow((CLIENT6, 40001), (NODE6, 30181), NODE2_POD6, snat=NODE6_ETH1)
ETHER6 = Ether(src=MAC[CLIENT6], dst=MAC["eth0"])
# Five extension headers: one more than the programs walk (IPV6_MAX_EXT_HEADERS).
TOO_MANY_HEADERS = (
    IPv6ExtHdrHopByHop()
    / IPv6ExtHdrDestOpt()
    / IPv6ExtHdrDestOpt()
    / IPv6ExtHdrDestOpt()
    / IPv6ExtHdrDestOpt()
)

# A GRO aggregate as a real NIC hands one up: two full segments of a 1500-byte MTU link
# and a short one, in one skb (BPF_PROG_TEST_RUN takes at most about a page of data).
GRO_SEGMENT = 1448  # TCP payload per segment: 1500 - 20 (IPv4) - 32 (TCP with timestamps)
GRO_PAYLOAD = bytes(range(256)) * 11  # 2,816 bytes: the skb is 2,870 > MTU 1,500
GRO_SEGMENT6 = 1428  # 1500 - 40 (IPv6) - 32
GRO_NEW = "a GRO aggregate (gso_size set) of a new flow to a remote backend: forwarded whole"
GRO6_NEW = "IPv6: a GRO aggregate of a new flow to a remote backend: forwarded whole"
BIG_NO_DF = "one packet larger than the next hop's MTU, DF clear: left to the stack to fragment"
# The same bytes with DF set, as TCP sends them: too big for the next hop, answered.
BIG_DF = (
    Ether(src=MAC[CLIENT], dst=MAC["eth0"])
    / IP(src=CLIENT, dst=NODE, flags="DF")
    / TCP(sport=40001, dport=30081, flags="A")
    / Raw(GRO_PAYLOAD)
)
BIG6 = (
    Ether(src=MAC[CLIENT6], dst=MAC["eth0"])
    / IPv6(src=CLIENT6, dst=NODE6)
    / TCP(sport=40001, dport=30181, flags="A")
    / Raw(GRO_PAYLOAD)
)


def frag_needed(packet: Packet, mtu: int) -> Packet:
    """What the node answers a packet too big for a next hop of `mtu` with: ICMP
    fragmentation needed from the address it was sent to, embedding its IP header and first
    8 bytes of its L4 header as the client sent them (before any translation)."""
    ip = packet[IP]
    return (
        Ether(src=packet[Ether].dst, dst=packet[Ether].src)
        / IP(src=ip.dst, dst=ip.src, ttl=64, id=0)
        / ICMP(type=3, code=4, nexthopmtu=mtu)
        / Raw(bytes(ip)[:28])
    )


def packet_too_big(packet: Packet, mtu: int) -> Packet:
    """frag_needed's IPv6 twin: ICMPv6 packet too big."""
    ip6 = packet[IPv6]
    return (
        Ether(src=packet[Ether].dst, dst=packet[Ether].src)
        / IPv6(src=ip6.dst, dst=ip6.src, hlim=64)
        / ICMPv6PacketTooBig(mtu=mtu)
        / Raw(bytes(ip6)[:48])
    )


# ICMP errors about translated flows: the error as the router (or backend) sends it,
# about the packet as it saw it; what leaves, about the packet as its sender knows it.
DNS_REMOTE_NEW = "UDP: new flow to a remote backend: DNAT + SNAT, forwarded"
DNS_REMOTE_FLOW = FlowRow(
    (CLIENT, 40030), (NODE, 30054), (POD_NODE2, 5353), Proto.UDP, snat=NODE_ETH1
)
DNS_LOCAL_NEW = "UDP: new flow to a local backend: DNAT"
DNS_LOCAL_FLOW = FlowRow((CLIENT, 40031), (NODE, 30053), (POD_LOCAL, 5353), Proto.UDP)
QUERY = b"query"
# Fragments: a 40-byte UDP datagram in two, 24 bytes (UDP header + 16) then 24 more.
FRAG_HEAD, FRAG_TAIL = b"first 16 bytes!!", b"the last twenty-four!..."
FRAG_FIRST = "the first fragment of a datagram to a NodePort: translated, its ports remembered"
FRAG_FIRST6 = "IPv6: the first fragment of a datagram to a NodePort: translated, ports remembered"
FRAG_FLOW = FlowRow((CLIENT, 40040), (NODE, 30054), (POD_NODE2, 5353), Proto.UDP, snat=NODE_ETH1)
FRAG6_FLOW = FlowRow((CLIENT6, 40041), (NODE6, 30153), NODE2_POD6, Proto.UDP, snat=NODE6_ETH1)

CASES: tuple[Case, ...] = (
    # ---- not ours: left alone, nothing counted ----
    *ingress(
        "ARP passes untouched",
        Ether(src=MAC[CLIENT], dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=CLIENT, pdst=NODE),
        (OK, PASS),
        SAME,
    ),
    *ingress(
        "IPv6 to an address no frontend has passes untouched",
        Ether(src=MAC[CLIENT], dst=MAC["eth0"]) / IPv6(src="fd00::64", dst="fd00::1") / TCP(),
        (OK, PASS),
        SAME,
    ),
    *ingress(
        "ICMP passes untouched",
        Ether(src=MAC[CLIENT], dst=MAC["eth0"]) / IP(src=CLIENT, dst=NODE) / ICMP(),
        (OK, PASS),
        SAME,
    ),
    *ingress(
        "a truncated TCP header passes untouched",
        Ether(src=MAC[CLIENT], dst=MAC["eth0"])
        / IP(src=CLIENT, dst=NODE, proto=6)
        / Raw(b"\x9c\x40\x75\x30" + bytes(6)),  # ports 40000 -> 30080, then 6 of 16 bytes
        (OK, PASS),
        SAME,
    ),
    *ingress(
        "a port no service has passes untouched", client(40000, (NODE, 30999)), (OK, PASS), SAME
    ),
    *ingress(
        "a ClusterIP reached from outside passes untranslated",
        client(40000, (CLUSTER_IP, 80)),
        (OK, PASS),
        SAME,
    ),
    Case(
        "the first fragment of a datagram to a local backend: DNAT, its ports remembered",
        Program.TC_INGRESS,
        client(40000, (NODE, 30080), ip_flags="MF"),
        OK,
        to_pod(40000, LOCAL, ip_flags="MF"),
        counters={NEW: 1, Counter.FRAGMENT: 1},
        flows=(LOCAL_FLOW,),
    ),
    # ---- local backend: DNAT only, the stack routes it ----
    *ingress(
        LOCAL_NEW,
        client(40000, (NODE, 30080)),
        (OK, PASS),
        to_pod(40000, LOCAL),
        counters={NEW: 1},
        flows=(LOCAL_FLOW,),
    ),
    *ingress(
        "IPv4 options: the ports are found behind them",
        client(40000, (NODE, 30080), ip_options=ROUTER_ALERT),
        (OK, PASS),
        to_pod(40000, LOCAL, ip_options=ROUTER_ALERT),
        counters={NEW: 1},
        flows=(LOCAL_FLOW,),
    ),
    *ingress(
        "second packet of a flow: conntrack, same backend",
        client(40000, (NODE, 30080), tcp_flags="A"),
        (OK, PASS),
        to_pod(40000, LOCAL, tcp_flags="A"),
        counters={FWD: 1},
        flows=(FlowRow((CLIENT, 40000), (NODE, 30080), LOCAL, packets=2),),
        after=(LOCAL_NEW,),
    ),
    Case(
        "reply from a local backend: source restored to the frontend",
        Program.TC_EGRESS,
        Frame(MAC["eth0"], MAC[CLIENT], LOCAL, (CLIENT, 40000), tcp_flags="SA", ttl=63),
        OK,
        Frame(MAC["eth0"], MAC[CLIENT], (NODE, 30080), (CLIENT, 40000), tcp_flags="SA", ttl=63),
        counters={REPLY: 1},
        flows=(FlowRow((CLIENT, 40000), (NODE, 30080), LOCAL, flags=CtFlags.REPLY_SEEN),),
        after=(LOCAL_NEW,),
    ),
    Case(
        "a packet of no translated flow leaves untouched",
        Program.TC_EGRESS,
        Frame(MAC["eth0"], MAC[CLIENT], (NODE, 22), (CLIENT, 40000), tcp_flags="SA"),
        OK,
        SAME,
    ),
    *ingress(
        "RST: the flow is closing",
        client(40000, (NODE, 30080), tcp_flags="R"),
        (OK, PASS),
        to_pod(40000, LOCAL, tcp_flags="R"),
        counters={FWD: 1},
        flows=(
            FlowRow(
                (CLIENT, 40000),
                (NODE, 30080),
                LOCAL,
                flags=CtFlags.CLOSING,
                packets=2,
                lifetime_s=CLOSE_TIMEOUT,
            ),
        ),
        after=(LOCAL_NEW,),
    ),
    Case(
        "a SYN-ACK on a closed flow's ports answers another connection: passed, the stale"
        " reply translation removed",
        Program.TC_EGRESS,
        Frame(MAC["eth0"], MAC[CLIENT], LOCAL, (CLIENT, 40000), tcp_flags="SA", ttl=63),
        OK,
        SAME,
        flows=(
            FlowRow(
                (CLIENT, 40000),
                (NODE, 30080),
                LOCAL,
                flags=CtFlags.CLOSING,
                packets=2,
                reply_nat=False,
            ),
        ),
        after=(LOCAL_NEW, "RST: the flow is closing"),
    ),
    *ingress(
        HALF_CLOSED,
        client(40000, (NODE, 30080), tcp_flags="FA"),
        (OK, PASS),
        to_pod(40000, LOCAL, tcp_flags="FA"),
        counters={FWD: 1},
        flows=(
            FlowRow(
                (CLIENT, 40000),
                (NODE, 30080),
                LOCAL,
                flags=CtFlags.FIN_CLIENT,
                packets=2,
                lifetime_s=CLOSE_WAIT_TIMEOUT,
            ),
        ),
        after=(LOCAL_NEW,),
    ),
    Case(
        "the backend's FIN after the client's: the flow is closing",
        Program.TC_EGRESS,
        Frame(MAC["eth0"], MAC[CLIENT], LOCAL, (CLIENT, 40000), tcp_flags="FA", ttl=63),
        OK,
        Frame(MAC["eth0"], MAC[CLIENT], (NODE, 30080), (CLIENT, 40000), tcp_flags="FA", ttl=63),
        counters={REPLY: 1},
        flows=(
            FlowRow(
                (CLIENT, 40000),
                (NODE, 30080),
                LOCAL,
                flags=CtFlags.FIN_CLIENT
                | CtFlags.FIN_BACKEND
                | CtFlags.REPLY_SEEN
                | CtFlags.CLOSING,
                packets=2,
                lifetime_s=CLOSE_TIMEOUT,
            ),
        ),
        after=(LOCAL_NEW, HALF_CLOSED),
    ),
    *ingress(
        "a SYN on a closing flow starts a new one",
        client(40000, (NODE, 30080)),
        (OK, PASS),
        to_pod(40000, LOCAL),
        counters={NEW: 1},
        flows=(LOCAL_FLOW,),
        after=(LOCAL_NEW, "RST: the flow is closing"),
    ),
    # ---- remote backend, externalTrafficPolicy Cluster: DNAT + SNAT, forwarded here ----
    *ingress(
        REMOTE_NEW,
        client(40001, (NODE, 30081)),
        (REDIRECT, XREDIRECT),
        snat_to("eth1", NODE2, NODE2_POD),
        counters={NEW: 1},
        flows=(REMOTE_FLOW,),
    ),
    *ingress(
        "second packet of a SNATed flow: same backend, same SNAT port",
        client(40001, (NODE, 30081), tcp_flags="A"),
        (REDIRECT, XREDIRECT),
        snat_to("eth1", NODE2, NODE2_POD, tcp_flags="A"),
        counters={FWD: 1},
        flows=(FlowRow((CLIENT, 40001), (NODE, 30081), NODE2_POD, snat=NODE_ETH1, packets=2),),
        after=(REMOTE_NEW,),
    ),
    *ingress(
        "reply to a SNATed flow: back to the client's view, forwarded",
        REMOTE_REPLY,
        (REDIRECT, XREDIRECT),
        Frame(MAC["eth0"], MAC[CLIENT], (NODE, 30081), (CLIENT, 40001), tcp_flags="SA", ttl=63),
        counters={REPLY: 1},
        flows=(
            FlowRow(
                (CLIENT, 40001), (NODE, 30081), NODE2_POD, snat=NODE_ETH1, flags=CtFlags.REPLY_SEEN
            ),
        ),
        after=(REMOTE_NEW,),
        link="eth1",
    ),
    *ingress(
        "the client's ACK after the backend answered: established",
        client(40001, (NODE, 30081), tcp_flags="A"),
        (REDIRECT, XREDIRECT),
        snat_to("eth1", NODE2, NODE2_POD, tcp_flags="A"),
        counters={FWD: 1},
        flows=(
            FlowRow(
                (CLIENT, 40001),
                (NODE, 30081),
                NODE2_POD,
                snat=NODE_ETH1,
                flags=CtFlags.REPLY_SEEN | CtFlags.ESTABLISHED,
                packets=2,
            ),
        ),
        after=(REMOTE_NEW, "reply to a SNATed flow: back to the client's view, forwarded"),
    ),
    *ingress(
        "TTL 1 on a packet this node must forward: dropped",
        client(40001, (NODE, 30081), ttl=1),
        (SHOT, DROP),
        UNCHECKED,
        counters={NEW: 1},
        flows=(REMOTE_FLOW,),
    ),
    # ---- packets larger than the next hop's MTU ----
    # Regression (bulk TCP through a NodePort at 0.13 Mbit/s): since 5.12 a tot_len given to
    # bpf_fib_lookup is compared with the MTU as it stands, so every GRO aggregate came back
    # FRAG_NEEDED and was dropped. Its segments fit: it must leave whole, as forwarding does.
    Case(
        GRO_NEW,
        Program.TC_INGRESS,
        client(40001, (NODE, 30081), tcp_flags="A", payload=GRO_PAYLOAD),
        REDIRECT,
        snat_to("eth1", NODE2, NODE2_POD, tcp_flags="A", payload=GRO_PAYLOAD),
        counters={NEW: 1},
        flows=(REMOTE_FLOW,),
        gso_size=GRO_SEGMENT,
    ),
    Case(
        GRO6_NEW,
        Program.TC_INGRESS,
        client6(40001, (NODE6, 30181), tcp_flags="A", payload=GRO_PAYLOAD),
        REDIRECT,
        snat6_to(NODE2_POD6, tcp_flags="A", payload=GRO_PAYLOAD),
        counters={NEW: 1},
        flows=(REMOTE6_FLOW,),
        gso_size=GRO_SEGMENT6,
    ),
    # The same bytes as one packet (no gso_size) do not fit the next hop. Without DF a
    # router fragments it, which a program cannot: the stack does, the destination
    # translated here, the source on the way out (the next two cases). XDP leaves it to
    # tc, which sees the flow XDP started.
    Case(
        BIG_NO_DF,
        Program.TC_INGRESS,
        client(40001, (NODE, 30081), tcp_flags="A", payload=GRO_PAYLOAD),
        OK,
        Frame(
            MAC[CLIENT], MAC["eth0"], (CLIENT, 40001), NODE2_POD, tcp_flags="A", payload=GRO_PAYLOAD
        ),
        counters={NEW: 1, Counter.FRAGMENTED: 1},
        flows=(REMOTE_FLOW,),
    ),
    Case(
        "the stack's first fragment of it leaves with the flow's SNAT source",
        Program.TC_EGRESS,
        Frame(
            MAC["eth1"],
            MAC[NODE2],
            (CLIENT, 40001),
            NODE2_POD,
            tcp_flags="A",
            ttl=63,
            payload=GRO_PAYLOAD[:1448],
            frag_id=1,
            more_fragments=True,
        ),
        OK,
        Frame(
            MAC["eth1"],
            MAC[NODE2],
            (NODE_ETH1, Ref.SNAT_PORT),
            NODE2_POD,
            tcp_flags="A",
            ttl=63,
            payload=GRO_PAYLOAD[:1448],
            frag_id=1,
            more_fragments=True,
        ),
        counters={Counter.FRAGMENT: 1},
        flows=(REMOTE_FLOW,),
        after=(BIG_NO_DF,),
        link="eth1",
    ),
    Case(
        "the stack's later fragment of it leaves with the SNAT address",
        Program.TC_EGRESS,
        Frame(
            MAC["eth1"],
            MAC[NODE2],
            (CLIENT, 40001),
            NODE2_POD,
            ttl=63,
            payload=GRO_PAYLOAD[1468:2016],
            frag_id=1,
            frag_offset=185,
        ),
        OK,
        Frame(
            MAC["eth1"],
            MAC[NODE2],
            (NODE_ETH1, 0),
            NODE2_POD,
            ttl=63,
            payload=GRO_PAYLOAD[1468:2016],
            frag_id=1,
            frag_offset=185,
        ),
        counters={Counter.FRAGMENT: 1},
        flows=(REMOTE_FLOW,),
        after=(BIG_NO_DF,),
        link="eth1",
    ),
    Case(
        "one packet larger than the next hop's MTU, DF clear: left to tc",
        Program.XDP,
        client(40001, (NODE, 30081), tcp_flags="A", payload=GRO_PAYLOAD),
        PASS,
        SAME,
        counters={NEW: 1},
        flows=(REMOTE_FLOW,),
    ),
    *ingress(
        "backend behind the receiving interface: XDP sends it back out (XDP_TX)",
        client(40004, (NODE, 30082)),
        (REDIRECT, TX),
        snat_to("eth0", NODE3, (POD_NODE3, 8080)),
        counters={NEW: 1},
        flows=(FlowRow((CLIENT, 40004), (NODE, 30082), (POD_NODE3, 8080), snat=NODE),),
    ),
    *ingress(
        "next hop not resolved: tc lets the kernel fill the MACs, XDP leaves it to tc",
        client(40005, (NODE, 30083)),
        (REDIRECT, PASS),
        snat_to("eth1", None, (POD_NODE4, 8080)),
        xdp_out=SAME,
        counters={NEW: 1},
        flows=(FlowRow((CLIENT, 40005), (NODE, 30083), (POD_NODE4, 8080), snat=NODE_ETH1),),
    ),
    Case(
        "after XDP passed it untranslated: tc translates from conntrack",
        Program.TC_INGRESS,
        client(40005, (NODE, 30083)),
        REDIRECT,
        snat_to("eth1", None, (POD_NODE4, 8080)),
        counters={FWD: 1},
        # One packet, counted twice: by XDP (which made the flow) and by tc.
        flows=(
            FlowRow((CLIENT, 40005), (NODE, 30083), (POD_NODE4, 8080), snat=NODE_ETH1, packets=2),
        ),
        after=(
            "xdp: next hop not resolved: tc lets the kernel fill the MACs, XDP leaves it to tc",
        ),
    ),
    # ---- refused: dropped, counted, no flow left behind ----
    Case(
        "a service with no endpoint at all: a TCP RST from the frontend (kube-proxy's REJECT)",
        Program.TC_INGRESS,
        client(40000, (NODE, 30085)),
        REDIRECT,
        Ether(src=MAC["eth0"], dst=MAC[CLIENT])
        / IP(src=NODE, dst=CLIENT, ttl=64, flags="DF", id=0)
        / TCP(sport=30085, dport=40000, seq=0, ack=1, flags="RA", window=0),
        counters={Counter.NP_NO_BACKEND: 1, Counter.NP_REJECT: 1},
    ),
    Case(
        "a service with no endpoint at all: XDP leaves the RST to tc, which counts it",
        Program.XDP,
        client(40000, (NODE, 30085)),
        PASS,
        SAME,
        counters={},
    ),
    Case(
        "a service with no endpoint at all: ICMP port unreachable from the frontend (UDP)",
        Program.TC_INGRESS,
        client(40000, (NODE, 30089), proto=Proto.UDP, payload=b"anybody there?"),
        REDIRECT,
        Ether(src=MAC["eth0"], dst=MAC[CLIENT])
        / IP(src=NODE, dst=CLIENT, ttl=64, id=0)
        / ICMP(type=3, code=3)
        / Raw(
            bytes(
                IP(src=CLIENT, dst=NODE) / UDP(sport=40000, dport=30089) / Raw(b"anybody there?")
            )[:28]
        ),
        counters={Counter.NP_NO_BACKEND: 1, Counter.NP_REJECT: 1},
    ),
    Case(
        "a service with no endpoint at all: a RST is not answered",
        Program.TC_INGRESS,
        client(40000, (NODE, 30085), tcp_flags="R"),
        SHOT,
        UNCHECKED,
        counters={Counter.NP_NO_BACKEND: 1},
    ),
    *ingress(
        "externalTrafficPolicy Local without a local backend: dropped",
        client(40000, (NODE, 30084)),
        (SHOT, DROP),
        UNCHECKED,
        counters={Counter.NP_NO_BACKEND: 1},
    ),
    *ingress(
        "externalTrafficPolicy Local: the local backend only, the client's address kept",
        client(40008, (NODE, 30088)),
        (OK, PASS),
        to_pod(40008, LOCAL),
        counters={NEW: 1},
        flows=(FlowRow((CLIENT, 40008), (NODE, 30088), LOCAL),),
    ),
    *ingress(
        "source outside loadBalancerSourceRanges: dropped",
        client(40000, (LB_IP, 80), src=OUTSIDER),
        (SHOT, DROP),
        UNCHECKED,
        counters={Counter.SRC_RANGE_DROP: 1},
    ),
    *ingress(
        "source inside loadBalancerSourceRanges: translated",
        client(40000, (LB_IP, 80)),
        (OK, PASS),
        to_pod(40000, LOCAL),
        counters={NEW: 1},
        flows=(FlowRow((CLIENT, 40000), (LB_IP, 80), LOCAL),),
    ),
    # ---- the SNAT source: the egress interface's address, as MASQUERADE's ----
    *ingress(
        "arrived on an interface without an address: SNAT to the egress interface's",
        Frame(MAC[CLIENT], MAC["eth2"], (CLIENT, 40007), (NODE, 30081)),
        (REDIRECT, XREDIRECT),
        snat_to("eth1", NODE2, NODE2_POD),
        counters={NEW: 1},
        flows=(FlowRow((CLIENT, 40007), (NODE, 30081), NODE2_POD, snat=NODE_ETH1),),
        link="eth2",
    ),
    *ingress(
        "leaving by an interface without an address: SNAT to the node's primary address",
        client(40008, (NODE, 30091)),
        (REDIRECT, XREDIRECT),
        snat_to("eth2", "pod-eth2", (POD_ETH2, 8080)),
        counters={NEW: 1},
        flows=(FlowRow((CLIENT, 40008), (NODE, 30091), (POD_ETH2, 8080), snat=PRIMARY),),
    ),
    *ingress(
        "IPv6: SNAT needed, no address on the egress interface and no primary: dropped, counted",
        client6(40008, (NODE6, 30191)),
        (SHOT, DROP),
        UNCHECKED,
        counters={Counter.SNAT_NO_ADDR: 1},
    ),
    # The flow is made before the route lookup fails (as for TTL 1 above); XDP hands the
    # packet to the stack untranslated and tc, which sees it next, drops it.
    Case(
        "no route to the backend: dropped, counted",
        Program.TC_INGRESS,
        client(40006, (NODE, 30087)),
        SHOT,
        UNCHECKED,
        counters={NEW: 1, Counter.FIB_FAIL: 1},
        flows=(FlowRow((CLIENT, 40006), (NODE, 30087), (POD_UNROUTED, 8080), snat=NODE),),
    ),
    Case(
        "no route to the backend: passed untranslated, tc decides",
        Program.XDP,
        client(40006, (NODE, 30087)),
        PASS,
        SAME,
        counters={NEW: 1},
        flows=(FlowRow((CLIENT, 40006), (NODE, 30087), (POD_UNROUTED, 8080), snat=NODE),),
    ),
    # ---- too big for the next hop: answered as a router would ----
    Case(
        "one packet too big for the next hop, DF set: fragmentation needed to the client",
        Program.TC_INGRESS,
        BIG_DF,
        REDIRECT,
        frag_needed(BIG_DF, MTU),
        counters={NEW: 1, Counter.TOO_BIG_SENT: 1},
        flows=(REMOTE_FLOW,),
    ),
    # A GRO aggregate whose segments (20 + 20 + 2000 bytes) exceed the next hop's MTU: the
    # MTU comes from the kernel (5.12+) or from ebpflb_ifmtu (5.10).
    Case(
        "a GRO aggregate whose segments do not fit the next hop: fragmentation needed",
        Program.TC_INGRESS,
        BIG_DF,
        REDIRECT,
        frag_needed(BIG_DF, MTU),
        counters={NEW: 1, Counter.TOO_BIG_SENT: 1},
        flows=(REMOTE_FLOW,),
        gso_size=2000,
    ),
    Case(
        "IPv6: one packet too big for the next hop: packet too big to the client",
        Program.TC_INGRESS,
        BIG6,
        REDIRECT,
        packet_too_big(BIG6, MTU),
        counters={NEW: 1, Counter.TOO_BIG_SENT: 1},
        flows=(REMOTE6_FLOW,),
    ),
    Case(
        "IPv6: one packet too big for the next hop: left to tc untranslated",
        Program.XDP,
        BIG6,
        PASS,
        SAME,
        counters={NEW: 1},
        flows=(REMOTE6_FLOW,),
    ),
    # ---- ICMP errors about translated flows: translated as the flow is ----
    *ingress(
        DNS_REMOTE_NEW,
        client(40030, (NODE, 30054), proto=Proto.UDP, payload=QUERY),
        (REDIRECT, XREDIRECT),
        snat_to("eth1", NODE2, (POD_NODE2, 5353), proto=Proto.UDP, payload=QUERY),
        counters={NEW: 1},
        flows=(DNS_REMOTE_FLOW,),
    ),
    *ingress(
        DNS_LOCAL_NEW,
        client(40031, (NODE, 30053), proto=Proto.UDP, payload=QUERY),
        (OK, PASS),
        to_pod(40031, (POD_LOCAL, 5353), proto=Proto.UDP, payload=QUERY),
        counters={NEW: 1},
        flows=(DNS_LOCAL_FLOW,),
    ),
    Case(
        "fragmentation needed from beyond the node about a SNATed packet: to the client",
        Program.TC_INGRESS,
        lambda port: (
            Ether(src=MAC[NODE2], dst=MAC["eth1"])
            / IP(src=ROUTER, dst=NODE_ETH1)
            / ICMP(type=3, code=4, nexthopmtu=1400)
            / IP(src=NODE_ETH1, dst=POD_NODE2, ttl=63)
            / TCP(sport=port, dport=8080, flags="S")
        ),
        OK,
        Ether(src=MAC[NODE2], dst=MAC["eth1"])
        / IP(src=ROUTER, dst=CLIENT)
        / ICMP(type=3, code=4, nexthopmtu=1400)
        / IP(src=CLIENT, dst=NODE, ttl=63)
        / TCP(sport=40001, dport=30081, flags="S"),
        counters={Counter.ICMP_XLATED: 1},
        flows=(REMOTE_FLOW,),
        after=(REMOTE_NEW,),
        link="eth1",
    ),
    Case(
        "the backend's port unreachable about a SNATed UDP flow: to the client, from the"
        " frontend, forwarded",
        Program.TC_INGRESS,
        lambda port: (
            Ether(src=MAC[NODE2], dst=MAC["eth1"])
            / IP(src=POD_NODE2, dst=NODE_ETH1)
            / ICMP(type=3, code=3)
            / IP(src=NODE_ETH1, dst=POD_NODE2, ttl=63)
            / UDP(sport=port, dport=5353)
            / Raw(QUERY)
        ),
        REDIRECT,
        Ether(src=MAC["eth0"], dst=MAC[CLIENT])
        / IP(src=NODE, dst=CLIENT, ttl=63)
        / ICMP(type=3, code=3)
        / IP(src=CLIENT, dst=NODE, ttl=63)
        / UDP(sport=40030, dport=30054)
        / Raw(QUERY),
        counters={Counter.ICMP_XLATED: 1},
        flows=(DNS_REMOTE_FLOW,),
        after=(DNS_REMOTE_NEW,),
        link="eth1",
    ),
    Case(
        "fragmentation needed from the client's side about a reply: to the backend",
        Program.TC_INGRESS,
        Ether(src=MAC[CLIENT], dst=MAC["eth0"])
        / IP(src=ROUTER_CLIENT_SIDE, dst=NODE)
        / ICMP(type=3, code=4, nexthopmtu=1280)
        / IP(src=NODE, dst=CLIENT, ttl=63)
        / TCP(sport=30081, dport=40001, flags="SA"),
        OK,
        lambda port: (
            Ether(src=MAC[CLIENT], dst=MAC["eth0"])
            / IP(src=ROUTER_CLIENT_SIDE, dst=POD_NODE2)
            / ICMP(type=3, code=4, nexthopmtu=1280)
            / IP(src=POD_NODE2, dst=NODE_ETH1, ttl=63)
            / TCP(sport=8080, dport=port, flags="SA")
        ),
        counters={Counter.ICMP_XLATED: 1},
        flows=(REMOTE_FLOW,),
        after=(REMOTE_NEW,),
    ),
    Case(
        "a local backend's port unreachable leaving to the client: from and about the frontend",
        Program.TC_EGRESS,
        Ether(src=MAC["eth0"], dst=MAC[CLIENT])
        / IP(src=POD_LOCAL, dst=CLIENT, ttl=63)
        / ICMP(type=3, code=3)
        / IP(src=CLIENT, dst=POD_LOCAL, ttl=64)
        / UDP(sport=40031, dport=5353)
        / Raw(QUERY),
        OK,
        Ether(src=MAC["eth0"], dst=MAC[CLIENT])
        / IP(src=NODE, dst=CLIENT, ttl=63)
        / ICMP(type=3, code=3)
        / IP(src=CLIENT, dst=NODE, ttl=64)
        / UDP(sport=40031, dport=30053)
        / Raw(QUERY),
        counters={Counter.ICMP_XLATED: 1},
        flows=(DNS_LOCAL_FLOW,),
        after=(DNS_LOCAL_NEW,),
    ),
    Case(
        "the node's own fragmentation needed about a DNATed packet: about the frontend",
        Program.TC_EGRESS,
        Ether(src=MAC["eth0"], dst=MAC[CLIENT])
        / IP(src=NODE_ETH1, dst=CLIENT)
        / ICMP(type=3, code=4, nexthopmtu=1400)
        / IP(src=CLIENT, dst=POD_LOCAL)
        / TCP(sport=40000, dport=8080, flags="S"),
        OK,
        Ether(src=MAC["eth0"], dst=MAC[CLIENT])
        / IP(src=NODE, dst=CLIENT)
        / ICMP(type=3, code=4, nexthopmtu=1400)
        / IP(src=CLIENT, dst=NODE)
        / TCP(sport=40000, dport=30080, flags="S"),
        counters={Counter.ICMP_XLATED: 1},
        flows=(LOCAL_FLOW,),
        after=(LOCAL_NEW,),
    ),
    *ingress(
        "an ICMP error about no flow of ours passes untouched",
        Ether(src=MAC[NODE2], dst=MAC["eth1"])
        / IP(src=ROUTER, dst=NODE_ETH1)
        / ICMP(type=3, code=4, nexthopmtu=1400)
        / IP(src=NODE_ETH1, dst=POD_NODE2)
        / TCP(sport=50000, dport=8080),
        (OK, PASS),
        SAME,
        link="eth1",
    ),
    Case(
        "an ICMP error about a translated flow goes on to tc",
        Program.XDP,
        lambda port: (
            Ether(src=MAC[NODE2], dst=MAC["eth1"])
            / IP(src=ROUTER, dst=NODE_ETH1)
            / ICMP(type=3, code=4, nexthopmtu=1400)
            / IP(src=NODE_ETH1, dst=POD_NODE2, ttl=63)
            / TCP(sport=port, dport=8080, flags="S")
        ),
        PASS,
        SAME,
        flows=(REMOTE_FLOW,),
        after=(REMOTE_NEW,),
        link="eth1",
    ),
    Case(
        "IPv6: packet too big from beyond the node about a SNATed packet: to the client",
        Program.TC_INGRESS,
        lambda port: (
            Ether(src=MAC[NODE2_6], dst=MAC["eth1"])
            / IPv6(src=ROUTER6, dst=NODE6_ETH1)
            / ICMPv6PacketTooBig(mtu=1400)
            / IPv6(src=NODE6_ETH1, dst=POD6_NODE2, hlim=63)
            / TCP(sport=port, dport=8080, flags="S")
        ),
        OK,
        Ether(src=MAC[NODE2_6], dst=MAC["eth1"])
        / IPv6(src=ROUTER6, dst=CLIENT6)
        / ICMPv6PacketTooBig(mtu=1400)
        / IPv6(src=CLIENT6, dst=NODE6, hlim=63)
        / TCP(sport=40001, dport=30181, flags="S"),
        counters={Counter.ICMP_XLATED: 1},
        flows=(REMOTE6_FLOW,),
        after=(REMOTE6_NEW,),
        link="eth1",
    ),
    Case(
        "IPv6: a local backend's port unreachable leaving to the client: about the frontend",
        Program.TC_EGRESS,
        Ether(src=MAC["eth0"], dst=MAC[CLIENT6])
        / IPv6(src=POD6_LOCAL, dst=CLIENT6, hlim=63)
        / ICMPv6DestUnreach(code=4)
        / IPv6(src=CLIENT6, dst=POD6_LOCAL)
        / TCP(sport=40000, dport=8080, flags="S"),
        OK,
        Ether(src=MAC["eth0"], dst=MAC[CLIENT6])
        / IPv6(src=NODE6, dst=CLIENT6, hlim=63)
        / ICMPv6DestUnreach(code=4)
        / IPv6(src=CLIENT6, dst=NODE6)
        / TCP(sport=40000, dport=30180, flags="S"),
        counters={Counter.ICMP_XLATED: 1},
        flows=(LOCAL6_FLOW,),
        after=(LOCAL6_NEW,),
    ),
    # ---- IP fragments: the later ones follow their first ----
    Case(
        FRAG_FIRST,
        Program.TC_INGRESS,
        client(
            40040,
            (NODE, 30054),
            proto=Proto.UDP,
            payload=FRAG_HEAD,
            frag_id=0x1234,
            more_fragments=True,
        ),
        REDIRECT,
        snat_to(
            "eth1",
            NODE2,
            (POD_NODE2, 5353),
            proto=Proto.UDP,
            payload=FRAG_HEAD,
            frag_id=0x1234,
            more_fragments=True,
        ),
        counters={NEW: 1, Counter.FRAGMENT: 1},
        flows=(FRAG_FLOW,),
    ),
    Case(
        "a later fragment follows its first: translated as it was (addresses only)",
        Program.TC_INGRESS,
        client(
            40040, (NODE, 30054), proto=Proto.UDP, payload=FRAG_TAIL, frag_id=0x1234, frag_offset=3
        ),
        REDIRECT,
        snat_to(
            "eth1",
            NODE2,
            (POD_NODE2, 5353),
            proto=Proto.UDP,
            payload=FRAG_TAIL,
            frag_id=0x1234,
            frag_offset=3,
        ),
        counters={FWD: 1, Counter.FRAGMENT: 1},
        flows=(replace(FRAG_FLOW, packets=2),),
        after=(FRAG_FIRST,),
    ),
    Case(
        "a later fragment whose first was not seen (reordered, lost): passed, counted",
        Program.TC_INGRESS,
        client(
            40040, (NODE, 30054), proto=Proto.UDP, payload=FRAG_TAIL, frag_id=0x9999, frag_offset=3
        ),
        OK,
        SAME,
        counters={Counter.FRAG_UNKNOWN: 1},
    ),
    Case(
        "a fragment goes on to tc, which translates fragments",
        Program.XDP,
        client(
            40040,
            (NODE, 30054),
            proto=Proto.UDP,
            payload=FRAG_HEAD,
            frag_id=0x1234,
            more_fragments=True,
        ),
        PASS,
        SAME,
    ),
    Case(
        "the first fragment of a reply to a SNATed flow: back to the client's view",
        Program.TC_INGRESS,
        Frame(
            MAC[NODE2],
            MAC["eth1"],
            (POD_NODE2, 5353),
            (NODE_ETH1, Ref.SNAT_PORT),
            Proto.UDP,
            payload=FRAG_HEAD,
            frag_id=0x4321,
            more_fragments=True,
        ),
        REDIRECT,
        Frame(
            MAC["eth0"],
            MAC[CLIENT],
            (NODE, 30054),
            (CLIENT, 40040),
            Proto.UDP,
            ttl=63,
            payload=FRAG_HEAD,
            frag_id=0x4321,
            more_fragments=True,
        ),
        counters={REPLY: 1, Counter.FRAGMENT: 1},
        flows=(replace(FRAG_FLOW, flags=CtFlags.REPLY_SEEN),),
        after=(FRAG_FIRST,),
        link="eth1",
    ),
    Case(
        "a later fragment of a reply follows its first",
        Program.TC_INGRESS,
        Frame(
            MAC[NODE2],
            MAC["eth1"],
            (POD_NODE2, 5353),
            (NODE_ETH1, Ref.SNAT_PORT),
            Proto.UDP,
            payload=FRAG_TAIL,
            frag_id=0x4321,
            frag_offset=3,
        ),
        REDIRECT,
        Frame(
            MAC["eth0"],
            MAC[CLIENT],
            (NODE, 30054),
            (CLIENT, 40040),
            Proto.UDP,
            ttl=63,
            payload=FRAG_TAIL,
            frag_id=0x4321,
            frag_offset=3,
        ),
        counters={REPLY: 1, Counter.FRAGMENT: 1},
        flows=(replace(FRAG_FLOW, flags=CtFlags.REPLY_SEEN),),
        after=(
            FRAG_FIRST,
            "the first fragment of a reply to a SNATed flow: back to the client's view",
        ),
        link="eth1",
    ),
    Case(
        "a local backend's fragmented reply: every fragment from the frontend",
        Program.TC_EGRESS,
        Frame(
            MAC["eth0"],
            MAC[CLIENT],
            (POD_LOCAL, 5353),
            (CLIENT, 40031),
            Proto.UDP,
            ttl=63,
            payload=FRAG_TAIL,
            frag_id=0x2222,
            frag_offset=3,
        ),
        OK,
        Frame(
            MAC["eth0"],
            MAC[CLIENT],
            (NODE, 30053),
            (CLIENT, 40031),
            Proto.UDP,
            ttl=63,
            payload=FRAG_TAIL,
            frag_id=0x2222,
            frag_offset=3,
        ),
        counters={REPLY: 1, Counter.FRAGMENT: 1},
        flows=(replace(DNS_LOCAL_FLOW, flags=CtFlags.REPLY_SEEN),),
        after=(DNS_LOCAL_NEW, "a local backend's fragmented reply: its first fragment"),
    ),
    Case(
        "a local backend's fragmented reply: its first fragment",
        Program.TC_EGRESS,
        Frame(
            MAC["eth0"],
            MAC[CLIENT],
            (POD_LOCAL, 5353),
            (CLIENT, 40031),
            Proto.UDP,
            ttl=63,
            payload=FRAG_HEAD,
            frag_id=0x2222,
            more_fragments=True,
        ),
        OK,
        Frame(
            MAC["eth0"],
            MAC[CLIENT],
            (NODE, 30053),
            (CLIENT, 40031),
            Proto.UDP,
            ttl=63,
            payload=FRAG_HEAD,
            frag_id=0x2222,
            more_fragments=True,
        ),
        counters={REPLY: 1, Counter.FRAGMENT: 1},
        flows=(replace(DNS_LOCAL_FLOW, flags=CtFlags.REPLY_SEEN),),
        after=(DNS_LOCAL_NEW,),
    ),
    Case(
        FRAG_FIRST6,
        Program.TC_INGRESS,
        client6(
            40041,
            (NODE6, 30153),
            proto=Proto.UDP,
            payload=FRAG_HEAD,
            frag_id=0x5678,
            more_fragments=True,
        ),
        REDIRECT,
        snat6_to(
            NODE2_POD6, proto=Proto.UDP, payload=FRAG_HEAD, frag_id=0x5678, more_fragments=True
        ),
        counters={NEW: 1, Counter.FRAGMENT: 1},
        flows=(FRAG6_FLOW,),
    ),
    Case(
        "IPv6: a later fragment follows its first",
        Program.TC_INGRESS,
        client6(
            40041, (NODE6, 30153), proto=Proto.UDP, payload=FRAG_TAIL, frag_id=0x5678, frag_offset=3
        ),
        REDIRECT,
        snat6_to(NODE2_POD6, proto=Proto.UDP, payload=FRAG_TAIL, frag_id=0x5678, frag_offset=3),
        counters={FWD: 1, Counter.FRAGMENT: 1},
        flows=(replace(FRAG6_FLOW, packets=2),),
        after=(FRAG_FIRST6,),
    ),
    Case(
        "IPv6: a later fragment whose first was not seen: passed, counted",
        Program.TC_INGRESS,
        client6(
            40041, (NODE6, 30153), proto=Proto.UDP, payload=FRAG_TAIL, frag_id=0x9999, frag_offset=3
        ),
        OK,
        SAME,
        counters={Counter.FRAG_UNKNOWN: 1},
    ),
    # ---- UDP checksums ----
    *ingress(
        "UDP without a checksum (0) keeps none",
        client(40020, (NODE, 30053), proto=Proto.UDP, payload=b"ebpflb", udp_checksum=0),
        (OK, PASS),
        to_pod(40020, (POD_LOCAL, 5353), proto=Proto.UDP, payload=b"ebpflb", udp_checksum=0),
        counters={NEW: 1},
        flows=(FlowRow((CLIENT, 40020), (NODE, 30053), (POD_LOCAL, 5353), Proto.UDP),),
    ),
    *ingress(
        "UDP whose checksum becomes 0 is sent as 0xffff",
        client(40021, (NODE, 30053), proto=Proto.UDP, payload=ZERO_SUM_PAYLOAD),
        (OK, PASS),
        to_pod(40021, (POD_LOCAL, 5353), proto=Proto.UDP, payload=ZERO_SUM_PAYLOAD),
        counters={NEW: 1},
        flows=(FlowRow((CLIENT, 40021), (NODE, 30053), (POD_LOCAL, 5353), Proto.UDP),),
    ),
    # ---- IPv6: the same paths, and what only IPv6 has ----
    *ingress(
        LOCAL6_NEW,
        client6(40000, (NODE6, 30180)),
        (OK, PASS),
        to_pod6(40000, LOCAL6),
        counters={NEW: 1},
        flows=(LOCAL6_FLOW,),
    ),
    Case(
        "IPv6: reply from a local backend: source restored to the frontend",
        Program.TC_EGRESS,
        Frame(MAC["eth0"], MAC[CLIENT6], LOCAL6, (CLIENT6, 40000), tcp_flags="SA", ttl=63),
        OK,
        Frame(MAC["eth0"], MAC[CLIENT6], (NODE6, 30180), (CLIENT6, 40000), tcp_flags="SA", ttl=63),
        counters={REPLY: 1},
        flows=(FlowRow((CLIENT6, 40000), (NODE6, 30180), LOCAL6, flags=CtFlags.REPLY_SEEN),),
        after=(LOCAL6_NEW,),
    ),
    *ingress(
        REMOTE6_NEW,
        client6(40001, (NODE6, 30181)),
        (REDIRECT, XREDIRECT),
        snat6_to(NODE2_POD6),
        counters={NEW: 1},
        flows=(REMOTE6_FLOW,),
    ),
    *ingress(
        "IPv6: reply to a SNATed flow: back to the client's view, forwarded",
        Frame(MAC[NODE2_6], MAC["eth1"], NODE2_POD6, (NODE6_ETH1, Ref.SNAT_PORT), tcp_flags="SA"),
        (REDIRECT, XREDIRECT),
        Frame(MAC["eth0"], MAC[CLIENT6], (NODE6, 30181), (CLIENT6, 40001), tcp_flags="SA", ttl=63),
        counters={REPLY: 1},
        flows=(
            FlowRow(
                (CLIENT6, 40001),
                (NODE6, 30181),
                NODE2_POD6,
                snat=NODE6_ETH1,
                flags=CtFlags.REPLY_SEEN,
            ),
        ),
        after=(REMOTE6_NEW,),
        link="eth1",
    ),
    *ingress(
        "IPv6: UDP to a remote backend: its (mandatory) checksum updated",
        client6(40002, (NODE6, 30153), proto=Proto.UDP, payload=b"query"),
        (REDIRECT, XREDIRECT),
        snat6_to(NODE2_POD6, proto=Proto.UDP, payload=b"query"),
        counters={NEW: 1},
        flows=(FlowRow((CLIENT6, 40002), (NODE6, 30153), NODE2_POD6, Proto.UDP, snat=NODE6_ETH1),),
    ),
    *ingress(
        "IPv6: hop limit 1 on a packet this node must forward: dropped",
        client6(40001, (NODE6, 30181), ttl=1),
        (SHOT, DROP),
        UNCHECKED,
        counters={NEW: 1},
        flows=(REMOTE6_FLOW,),
    ),
    *ingress(
        "IPv6: a hop-by-hop options header: the ports are found behind it",
        ETHER6
        / IPv6(src=CLIENT6, dst=NODE6)
        / IPv6ExtHdrHopByHop(options=[RouterAlert()])
        / TCP(sport=40000, dport=30180, flags="S"),
        (OK, PASS),
        ETHER6
        / IPv6(src=CLIENT6, dst=POD6_LOCAL)
        / IPv6ExtHdrHopByHop(options=[RouterAlert()])
        / TCP(sport=40000, dport=8080, flags="S"),
        counters={NEW: 1},
        flows=(LOCAL6_FLOW,),
    ),
    Case(
        "IPv6: the first fragment of a datagram to a local backend: DNAT",
        Program.TC_INGRESS,
        ETHER6
        / IPv6(src=CLIENT6, dst=NODE6)
        / IPv6ExtHdrFragment(m=1, id=7)
        / TCP(sport=40000, dport=30180, flags="S"),
        OK,
        ETHER6
        / IPv6(src=CLIENT6, dst=POD6_LOCAL)
        / IPv6ExtHdrFragment(m=1, id=7)
        / TCP(sport=40000, dport=8080, flags="S"),
        counters={NEW: 1, Counter.FRAGMENT: 1},
        flows=(LOCAL6_FLOW,),
    ),
    Case(
        "IPv6: a fragment goes on to tc",
        Program.XDP,
        ETHER6
        / IPv6(src=CLIENT6, dst=NODE6)
        / IPv6ExtHdrFragment(m=1, id=7)
        / TCP(sport=40000, dport=30180, flags="S"),
        PASS,
        SAME,
    ),
    Case(
        "IPv6: more extension headers than the programs walk: untouched, counted",
        Program.TC_INGRESS,
        ETHER6 / IPv6(src=CLIENT6, dst=NODE6) / TOO_MANY_HEADERS / TCP(dport=30180),
        OK,
        SAME,
        counters={Counter.NP6_EXT_HEADER: 1},
    ),
    Case(
        "IPv6: more extension headers than the programs walk: XDP leaves them to tc",
        Program.XDP,
        ETHER6 / IPv6(src=CLIENT6, dst=NODE6) / TOO_MANY_HEADERS / TCP(dport=30180),
        PASS,
        SAME,
    ),
    Case(
        "IPv6: a routing header (the destination is not the final one): untouched, counted",
        Program.TC_INGRESS,
        ETHER6
        / IPv6(src=CLIENT6, dst=NODE6)
        / IPv6ExtHdrRouting(addresses=[POD6_LOCAL])
        / TCP(dport=30180),
        OK,
        SAME,
        counters={Counter.NP6_EXT_HEADER: 1},
    ),
    *ingress(
        "IPv6: neighbour solicitation passes untouched",
        Ether(src=MAC[CLIENT6], dst="33:33:ff:00:00:01")
        / IPv6(src=CLIENT6, dst="ff02::1:ff00:1")
        / ICMPv6ND_NS(tgt=NODE6),
        (OK, PASS),
        SAME,
    ),
    *ingress(
        "IPv6: an ICMPv6 error passes untouched",
        Ether(src=MAC[NODE2_6], dst=MAC["eth1"])
        / IPv6(src=NODE2_6, dst=NODE6)
        / ICMPv6DestUnreach(code=4)
        / IPv6(src=NODE6, dst=POD6_NODE2)
        / TCP(sport=50000, dport=8080),
        (OK, PASS),
        SAME,
        link="eth1",
    ),
    Case(
        "IPv6: a service with no endpoint at all: ICMPv6 port unreachable from the frontend",
        Program.TC_INGRESS,
        client6(40000, (NODE6, 30185)),
        REDIRECT,
        Ether(src=MAC["eth0"], dst=MAC[CLIENT6])
        / IPv6(src=NODE6, dst=CLIENT6, hlim=64)
        / ICMPv6DestUnreach(code=4)
        / Raw(bytes(IPv6(src=CLIENT6, dst=NODE6) / TCP(sport=40000, dport=30185))[:48]),
        counters={Counter.NP_NO_BACKEND: 1, Counter.NP_REJECT: 1},
    ),
    Case(
        "IPv6: a service with no endpoint at all: XDP leaves the answer to tc",
        Program.XDP,
        client6(40000, (NODE6, 30185)),
        PASS,
        SAME,
    ),
)
