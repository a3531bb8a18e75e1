"""`ebpflb bench pps`: packets per second through a NodePort on one node core, per mode.

For each mode a fresh bench topology (lab.bench.topology: external -- node -- backends),
one UDP NodePort service whose endpoints are on another node (every mode SNATs, as
kube-proxy masquerades eTP Cluster traffic), and trafgen (lab.bench.pktgen) in the
external namespace sending 60-byte frames from `flows` source ports:

- the generator runs on GENERATOR_CPU. The node's eth0 receives as a NIC's queue does:
  NAPI (GRO on; a veth polls only then, or with XDP), its poll in a kernel thread pinned
  to NODE_CPU. Everything the node does for a packet (XDP, tc, netfilter, the route, the
  next veth) runs on that core, and its busy share is read from /proc/stat;
- the backends namespace counts and drops the frames at its eth0's ingress (an nftables
  netdev chain): UDP to the target port is delivered, UDP to any other port was
  mistranslated (a mode that delivers any is an error in the report);
- saturation: the generator as fast as it can; the figure is the median of `repeats`
  windows of delivered packets/s. A veth and the stack around the program cap it: plain
  forwarding (mode none: the frames addressed to a backend itself) is that cap;
- fixed rates: the node core's share at each offered rate, its idle share just before
  subtracted, and what that is per packet;
- ebpflb's modes: one more window at the first fixed rate with kernel.bpf_stats_enabled,
  each NodePort program's time per delivered packet. Beside the gap per packet to plain
  forwarding, it says how much of a miss is the programs themselves.

Modes: none, none-xdp-pass (the XDP floor), kube-proxy's iptables-legacy, iptables-nft and
nftables (lab.bench.modes), ebpflb (tc) and ebpflb-xdp.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ebpflb.errors import EbpflbError
from lab.bench import pktgen, progcost, scenario
from lab.bench.measure.machine import core_times, machine_facts, wait_until_quiet
from lab.bench.modes import AGENT_CPU, each_mode, ebpflb_agent, program_kube_proxy
from lab.bench.records.compare import ProgramTime, Verdict
from lab.bench.records.pps import FixedRate, Flood, PpsResult, PpsRun
from lab.bench.settings import KUBE_PROXY_MODES, CompareSettings, Mode, PpsSettings
from lab.bench.topology import NODE_INTERFACES, BenchTopology
from lab.harness.netns import attach_xdp_pass, sh

GENERATOR_CPU = 0  # trafgen pins its one sender to the first CPU
NODE_CPU = AGENT_CPU  # the node's receive queue; the agent idles there too
INGRESS = NODE_INTERFACES[0]
ENDPOINTS = 2  # the scenario's minimum
RAMP_S = 1.0  # after the generator starts: conntrack entries made, queues full
IDLE_S = 1.0  # the node core with no traffic, before each fixed rate
SINK = "ebpflb_bench_sink"  # the backends namespace's nftables table
TC_MIN_RATIO = 0.95  # ebpflb (tc) / none, as the request-rate target
XDP_MIN_RATIO = 0.99
ON_PATH = 0.5  # runs per delivered packet of a program on the flood's path
SATURATED = 0.9  # the node core's busy share that shows the generator was not the limit


def udp_services(settings: PpsSettings) -> list[scenario.BenchService]:
    service = scenario.bench_services(1, ENDPOINTS, family=settings.family)[0]
    return [dataclasses.replace(service, protocol="UDP")]


def _in_netns(netns: str, argv: list[str], stdin: str | None = None) -> str:
    done = subprocess.run(
        ["nsenter", f"--net=/run/netns/{netns}", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        raise EbpflbError(f"bench: {' '.join(argv)} in {netns}: {done.stderr.strip()}")
    return done.stdout


def _mac(netns: str, dev: str) -> str:
    return str(progcost.link(netns, dev)["address"])


def frames(topo: BenchTopology, mode: Mode, settings: PpsSettings) -> str:
    """The generator's frames: to a backend itself for the floors, else to the NodePort."""
    a = topo.addresses
    if mode in (Mode.NONE, Mode.NONE_XDP):
        plan = scenario.PLANS[topo.family]
        dst, port = str(plan.endpoint(0, 0)), scenario.TARGET_PORT
    else:
        dst, port = a.node, scenario.NODE_PORT
    return pktgen.frame_config(
        topo.family,
        src_mac=_mac(topo.external, "eth0"),
        dst_mac=_mac(topo.node, INGRESS),
        src=a.external,
        dst=dst,
        dport=port,
        flows=settings.flows,
    )


