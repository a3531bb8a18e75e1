"""The harness behind tests/kernel/nodeport/test_packets.py: the node of packet_cases in a network
namespace, the real programs and control plane on it, each case's packets run through
BPF_PROG_TEST_RUN and the outcome compared with the table, and timed runs.

Frames are built and dissected with scapy; a difference is reported field by field
(layer.field: expected != actual), so a checksum the program updated wrongly shows as
`TCP.chksum: 0x7b4f != 0x7798` next to whatever else differs.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address
from pathlib import Path
from typing import Any

from scapy.layers.inet import IP, TCP, UDP, IPOption
from scapy.layers.inet6 import IPv6, IPv6ExtHdrFragment
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw

from ebpflb.config import Config, XdpMode
from ebpflb.datapath.contract import Counter, CtFlags, NatFlags
from ebpflb.datapath.maps import PRIMARY_IFINDEX, AddrPort, InterfaceAddresses, pins
from ebpflb.datapath.maps.kernel import KernelMapSet
from ebpflb.datapath.programs import loader, podlb, testrun
from ebpflb.desired import NodeView, frontends_for_port
from ebpflb.model import Frontend, Proto
from ebpflb.reconcile import Reconciler
from lab.harness.netns import Namespaces, sh
from tests.kernel.nodeport import packet_cases as pc
from tests.kernel.nodeport.packet_cases import Case, FlowRow, Out, Program, Ref

BPFFS = Path("/sys/fs/bpf")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


@contextmanager
def inside(netns: str) -> Iterator[None]:
    """This thread in network namespace `netns` (setns), and back afterwards."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {netns}")
        try:
            yield
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the test's namespace")
    finally:
        os.close(own)
        os.close(target)


def build_node(namespaces: Namespaces) -> tuple[str, dict[str, int]]:
    """The node of packet_cases in a namespace of its own: (its name, ifindex by link)."""
    netns = namespaces.add_namespace("node", forwarding=True)
    for link in pc.LINKS:
        namespaces.link(netns, link.name, netns, f"peer-{link.name}")
        sh("ip", "-n", netns, "link", "set", link.name, "address", link.mac)
        if link.address:
            sh("ip", "-n", netns, "addr", "add", f"{link.address}/24", "dev", link.name)
        if link.address6:
            sh("ip", "-n", netns, "addr", "add", f"{link.address6}/64", "dev", link.name)
        for address, mac in link.neighbours.items():
            neigh = ["neigh", "replace", address, "lladdr", mac, "dev", link.name]
            sh("ip", "-n", netns, *neigh, "nud", "permanent")
    for prefix, via in pc.ROUTES.items():
        # "dev NAME": on the link, no gateway (an interface without an address of its own)
        hop = via.split() if via.startswith("dev ") else ["via", via]
        sh("ip", "-n", netns, "route", "add", prefix, *hop)
    shown = subprocess.run(
        ["ip", "-n", netns, "-j", "link", "show"], check=True, capture_output=True, text=True
    )
    return netns, {link["ifname"]: link["ifindex"] for link in json.loads(shown.stdout)}


@dataclass
class Datapath:
    netns: str
    nodeport: loader.NodePortLB
    maps: KernelMapSet
    ifindex: dict[str, int]
    config: Config
    pods: podlb.PodLB | None = None  # the pod-interface variant, when asked for

    def program_fd(self, program: Program) -> int:
        name = PROGRAM_NAMES[program]
        if program in (Program.POD_INGRESS, Program.POD_EGRESS):
            assert self.pods is not None, "open_datapath(pods=True) loads the pod programs"
            return self.pods.programs.fds[name]
        return self.nodeport.program_fd(name)

    def run(
        self, program: Program, frame: bytes, link: str, repeat: int = 1, gso_size: int = 0
    ) -> testrun.ProgramRun:
        fd, name = self.program_fd(program), PROGRAM_NAMES[program]
        with inside(self.netns):
            if program is Program.XDP:
                assert not gso_size, "an XDP buffer has no GSO"
                return testrun.run_xdp(fd, frame, self.ifindex[link], repeat=repeat, name=name)
            return testrun.run_tc(
                fd, frame, self.ifindex[link], repeat=repeat, name=name, gso_size=gso_size
            )

    def forget_flows(self) -> None:
        for table in (self.maps.conntrack, self.maps.reply_nat):
            for key, _ in list(table.items()):
                table.delete(key)

    def start(self, after: tuple[str, ...], program: Program) -> Flows:
        """No flows but those the packets of the cases named in `after` make."""
        self.forget_flows()
        flows = Flows(self)
        for name in after:
            prior = prerequisite(name, program)
            self.run(prior.program, build(prior.packet, flows.snat_port), prior.link)
        return flows


