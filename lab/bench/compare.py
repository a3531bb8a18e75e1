"""`ebpflb bench compare`: ebpflb against kube-proxy's iptables and nftables modes.

For every N in the settings and every mode, the bench builds its own namespaces
(lab.bench.topology), programs the N services of lab.bench.scenario the way that
mode would (lab.bench.modes), measures (lab.bench.measure), and removes everything
before the next mode, on a quiet machine:

- each kube-proxy mode alone: rules loaded, its changes timed, then its data plane;
- none and ebpflb together: the no-proxy client runs interleaved with ebpflb's from a
  cgroup without socket programs, so the two are compared under the same conditions;
  then the agent restarted with --xdp native for the XDP NodePort figure (ebpflb-xdp).

Data plane (a compiled client; client and server on CPU 0): connect() latency to the
first, the last and a random service in interleaved batches with conntrack flushed before
each, from the node and from a pod behind it (ebpflb: socket-LB, and the per-packet path on
the pod's link); new connections per second to the last service, from both; the NodePort
request rate (connect, request, response, close) from the external namespace. Control plane: all N
programmed from nothing, one endpoint change, their CPU seconds, the kernel memory the
rules or maps cost. Then the targets (lab.bench.targets) are judged.

Every address of a run is of settings.family (IPv4 or IPv6): topology, services, rules
and clients alike.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from ipaddress import ip_address

from ebpflb.errors import EbpflbError
from lab.bench import loadgen, progcost, scenario, targets
from lab.bench.agentrun import RunningAgent
from lab.bench.measure.cost import bpf_map_bytes, memory_cgroup
from lab.bench.measure.machine import machine_facts, wait_until_quiet
from lab.bench.measure.traffic import (
    CLIENT_CPU,
    Client,
    measure_latency,
    measure_rates,
    measure_request_response,
)
from lab.bench.modes import change_picks, ebpflb_agent, program_kube_proxy
from lab.bench.records.compare import (
    CompareRun,
    ConnectLatency,
    ControlPlane,
    DataPlane,
    Exchange,
    KernelMemory,
    ModeResult,
    ProgramCost,
    ProgramTime,
    Rate,
    RequestResponse,
    SizeResult,
)
from lab.bench.scenario import Family
from lab.bench.settings import CompareSettings, Mode
from lab.bench.topology import BenchTopology

SERVER_CPU = 0  # with the client: see lab.bench.measure.traffic.CLIENT_CPU
NODE, POD = "node", "pod"  # where a ClusterIP client runs
METRICS_TIMEOUT = 120.0  # /metrics of 100,000 services takes seconds


# ---- clients ------------------------------------------------------------------------------


def cluster_client(topo: BenchTopology, mode: Mode) -> Client:
    """The node's client: straight to the backends (none), else to the ClusterIPs, from
    the cgroup where ebpflb's socket programs are attached (ebpflb) or none are."""
    plan = scenario.PLANS[topo.family]
    if mode is Mode.NONE:
        base = str(plan.endpoint_cidr.network_address)
        return Client(topo.node, base, scenario.TARGET_PORT, topo.plain_cgroup)
    cgroup = topo.lb_cgroup if mode is Mode.EBPFLB else topo.plain_cgroup
    return Client(topo.node, str(plan.service_cidr.network_address), scenario.PORT, cgroup)


def pod_client(topo: BenchTopology, mode: Mode) -> Client:
    """The pod's client: the same targets as the node's, from the pod behind pod0 and in no
    socket-LB cgroup, so ebpflb serves it per packet on the pod's link."""
    node = cluster_client(topo, mode)
    return Client(topo.pod, node.base, node.port, topo.plain_cgroup)


def nodeport_client(topo: BenchTopology, mode: Mode, n: int) -> tuple[Client, int]:
    """The external client and the index that reaches the NodePort service (the last)."""
    if mode is Mode.NONE:
        base = str(scenario.PLANS[topo.family].endpoint_cidr.network_address)
        return Client(topo.external, base, scenario.TARGET_PORT, topo.plain_cgroup), n - 1
    base = str(ip_address(topo.addresses.node) - 1)  # "service 0" is base + 1: the node
    return Client(topo.external, base, scenario.NODE_PORT, topo.plain_cgroup), 0


# ---- phases -------------------------------------------------------------------------------


@contextlib.contextmanager
def _network(settings: CompareSettings) -> Iterator[BenchTopology]:
    """A fresh topology with the backend server running: every mode starts from nothing,
    on a quiet machine."""
    wait_until_quiet(timeout=settings.quiet_timeout)
    topo = BenchTopology.create(settings.family)
    try:
        with loadgen.start_server(
            topo.backends,
            scenario.TARGET_PORT,
            cpu=SERVER_CPU,
            lifetime=3600,
            owner=topo,
            ipv6=settings.family is Family.IPV6,
            threads=SERVER_THREADS,
        ):
            yield topo
    finally:
        topo.close()