def _add_sink(topo: BenchTopology) -> None:
    """Count and drop UDP at the backends' eth0: to the target port, then to any other."""
    rules = (
        f"table netdev {SINK} {{\n"
        f'  chain ingress {{ type filter hook ingress device "eth0" priority 0;\n'
        f"    udp dport {scenario.TARGET_PORT} counter drop\n"
        f"    meta l4proto udp counter drop\n"
        f"  }}\n}}\n"
    )
    _in_netns(topo.backends, ["nft", "-f", "-"], stdin=rules)


def sink_counts(topo: BenchTopology) -> tuple[int, int]:
    """(delivered, misdelivered) packets so far."""
    listed = _in_netns(topo.backends, ["nft", "-j", "list", "table", "netdev", SINK])
    counts = [
        expr["counter"]["packets"]
        for item in json.loads(listed)["nftables"]
        if "rule" in item
        for expr in item["rule"]["expr"]
        if "counter" in expr
    ]
    return counts[0], counts[1]


def _napi_threads() -> set[int]:
    found = set()
    for comm in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):
            if comm.read_text().startswith("napi/"):
                found.add(int(comm.parent.name))
    return found


def _queue_on_node_core(topo: BenchTopology) -> None:
    """The node's eth0 polled by NAPI in a thread of its own, pinned to NODE_CPU: a NIC's
    queue with its interrupt on one core. After the mode's programs are attached (an XDP
    attachment may make the poll anew)."""
    before = _napi_threads()
    sh("ip", "netns", "exec", topo.node, "ethtool", "-K", INGRESS, "gro", "on")
    sh("ip", "netns", "exec", topo.node, "sh", "-c", f"echo 1 > /sys/class/net/{INGRESS}/threaded")
    deadline = time.monotonic() + 5
    while not (new := _napi_threads() - before):
        if time.monotonic() > deadline:
            raise EbpflbError(f"bench: no NAPI thread appeared for the node's {INGRESS}")
        time.sleep(0.05)
    for pid in new:
        os.sched_setaffinity(pid, {NODE_CPU})


def _busy(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], cpu: int) -> float:
    busy = after[cpu][0] - before[cpu][0]
    total = after[cpu][1] - before[cpu][1]
    return busy / total if total > 0 else 0.0


def _window(topo: BenchTopology, seconds: float) -> Flood:
    sent0, (good0, bad0), cpu0 = (
        pktgen.tx_packets(topo.external, "eth0"),
        sink_counts(topo),
        core_times(),
    )
    started = time.perf_counter()
    time.sleep(seconds)
    cpu1, (good1, bad1) = core_times(), sink_counts(topo)
    elapsed = time.perf_counter() - started
    sent1 = pktgen.tx_packets(topo.external, "eth0")
    return Flood(
        seconds=round(elapsed, 3),
        offered_pps=round((sent1 - sent0) / elapsed),
        delivered_pps=round((good1 - good0) / elapsed),
        misdelivered=bad1 - bad0,
        node_busy=round(_busy(cpu0, cpu1, NODE_CPU), 4),
        generator_busy=round(_busy(cpu0, cpu1, GENERATOR_CPU), 4),
    )


def _idle(seconds: float) -> float:
    before = core_times()
    time.sleep(seconds)
    return _busy(before, core_times(), NODE_CPU)


def _measure(
    topo: BenchTopology, mode: Mode, settings: PpsSettings, bpffs: Path | None
) -> PpsResult:
    _queue_on_node_core(topo)
    config = frames(topo, mode, settings)

    def flood(rate: int | None) -> contextlib.AbstractContextManager[None]:
        return pktgen.flooding(topo.external, "eth0", config, cpu=GENERATOR_CPU, rate=rate)

    with flood(None):
        time.sleep(RAMP_S)
        saturation = tuple(_window(topo, settings.seconds) for _ in range(settings.repeats))
    rates = []
    for rate in settings.rates:
        idle = _idle(IDLE_S)
        with flood(rate):
            time.sleep(RAMP_S)
            rates.append(FixedRate(rate, _window(topo, settings.rate_seconds), round(idle, 4)))
    programs: tuple[ProgramTime, ...] = ()
    if bpffs is not None:
        with flood(settings.rates[0]), progcost.bpf_stats():
            time.sleep(RAMP_S)
            before, good0 = progcost.run_totals(bpffs), sink_counts(topo)[0]
            time.sleep(settings.rate_seconds)
            after, good1 = progcost.run_totals(bpffs), sink_counts(topo)[0]
        # A program the flood's packets do not pass (np_in under XDP_REDIRECT) still runs
        # for the odd other packet: only those that ran for most packets are the path's.
        programs = tuple(
            p
            for p in progcost.per_exchange(before, after, good1 - good0)
            if p.runs_per_exchange >= ON_PATH
        )
    return PpsResult(mode, saturation, tuple(rates), programs)