PROGRAM_NAMES = {
    Program.TC_INGRESS: loader.NodePortLB.INGRESS,
    Program.TC_EGRESS: loader.NodePortLB.EGRESS,
    Program.XDP: loader.NodePortLB.XDP,
    Program.POD_INGRESS: podlb.INGRESS,
    Program.POD_EGRESS: podlb.EGRESS,
}


@contextmanager
def open_datapath(
    *, pods: bool = False, cases: tuple[Case, ...] = (), **config_overrides: Any
) -> Iterator[Datapath]:
    """The node's namespace, the programs compiled and loaded into a private pin directory,
    the services programmed; all removed again on leaving, also after a failure.
    `pods`: the pod-interface programs too; `cases`: tables besides packet_cases' whose
    cases `after` may name; `config_overrides`: Config fields a test needs otherwise (e.g.
    a longer lifetime)."""
    namespaces = Namespaces(f"elb{uuid.uuid4().hex[:6]}")
    pin_dir = BPFFS / f"ebpflb-test-{uuid.uuid4().hex[:8]}"
    nodeport: loader.NodePortLB | None = None
    pod_lb: podlb.PodLB | None = None
    BY_ID.update({case.id: case for case in cases})
    try:
        netns, ifindex = build_node(namespaces)
        config = Config(
            bpffs_dir=pin_dir,
            xdp=XdpMode.NATIVE,  # compiles the XDP program too; nothing is attached
            slot_pool_size=8192,  # every frontend of SERVICES, on both families
            maglev_max_table_size=1021,
            max_services=256,
            max_backends=256,
            rev_sk_max=64,
            ct_max=16384,
            rnat_max=16384,
            src_range_max=64,
            snat_port_min=pc.SNAT_PORTS[0],
            snat_port_max=pc.SNAT_PORTS[1],
        )
        config = dataclasses.replace(config, **config_overrides)
        pins.ensure_bpffs(pin_dir)
        nodeport = loader.NodePortLB(config, loader.Features(set_retval=False))
        if pods:
            pod_lb = podlb.PodLB(config, loader.Features(set_retval=False))
        with KernelMapSet(pin_dir) as maps:
            maps.set_interface_addresses(
                InterfaceAddresses(
                    {
                        **{
                            ifindex[link.name]: IPv4Address(link.address)
                            for link in pc.LINKS
                            if link.address
                        },
                        PRIMARY_IFINDEX: IPv4Address(pc.PRIMARY),
                    },
                    {  # no IPv6 primary: a flow leaving by eth2 finds no IPv6 source
                        ifindex[link.name]: IPv6Address(link.address6)
                        for link in pc.LINKS
                        if link.address6
                    },
                )
            )
            maps.set_interface_mtus({ifindex[link.name]: pc.MTU for link in pc.LINKS})
            addresses = tuple(
                ip_address(address)
                for link in pc.LINKS
                for address in (link.address, link.address6)
                if address
            )
            node = NodeView(pc.NODE_NAME, addresses)
            desired = {
                port.name.service: {d.frontend: d for d in frontends_for_port(port, eps, node)}
                for port, eps in pc.SERVICES
            }
            result = Reconciler(maps, hash_seed=config.hash_seed).apply(desired, full=True)
            assert result.errors == [] and result.added > 0
            yield Datapath(netns, nodeport, maps, ifindex, config, pod_lb)
    finally:
        if pod_lb is not None:
            pod_lb.close()
        if nodeport is not None:
            nodeport.close()
        pins.remove_pins(pin_dir)
        namespaces.close()