def _data_plane(
    topo: BenchTopology, modes: Sequence[Mode], n: int, settings: CompareSettings
) -> dict[Mode, DataPlane]:
    # Each mode from the node and from the pod, all interleaved in the same rounds.
    clients = {
        **{(mode, NODE): cluster_client(topo, mode) for mode in modes},
        **{(mode, POD): pod_client(topo, mode) for mode in modes},
    }
    # After programming: e.g. rules replaced by a partial sync being freed.
    wait_until_quiet(timeout=settings.quiet_timeout)
    latency = measure_latency(
        clients, n, rounds=settings.rounds, batch=settings.batch, flush=topo.flush_conntrack
    )
    rates = measure_rates(
        {key: (client, n - 1) for key, client in clients.items()},
        repeats=settings.rate_repeats,
        seconds=settings.rate_seconds,
        flush=topo.flush_conntrack,
        request=False,
    )
    exchanges = (
        _request_response(topo, modes, n, settings) if n in settings.request_response_at else {}
    )
    return {
        mode: DataPlane(
            latency=latency[mode, NODE],
            connections=rates[mode, NODE],
            pod_latency=latency[mode, POD],
            pod_connections=rates[mode, POD],
            request_response=exchanges.get(mode, ()),
        )
        for mode in modes
    }


# netperf's TCP_RR and TCP_CRR as Cilium's CNI benchmark runs them: one flow and 32.
REQUEST_RESPONSE = tuple((e, flows) for e in Exchange for flows in (1, 32))
# One server thread per long-lived flow, and one for the rest.
SERVER_THREADS = max(flows for _, flows in REQUEST_RESPONSE) + 1


def _request_response(
    topo: BenchTopology, modes: Sequence[Mode], n: int, settings: CompareSettings
) -> dict[Mode, tuple[RequestResponse, ...]]:
    """Each mode's RR and CRR to the last service from the node's client, interleaved."""
    clients = {mode: (cluster_client(topo, mode), n - 1) for mode in modes}
    found: dict[Mode, list[RequestResponse]] = {mode: [] for mode in modes}
    for exchange, flows in REQUEST_RESPONSE:
        rates = measure_request_response(
            clients,
            flows=flows,
            new_connection=exchange is Exchange.CRR,
            repeats=settings.rate_repeats,
            seconds=settings.rate_seconds,
            flush=topo.flush_conntrack,
        )
        for mode, rate in rates.items():
            found[mode].append(RequestResponse(exchange, flows, rate))
    return {mode: tuple(rows) for mode, rows in found.items()}


def _nodeport(topo: BenchTopology, mode: Mode, n: int, settings: CompareSettings) -> Rate:
    return measure_rates(
        {mode: nodeport_client(topo, mode, n)},
        repeats=settings.rate_repeats,
        seconds=settings.rate_seconds,
        flush=topo.flush_conntrack,
        request=True,
    )[mode]


def _nodeport_program_time(
    topo: BenchTopology, agent: RunningAgent, n: int, settings: CompareSettings
) -> tuple[ProgramTime, ...]:
    """One more NodePort run, with bpf_stats on: each program's time per exchange (what
    the programs add to a request against plain forwarding)."""
    client, index = nodeport_client(topo, Mode.EBPFLB, n)
    topo.flush_conntrack()
    with progcost.bpf_stats():
        before = progcost.run_totals(agent.bpffs)
        done = loadgen.rate(
            client.netns,
            client.base,
            client.port,
            settings.rate_seconds,
            index=index,
            cpu=CLIENT_CPU,
            cgroup=client.cgroup,
            request=True,
        )
        after = progcost.run_totals(agent.bpffs)
    return progcost.per_exchange(before, after, done.connections)


def _program_costs(
    topo: BenchTopology, agent: RunningAgent, program: progcost.Program, settings: CompareSettings
) -> tuple[ProgramCost, ...]:
    """After the traffic: the program's cost per packet on its NodePort paths."""
    return progcost.measure_nodeport(
        program, agent.bpffs, topo.node, topo.external, settings.family
    )


def kube_proxy_phase(
    mode: Mode, services: list[scenario.BenchService], settings: CompareSettings
) -> ModeResult:
    n = len(services)
    started = time.perf_counter()
    with _network(settings) as topo:
        control = program_kube_proxy(topo, mode, services, settings)
        data = _data_plane(topo, [mode], n, settings)[mode]
        nodeport = _nodeport(topo, mode, n, settings)
    return ModeResult(
        mode,
        replace(data, nodeport=nodeport),
        control,
        phase_s=time.perf_counter() - started,
    )


