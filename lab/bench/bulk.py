"""`ebpflb bench bulk`: bulk TCP through a NodePort with SNAT, per mode, with GRO on.

For each mode a fresh bench topology (lab.bench.topology: external -- node --
backends), GRO switched on for every interface as a real NIC has it, one NodePort service
whose endpoints are on another node (so every mode SNATs, as kube-proxy masquerades eTP
Cluster traffic), an iperf3 server in the backends namespace, and iperf3 from the external
namespace, each way (-R for the download), `repeats` times of `seconds` each:

- none: the client sends to a backend's address, the node forwards it (no translation):
  the floor of tc and of every kube-proxy mode;
- none-xdp-pass: the same with an XDP_PASS program on the node's interfaces: the floor of
  ebpflb-xdp (a veth running XDP no longer aggregates, so that cost is the veth's);
- iptables-legacy, iptables-nft, nftables: kube-proxy's rules for that service
  (lab.bench.modes), NAT by netfilter on the aggregated packets;
- ebpflb, ebpflb-xdp: the real agent, its NodePort ingress in tc or in native XDP; the
  transfers' drops by ebpflb's own counters (fib_fail, mtu_exceeded) are reported.

Then the targets: tc at least TC_MIN_RATIO of forwarding and at least as fast as each
kube-proxy mode; XDP at least its XDP_PASS floor.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections.abc import Callable, Iterator

from ebpflb.errors import EbpflbError
from lab.bench import scenario
from lab.bench.measure.machine import machine_facts, wait_until_quiet
from lab.bench.modes import each_mode, ebpflb_agent, program_kube_proxy
from lab.bench.records.bulk import BulkFigure, BulkResult, BulkRun
from lab.bench.records.compare import Verdict
from lab.bench.settings import KUBE_PROXY_MODES, BulkSettings, CompareSettings, Mode
from lab.bench.topology import NODE_INTERFACES, BenchTopology
from lab.harness import bulk
from lab.harness.netns import attach_xdp_pass, sh

TC_MIN_RATIO = 0.9  # ebpflb (tc) / none
XDP_MIN_RATIO = 1.0  # ebpflb-xdp / none-xdp-pass
DROP_COUNTERS = ("fib_fail", "mtu_exceeded")
ENDPOINTS = 2  # the scenario's minimum; iperf3's two connections may take either


def _services(settings: BulkSettings) -> list[scenario.BenchService]:
    return scenario.bench_services(1, ENDPOINTS, family=settings.family)


def _target(topo: BenchTopology, mode: Mode, service: scenario.BenchService) -> tuple[str, int]:
    """Where the external client connects: a backend itself (the floors), else the node's
    nodePort."""
    if mode in (Mode.NONE, Mode.NONE_XDP):
        plan = scenario.PLANS[topo.family]
        return str(plan.endpoint(service.index, 0)), scenario.TARGET_PORT
    return topo.addresses.node, scenario.NODE_PORT


def _figure(runs: list[bulk.Transfer]) -> BulkFigure:
    rates = tuple(round(t.gbit_s, 3) for t in runs)
    return BulkFigure(statistics.median(rates), rates, sum(t.retransmits for t in runs))


def _transfers(
    topo: BenchTopology, mode: Mode, settings: BulkSettings
) -> tuple[BulkFigure, BulkFigure]:
    host, port = _target(topo, mode, _services(settings)[0])
    figures = []
    for reverse in (False, True):
        runs = [
            bulk.transfer(
                topo,
                topo.external,
                host,
                port,
                seconds=settings.seconds,
                reverse=reverse,
                timeout=settings.seconds * 10 + 30,
            )
            for _ in range(settings.repeats)
        ]
        figures.append(_figure(runs))
    return figures[0], figures[1]


@contextlib.contextmanager
def _network(settings: BulkSettings) -> Iterator[BenchTopology]:
    wait_until_quiet(timeout=settings.quiet_timeout)
    topo = BenchTopology.create(settings.family)
    try:
        bulk.start_server(topo, topo.backends, scenario.TARGET_PORT)
        bulk.gro_on(topo, bulk.host_links(topo, wire_ns=""))
        yield topo
    finally:
        topo.close()


def _drops(bpffs: os.PathLike[str]) -> int:
    from ebpflb.datapath.maps.kernel import KernelMapSet

    with KernelMapSet(bpffs) as maps:  # type: ignore[arg-type]
        counters = maps.counters()
    return sum(counters[name] for name in DROP_COUNTERS)


def measure_mode(mode: Mode, settings: BulkSettings) -> BulkResult:
    services = _services(settings)
    with _network(settings) as topo:
        if mode is Mode.NONE:
            return BulkResult(mode, *_transfers(topo, mode, settings))
        if mode is Mode.NONE_XDP:
            attach_xdp_pass(topo, topo.node, list(NODE_INTERFACES))
            try:
                return BulkResult(mode, *_transfers(topo, mode, settings))
            finally:
                for ifname in NODE_INTERFACES:
                    sh("ip", "-n", topo.node, "link", "set", ifname, "xdp", "off")
        if mode in KUBE_PROXY_MODES:
            rules = CompareSettings(family=settings.family, endpoints=ENDPOINTS, changes=1)
            program_kube_proxy(topo, mode, services, rules)
            return BulkResult(mode, *_transfers(topo, mode, settings))
        xdp = mode is Mode.EBPFLB_XDP
        with ebpflb_agent(topo, services, memory=None, xdp=xdp) as agent:
            before = _drops(agent.bpffs)
            upload, download = _transfers(topo, mode, settings)
            return BulkResult(mode, upload, download, dropped=_drops(agent.bpffs) - before)


def judge(results: tuple[BulkResult, ...]) -> tuple[Verdict, ...]:
    """The bulk targets wherever the run measured both sides."""
    by_mode = {r.mode: r for r in results}
    verdicts = []

    def ratio(target: str, mine: Mode, floor: Mode, at_least: float) -> None:
        a, b = by_mode.get(mine), by_mode.get(floor)
        if a is None or b is None:
            return
        for direction in ("upload", "download"):
            x, y = getattr(a, direction).gbit_s, getattr(b, direction).gbit_s
            ok = y > 0 and x / y >= at_least
            detail = f"{x:.2f} vs {y:.2f} Gbit/s (x{x / y:.2f})" if y > 0 else "floor 0"
            verdicts.append(Verdict(f"{target}, {direction}", 1, ok, detail))

    ratio(
        f"NodePort via tc >= {TC_MIN_RATIO:g}x plain forwarding",
        Mode.EBPFLB,
        Mode.NONE,
        TC_MIN_RATIO,
    )
    for mode in KUBE_PROXY_MODES:
        ratio(f"NodePort via tc at least as fast as {mode}", Mode.EBPFLB, mode, 1.0)
    ratio(
        "NodePort via XDP at least forwarding with XDP_PASS attached",
        Mode.EBPFLB_XDP,
        Mode.NONE_XDP,
        XDP_MIN_RATIO,
    )
    for result in results:
        if result.dropped:
            verdicts.append(
                Verdict(
                    f"{result.mode}: no packet dropped by ebpflb",
                    1,
                    False,
                    f"{result.dropped} counted in {', '.join(DROP_COUNTERS)}",
                )
            )
    return tuple(verdicts)


def run_bulk_bench(settings: BulkSettings, progress: Callable[[str], None] = print) -> BulkRun:
    settings.validate()
    if not bulk.available():
        raise EbpflbError("iperf3 not found (Debian package iperf3; `make setup` installs it)")
    results, seconds = each_mode(
        "bulk", settings.modes, settings.family, lambda m: measure_mode(m, settings), progress
    )
    return BulkRun(machine_facts(), settings, results, judge(results), seconds)