# ---- frames ------------------------------------------------------------------------------


def build(frame: pc.Packetish, snat_port: Callable[[], int]) -> bytes:
    if isinstance(frame, Packet):
        return bytes(frame)
    if callable(frame):  # a packet written around the flow's SNAT port
        return bytes(frame(snat_port()))

    def port(value: int | Ref) -> int:
        return snat_port() if value is Ref.SNAT_PORT else value

    options = [IPOption(frame.ip_options)] if frame.ip_options else []
    ip: Packet
    if ":" in frame.src[0]:
        ip = IPv6(src=frame.src[0], dst=frame.dst[0], hlim=frame.ttl)
        if frame.frag_id is not None:
            ip = ip / IPv6ExtHdrFragment(
                id=frame.frag_id, offset=frame.frag_offset, m=int(frame.more_fragments)
            )
    else:
        flags = frame.ip_flags or ("MF" if frame.more_fragments else "")
        ip = IP(
            src=frame.src[0],
            dst=frame.dst[0],
            ttl=frame.ttl,
            flags=flags,
            options=options,
            id=1 if frame.frag_id is None else frame.frag_id,
            frag=frame.frag_offset,
        )
    if frame.frag_offset:  # a later fragment: no L4 header, the datagram's bytes go on
        proto = 6 if frame.proto is Proto.TCP else 17
        if isinstance(ip, IP):
            ip.proto = proto
        else:
            ip[IPv6ExtHdrFragment].nh = proto
        return bytes(Ether(src=frame.smac, dst=frame.dmac) / ip / Raw(frame.payload))
    sport, dport = port(frame.src[1]), port(frame.dst[1])
    l4 = (
        TCP(sport=sport, dport=dport, flags=frame.tcp_flags)
        if frame.proto is Proto.TCP
        else UDP(sport=sport, dport=dport, chksum=frame.udp_checksum)
    )
    packet = Ether(src=frame.smac, dst=frame.dmac) / ip / l4
    if frame.payload:
        packet = packet / Raw(frame.payload)
    return bytes(packet)


def frame_diff(expected: bytes, actual: bytes) -> list[str]:
    """Field by field (layer.field: expected != actual), then any bytes left over."""
    want, got = Ether(expected), Ether(actual)
    lines = []
    layer_w, layer_g = want, got
    while layer_w and not isinstance(layer_w, Raw):
        if type(layer_g) is not type(layer_w):
            lines.append(f"layer: {layer_w.name} != {getattr(layer_g, 'name', None)}")
            break
        for desc in layer_w.fields_desc:
            a, b = layer_w.getfieldval(desc.name), layer_g.getfieldval(desc.name)
            if a != b:
                show = hex if desc.name in ("chksum", "len", "id") else str
                lines.append(f"{layer_w.name}.{desc.name}: {show(a)} != {show(b)}")  # type: ignore[operator]
        layer_w, layer_g = layer_w.payload, layer_g.payload
    if not lines and expected != actual:
        lines.append(f"bytes: {expected.hex()} != {actual.hex()}")
    return lines


# ---- running a case ------------------------------------------------------------------------

BY_ID = {case.id: case for case in pc.CASES}


def prerequisite(name: str, program: Program) -> Case:
    """The case `after` names: its variant for `program` when it has one."""
    if name in BY_ID:
        return BY_ID[name]
    same = f"{program.value}: {name}"
    if same in BY_ID:
        return BY_ID[same]
    found = [case for case in [*pc.CASES, *BY_ID.values()] if case.name == name]
    assert found, f"`after` names no case: {name!r}"
    return found[0]


def addr_port(pair: tuple[str, int]) -> AddrPort:
    return AddrPort(ip_address(pair[0]), pair[1])