@contextlib.contextmanager
def network(settings: PpsSettings) -> Iterator[BenchTopology]:
    wait_until_quiet(timeout=settings.quiet_timeout)
    topo = BenchTopology.create(settings.family)
    try:
        _add_sink(topo)
        yield topo
    finally:
        topo.close()


def measure_mode(mode: Mode, settings: PpsSettings) -> PpsResult:
    services = udp_services(settings)
    with network(settings) as topo:
        if mode is Mode.NONE:
            return _measure(topo, mode, settings, None)
        if mode is Mode.NONE_XDP:
            attach_xdp_pass(topo, topo.node, list(NODE_INTERFACES))
            return _measure(topo, mode, settings, None)
        if mode in KUBE_PROXY_MODES:
            rules = CompareSettings(family=settings.family, endpoints=ENDPOINTS, changes=1)
            program_kube_proxy(topo, mode, services, rules)
            return _measure(topo, mode, settings, None)
        with ebpflb_agent(topo, services, memory=None, xdp=mode is Mode.EBPFLB_XDP) as agent:
            return _measure(topo, mode, settings, Path(agent.bpffs))


def _gap_detail(mine: PpsResult, floor: PpsResult) -> str:
    """Why a ratio is what it is: the node core's extra time per packet at saturation,
    and the programs' own (bpf_stats)."""
    x, y = mine.delivered_pps, floor.delivered_pps
    parts = [f"{x / 1e6:.3f} vs {y / 1e6:.3f} Mpps (x{x / y:.2f})"]
    if x > 0:
        parts.append(f"{1e9 / x:.0f} vs {1e9 / y:.0f} ns per packet, gap {1e9 / x - 1e9 / y:.0f}")
    if mine.program_ns_per_packet is not None:
        names = "+".join(p.program.removeprefix("ebpflb_") for p in mine.programs)
        parts.append(f"{names} {mine.program_ns_per_packet:.0f} ns per packet (bpf_stats)")
    return "; ".join(parts)


def judge(results: tuple[PpsResult, ...]) -> tuple[Verdict, ...]:
    """The packet-rate targets wherever the run measured both sides, and each mode's
    validity: every packet translated, the node core (not the generator) the limit."""
    by_mode = {r.mode: r for r in results}
    verdicts = []

    def ratio(target: str, mine: Mode, floor: Mode, at_least: float) -> None:
        a, b = by_mode.get(mine), by_mode.get(floor)
        if a is None or b is None or b.delivered_pps <= 0:
            return
        ok = a.delivered_pps / b.delivered_pps >= at_least
        verdicts.append(Verdict(target, 1, ok, _gap_detail(a, b)))

    ratio(f"NodePort via tc >= {TC_MIN_RATIO:g}x plain forwarding, packets/s on one core",
          Mode.EBPFLB, Mode.NONE, TC_MIN_RATIO)  # fmt: skip
    ratio(f"NodePort via XDP >= {XDP_MIN_RATIO:g}x plain forwarding, packets/s on one core",
          Mode.EBPFLB_XDP, Mode.NONE, XDP_MIN_RATIO)  # fmt: skip
    ratio("NodePort via XDP at least forwarding with XDP_PASS attached, packets/s",
          Mode.EBPFLB_XDP, Mode.NONE_XDP, 1.0)  # fmt: skip
    for mode in KUBE_PROXY_MODES:
        ratio(f"NodePort via tc at least the packets/s of {mode}", Mode.EBPFLB, mode, 1.0)
    for result in results:
        if result.misdelivered:
            verdicts.append(
                Verdict(f"{result.mode}: every packet translated", 1, False,
                        f"{result.misdelivered} UDP packets reached the backends at another port")
            )  # fmt: skip
        if result.node_busy < SATURATED:
            verdicts.append(
                Verdict(f"{result.mode}: the node's core saturated", 1, False,
                        f"busy {result.node_busy:.0%}: the generator was the limit")
            )  # fmt: skip
    return tuple(verdicts)


def run_pps_bench(settings: PpsSettings, progress: Callable[[str], None] = print) -> PpsRun:
    settings.validate()
    if not pktgen.available():
        raise EbpflbError(
            "trafgen not found (Debian package netsniff-ng, which `make setup` installs)"
        )
    if (os.cpu_count() or 1) <= max(GENERATOR_CPU, NODE_CPU):
        raise EbpflbError("bench pps needs two CPUs: the generator's and the node's")
    results, seconds = each_mode(
        "pps", settings.modes, settings.family, lambda m: measure_mode(m, settings), progress
    )
    return PpsRun(machine_facts(), settings, results, judge(results), seconds)
