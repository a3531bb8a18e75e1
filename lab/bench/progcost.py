"""What one packet costs ebpflb's NodePort programs on the bench's running agent, measured
by the kernel (BPF_PROG_TEST_RUN, ebpflb.datapath.programs.testrun): the programs the agent
attached, its maps holding the run's N services, frames as the external client sends them
to the NodePort on the node's eth0. The figure to set beside a packet generator's rate
(what a veth and the stack around the program add is the rest of a request's cost).

Paths, each named with the verdict it must give (a run that took another path is an
error, not a figure):
- a new flow: a SYN from a fresh source port each run (the Maglev pick, a conntrack entry
  made, SNAT for the remote backend, the route looked up, the frame rewritten);
- a known flow: an ACK of the first new flow (a conntrack hit, the same rewrite);
- not a NodePort: a SYN to a port nothing serves on the node (what every other packet
  of the node pays), run REPEAT times in one call as its frame leaves unchanged.

A translated frame is no longer the frame measured, so the flows' figures come from RUNS
single runs on fresh copies (median and p10; the kernel's timer around one run adds its
own few tens of ns, which the repeated path shows by difference). The programs' sizes
come from the kernel: instructions after the verifier (xlated) and JITed bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ebpflb.datapath.programs import testrun
from ebpflb.datapath.syscall import bpfsys
from ebpflb.errors import EbpflbError
from lab.bench import scenario
from lab.bench.records.compare import ProgramCost, ProgramTime
from lab.bench.scenario import Family
from lab.harness.nshttp import thread_in_netns

RUNS = 201  # single runs per flow path
REPEAT = 10_000  # runs in one call for the path that leaves its frame unchanged
CLOSED_PORT = 9  # discard: served by nothing on the node
FIRST_SPORT = 20_000  # the new flows' source ports: RUNS of them from here

Frame = Callable[[int, str, int], bytes]  # (source port, TCP flags, port) -> the frame


@dataclass(frozen=True)
class Program:
    """One of the agent's pinned programs and how the kernel runs it on a frame."""

    function: str  # the C entry point, as pinned: prog-<hash>-<function>
    hook: str  # "tc" or "xdp"

    def run(self, fd: int, frame: bytes, ifindex: int, repeat: int = 1) -> testrun.ProgramRun:
        runner = testrun.run_xdp if self.hook == "xdp" else testrun.run_tc
        return runner(fd, frame, ifindex, repeat=repeat, name=self.function)


TC_INGRESS = Program("ebpflb_np_in", "tc")
XDP = Program("ebpflb_np_xdp", "xdp")