@dataclass(frozen=True)
class CtRow:
    """A conntrack entry as the table and the diff show it."""

    client: AddrPort
    frontend: AddrPort
    proto: Proto
    backend: AddrPort
    flags: CtFlags
    snat: AddrPort | None
    packets: int
    svc_id: int

    def __str__(self) -> str:
        snat = f" snat {self.snat}" if self.snat else ""
        return (
            f"{self.client} -> {self.frontend}/{self.proto.name} => {self.backend}{snat}"
            f" flags {self.flags!r} packets {self.packets} svc {self.svc_id}"
        )


@dataclass(frozen=True)
class NatRow:
    """A reply translation: the reply's tuple -> the client's view."""

    source: AddrPort
    destination: AddrPort
    proto: Proto
    client: AddrPort
    frontend: AddrPort
    flags: NatFlags

    def __str__(self) -> str:
        return (
            f"{self.source} -> {self.destination}/{self.proto.name} => as {self.frontend} to"
            f" {self.client} flags {self.flags!r}"
        )


class Flows:
    """What the maps say of the flows now: the SNAT port, the conntrack and NAT rows."""

    def __init__(self, dp: Datapath) -> None:
        self.dp = dp

    def snat_port(self) -> int:
        ports = {e.snat.port for _, e in self.dp.maps.conntrack.items() if e.snat is not None}
        assert len(ports) == 1, f"Ref.SNAT_PORT needs one SNATed flow, conntrack has {ports}"
        (port,) = ports
        low, high = self.dp.config.snat_port_min, self.dp.config.snat_port_max
        assert low <= port <= high, f"SNAT port {port} outside the range {low}-{high}"
        return port

    def expected(self, rows: tuple[FlowRow, ...]) -> tuple[set[CtRow], set[NatRow]]:
        """The table's rows, and the reply translation each flow implies."""
        conntrack, nat = set(), set()
        for row in rows:
            snat = AddrPort(ip_address(row.snat), self.snat_port()) if row.snat else None
            client, frontend, backend = map(addr_port, (row.client, row.frontend, row.backend))
            entry = self.dp.maps.services.get(Frontend(frontend.address, frontend.port, row.proto))
            assert entry is not None, f"the table names no frontend {frontend}/{row.proto.name}"
            flags = row.flags | (CtFlags.SNAT if snat else CtFlags.NONE)
            conntrack.add(
                CtRow(client, frontend, row.proto, backend, flags, snat, row.packets, entry.svc_id)
            )
            nat_flags = NatFlags.SNAT if snat else NatFlags.NONE
            if row.reply_nat:
                nat.add(NatRow(backend, snat or client, row.proto, client, frontend, nat_flags))
        return conntrack, nat

    def diff(self, rows: tuple[FlowRow, ...]) -> list[str]:
        maps, now, lines = self.dp.maps, time.monotonic_ns(), []
        want_ct, want_nat = self.expected(rows)
        got_ct, got_nat = set(), set()
        lifetimes = {
            (addr_port(r.client), addr_port(r.frontend), r.proto): r.lifetime_s
            for r in rows
            if r.lifetime_s is not None
        }
        for key, e in maps.conntrack.items():
            src, dst, proto = key.source, key.destination, key.protocol
            want_s = lifetimes.get((src, dst, proto))
            left_s = (e.expires_ns - now) / 1e9
            if want_s is not None and not want_s - 5 < left_s <= want_s:
                lines.append(f"conntrack {src} -> {dst}: expires in {left_s:.1f} s, not {want_s}")
            got_ct.add(CtRow(src, dst, proto, e.backend, e.flags, e.snat, e.packets, e.svc_id))
            known = maps.backends.get(e.backend_id)
            if known is None or AddrPort(known.backend.address, known.backend.port) != e.backend:
                lines.append(
                    f"conntrack {src} -> {dst}: backend id {e.backend_id} is not {e.backend}"
                )
            if e.expires_ns <= now:
                lines.append(f"conntrack {src} -> {dst}: expired already")
        for key, n in maps.reply_nat.items():
            got_nat.add(
                NatRow(key.source, key.destination, key.protocol, n.client, n.frontend, n.flags)
            )
            if n.expires_ns <= now:
                lines.append(f"reply NAT {key.source} -> {key.destination}: expired already")
        for what, want, got in (("conntrack", want_ct, got_ct), ("reply NAT", want_nat, got_nat)):
            lines += [f"{what} missing:    {row}" for row in sorted(map(str, want - got))]
            lines += [f"{what} unexpected: {row}" for row in sorted(map(str, got - want))]
        return lines