def ebpflb_phase(
    services: list[scenario.BenchService], settings: CompareSettings, *, with_ebpflb: bool
) -> list[ModeResult]:
    """The no-proxy floor, and ebpflb (then ebpflb-xdp) measured interleaved with it."""
    n = len(services)
    started = time.perf_counter()
    results: list[ModeResult] = []
    with _network(settings) as topo:
        none_nodeport = _nodeport(topo, Mode.NONE, n, settings)
        if not with_ebpflb:
            none = _data_plane(topo, [Mode.NONE], n, settings)[Mode.NONE]
            data = replace(none, nodeport=none_nodeport)
            return [ModeResult(Mode.NONE, data, phase_s=time.perf_counter() - started)]
        picks = change_picks(n, settings.changes)
        with (
            memory_cgroup(f"{topo.prefix}-ebpflb-mem") as memory,
            ebpflb_agent(topo, services, memory=memory, xdp=False) as agent,
        ):
            changes = agent.change_latencies(picks, pause=0.3)
            control = ControlPlane(
                program_s=agent.startup.start_to_synced_s,
                program_cpu_s=agent.startup.cpu_s_at_synced,
                change_s=tuple(c.seconds for c in changes),
                change_cpu_s=tuple(c.cpu_s for c in changes),
                memory=KernelMemory(
                    cgroup_bytes=memory.kernel_bytes() if memory else None,
                    bpf_map_bytes=bpf_map_bytes(agent.bpffs),
                ),
                agent=agent.startup,
            )
            both = _data_plane(topo, [Mode.NONE, Mode.EBPFLB], n, settings)
            nodeport = _nodeport(topo, Mode.EBPFLB, n, settings)
            program_time = _nodeport_program_time(topo, agent, n, settings)
            costs = _program_costs(topo, agent, progcost.TC_INGRESS, settings)
        none, ebpflb = both[Mode.NONE], both[Mode.EBPFLB]
        data = replace(
            ebpflb, nodeport=nodeport, program_costs=costs, nodeport_program_time=program_time
        )
        results.append(ModeResult(Mode.EBPFLB, data, control))
        if settings.xdp:
            with ebpflb_agent(topo, services, memory=None, xdp=True) as agent:
                xdp_data = DataPlane(
                    nodeport=_nodeport(topo, Mode.EBPFLB, n, settings),
                    nodeport_program_time=_nodeport_program_time(topo, agent, n, settings),
                    program_costs=_program_costs(topo, agent, progcost.XDP, settings),
                )
                xdp_control = ControlPlane(
                    program_s=agent.startup.start_to_synced_s, agent=agent.startup
                )
            results.append(ModeResult(Mode.EBPFLB_XDP, xdp_data, xdp_control))
    none_result = ModeResult(
        Mode.NONE,
        replace(none, nodeport=none_nodeport),
        phase_s=time.perf_counter() - started,
        listed=Mode.NONE in settings.modes,  # else measured as ebpflb's reference only
    )
    return [none_result, *results]


def run_compare(settings: CompareSettings, progress: Callable[[str], None] = print) -> CompareRun:
    settings.validate()
    if os.geteuid() != 0:
        raise EbpflbError("ebpflb bench creates namespaces and loads BPF programs: run as root")
    loadgen.build()
    machine = machine_facts()
    started = time.perf_counter()
    sizes = []
    for n in settings.services:
        services = scenario.bench_services(
            n, settings.endpoints, mix=settings.mix, family=settings.family
        )
        modes: list[ModeResult] = []
        for mode in settings.modes:
            if mode in (Mode.NONE, Mode.EBPFLB) or not settings.runs(mode, n):
                continue
            progress(f"bench: {n:,} {settings.family} services, {mode}")
            modes.append(kube_proxy_phase(mode, services, settings))
        if Mode.NONE in settings.modes or Mode.EBPFLB in settings.modes:
            with_ebpflb = Mode.EBPFLB in settings.modes
            phase = "none + ebpflb" if with_ebpflb else "none"
            progress(f"bench: {n:,} {settings.family} services, {phase}")
            modes += ebpflb_phase(services, settings, with_ebpflb=with_ebpflb)
        sizes.append(SizeResult(n, tuple(modes)))
    return CompareRun(
        machine=machine,
        settings=settings,
        sizes=tuple(sizes),
        total_s=time.perf_counter() - started,
        problems=problems(sizes),
        targets=targets.judge(sizes),
    )


def problems(sizes: Sequence[SizeResult]) -> tuple[str, ...]:
    """Failed connections anywhere: the figures of such a mode do not mean what they say."""
    found = []
    for size in sizes:
        for result in size.modes:
            data = result.data
            measured: tuple[tuple[str, ConnectLatency | Rate | None], ...] = (
                ("latency", data.latency),
                ("connections", data.connections),
                ("nodeport", data.nodeport),
                ("pod latency", data.pod_latency),
                ("pod connections", data.pod_connections),
            )
            for kind, figures in measured:
                if figures is not None and figures.errors:
                    found.append(
                        f"{size.services} services, {result.mode}, {kind}:"
                        f" {figures.errors} failed ({figures.first_error or ''})"
                    )
    return tuple(found)