def link(netns: str, dev: str) -> dict[str, object]:
    """`ip -j link show` of one interface: its address, ifindex, ..."""
    shown = subprocess.run(
        ["ip", "-n", netns, "-j", "link", "show", "dev", dev],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return dict(json.loads(shown.stdout)[0])


def tcp_frames(family: Family, client: str, node: str, client_mac: str, node_mac: str) -> Frame:
    """TCP frames from the external client to a port of the node."""
    from scapy.layers.inet import IP, TCP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether

    def frame(sport: int, flags: str, port: int) -> bytes:
        ip = IPv6(src=client, dst=node) if family is Family.IPV6 else IP(src=client, dst=node)
        seq, ack = (1000, 0) if flags == "S" else (1001, 1)
        tcp = TCP(sport=sport, dport=port, flags=flags, seq=seq, ack=ack, window=64240)
        return bytes(Ether(src=client_mac, dst=node_mac) / ip / tcp)

    return frame


def _pinned_fd(bpffs: Path, function: str) -> int:
    found = sorted(bpffs.glob(f"prog-*-{function}"))
    if len(found) != 1:
        raise EbpflbError(f"bench: expected one pinned {function} under {bpffs}, found {found}")
    return bpfsys.obj_get(str(found[0]))


def _cost(
    program: Program,
    path: str,
    runs: Sequence[testrun.ProgramRun],
    info: bpfsys.ProgInfo,
    repeated: testrun.ProgramRun | None = None,
) -> ProgramCost:
    durations = sorted(r.duration_ns for r in runs)
    return ProgramCost(
        program=program.function,
        path=path,
        verdict=getattr(runs[0].verdict, "name", str(runs[0].verdict)),
        runs=len(runs) + (repeated.repeat if repeated else 0),
        median_ns=statistics.median_low(durations),
        p10_ns=durations[len(durations) // 10],
        repeat_mean_ns=repeated.duration_ns if repeated else None,
        instructions=info.xlated_insns,
        jited_bytes=info.jited_bytes,
    )


def measure(
    program: Program, bpffs: Path, netns: str, ifindex: int, frame: Frame, node_port: int
) -> tuple[ProgramCost, ...]:
    """The three paths through `program` (pinned under `bpffs`) for frames arriving on
    `ifindex` of `netns`, the flows to `node_port`."""
    fd = _pinned_fd(bpffs, program.function)
    try:
        info = bpfsys.prog_info(fd, program.function)
        first = FIRST_SPORT
        with thread_in_netns(netns):  # bpf_fib_lookup resolves in the caller's namespace
            new = [program.run(fd, frame(first + i, "S", node_port), ifindex) for i in range(RUNS)]
            ack = frame(first, "A", node_port)
            known = [program.run(fd, ack, ifindex) for _ in range(RUNS)]
            closed = frame(first, "S", CLOSED_PORT)
            other = [program.run(fd, closed, ifindex) for _ in range(RUNS)]
            repeated = program.run(fd, closed, ifindex, repeat=REPEAT)
    finally:
        os.close(fd)
    costs = (
        _cost(program, "new flow (SYN)", new, info),
        _cost(program, "known flow (ACK)", known, info),
        _cost(program, "not a NodePort", other, info, repeated),
    )
    verdicts = {c.path: c.verdict for c in costs}
    for name, runs in (("new flow (SYN)", new), ("known flow (ACK)", known)):
        if len({r.verdict for r in runs}) != 1:
            raise EbpflbError(f"bench: {program.function} {name}: verdicts differ between runs")
    if verdicts["new flow (SYN)"] == verdicts["not a NodePort"]:
        raise EbpflbError(
            f"bench: {program.function} gave the NodePort's SYN the verdict of a packet for"
            f" no service ({verdicts['not a NodePort']}): not the path measured"
        )
    return costs


BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


@contextlib.contextmanager
def bpf_stats() -> Iterator[None]:
    """Every BPF program's runs timed (kernel.bpf_stats_enabled) for the block; the setting
    as it was afterwards. Timing costs each run two clock reads: never on while a figure of
    the data plane is measured."""
    previous = BPF_STATS.read_text().strip()
    BPF_STATS.write_text("1\n")
    try:
        yield
    finally:
        BPF_STATS.write_text(previous + "\n")


def run_totals(bpffs: Path, prefix: str = "ebpflb_np_") -> dict[str, tuple[int, int]]:
    """Each program pinned under `bpffs` whose function starts with `prefix`: (run_time_ns,
    run_cnt) so far (0, 0 while bpf_stats was never on)."""
    totals = {}
    for pin in sorted(bpffs.glob(f"prog-*-{prefix}*")):
        shown = subprocess.run(
            ["bpftool", "-j", "prog", "show", "pinned", str(pin)],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
        info = json.loads(shown.stdout)
        function = pin.name.split("-", 2)[2]
        totals[function] = (int(info.get("run_time_ns", 0)), int(info.get("run_cnt", 0)))
    return totals


def per_exchange(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], exchanges: int
) -> tuple[ProgramTime, ...]:
    """Each program's time and runs between two run_totals, per exchange."""
    if exchanges <= 0:
        return ()
    return tuple(
        ProgramTime(
            program=name,
            ns_per_exchange=(after[name][0] - before.get(name, (0, 0))[0]) / exchanges,
            runs_per_exchange=(after[name][1] - before.get(name, (0, 0))[1]) / exchanges,
        )
        for name in sorted(after)
        if after[name][1] > before.get(name, (0, 0))[1]
    )


def measure_nodeport(
    program: Program, bpffs: Path, node_netns: str, external_netns: str, family: Family
) -> tuple[ProgramCost, ...]:
    """`program` on the bench topology's eth0 (lab.bench.topology): the external client's
    frames to the NodePort service."""
    from lab.bench.topology import ADDRESSES

    a = ADDRESSES[family]
    node_link, client_link = link(node_netns, "eth0"), link(external_netns, "eth0")
    frame = tcp_frames(
        family, a.external, a.node, str(client_link["address"]), str(node_link["address"])
    )
    ifindex = int(str(node_link["ifindex"]))
    return measure(program, bpffs, node_netns, ifindex, frame, scenario.NODE_PORT)