def run_case(dp: Datapath, case: Case) -> list[str]:
    """Everything about `case` that differs from the table; [] when it holds."""
    flows = dp.start(case.after, case.program)
    frame = build(case.packet, flows.snat_port)
    before = dp.maps.counters()
    run = dp.run(case.program, frame, case.link, gso_size=case.gso_size)
    after = dp.maps.counters()
    problems = []
    if run.verdict != case.verdict:
        problems.append(f"verdict: {case.verdict!r} != {run.verdict!r}")
    if case.out is Out.SAME:
        problems += frame_diff(frame, run.data)
    elif not isinstance(case.out, Out):
        problems += frame_diff(build(case.out, flows.snat_port), run.data)
    moved = {c: after[c.label] - before[c.label] for c in Counter}
    want = {c: case.counters.get(c, 0) for c in Counter}
    problems += [
        f"counter {c.label}: +{want[c]} != +{moved[c]}" for c in Counter if want[c] != moved[c]
    ]
    problems += flows.diff(case.flows)
    return problems


# ---- cost per packet -----------------------------------------------------------------------

RUNS = 1000  # single runs per measurement (each a syscall with a fresh copy of the frame)
REPEAT = 100_000  # repetitions in one syscall, for the paths that leave the frame as it was


@dataclass(frozen=True)
class Measurement:
    name: str
    verdict: testrun.Verdict
    counter: Counter | None  # moves by one per run (None: nothing moves)
    frames: Callable[[Flows], list[bytes]]  # one per run
    after: tuple[str, ...] = ()  # cases whose packets run first
    link: str = "eth0"
    repeatable: bool = False  # the frame leaves as it came: REPEAT in one syscall is honest
    program: Program = Program.TC_INGRESS


@dataclass(frozen=True)
class Timed:
    """What the kernel answered for one Measurement: each single run (verdict, duration),
    the one REPEAT run where the path allows it, and how far each counter moved."""

    measurement: Measurement
    single: tuple[testrun.ProgramRun, ...]
    repeated: testrun.ProgramRun | None
    moved: dict[str, int]  # counter label -> increase over all runs

    def expected_moves(self) -> dict[str, int]:
        """Its counter moved once per run, and no other counter moved."""
        counter = self.measurement.counter
        runs = len(self.single) + (self.repeated.repeat if self.repeated else 0)
        return {counter.label: runs} if counter else {}

    def figures(self) -> dict[str, object]:
        """The kernel's timings as reported (the test asserts the runs, not these)."""
        m = self.measurement
        durations = sorted(r.duration_ns for r in self.single)
        figures: dict[str, object] = {
            "program": PROGRAM_NAMES[m.program],
            "path": m.name,
            "single_median_ns": statistics.median_low(durations),
            "single_p10_ns": durations[len(durations) // 10],
        }
        if self.repeated is not None:
            figures["repeat_mean_ns"] = self.repeated.duration_ns
        return figures


def measure(dp: Datapath, m: Measurement) -> Timed:
    """Run `m` RUNS times (and REPEAT times in one syscall when that is honest) in the
    node's namespace; what the kernel answered."""
    frames = m.frames(dp.start(m.after, m.program))
    fd = dp.program_fd(m.program)
    run = testrun.run_xdp if m.program is Program.XDP else testrun.run_tc
    ifindex = dp.ifindex[m.link]
    before = dp.maps.counters()
    with inside(dp.netns):
        single = tuple(run(fd, frame, ifindex) for frame in frames)
        repeated = run(fd, frames[0], ifindex, repeat=REPEAT) if m.repeatable else None
    moved = {
        label: n - before[label] for label, n in dp.maps.counters().items() if n != before[label]
    }
    return Timed(m, single, repeated, moved)
