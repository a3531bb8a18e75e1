"""`ebpflb bench`: ebpflb against kube-proxy's iptables and nftables modes, side by side.

For every N in --services and every mode, the bench builds its own namespaces
(ebpflb.bench.topology), programs the N services of ebpflb.bench.scenario the way that
mode would, measures, and removes everything before the next mode:

- none: the client connects straight to a backend address (the floor);
- iptables-legacy / iptables-nft: kube-proxy's iptables proxier's rules
  (ebpflb.bench.kubeproxy), loaded with kube-proxy's `iptables-restore --noflush` through
  each backend of the iptables tool;
- nftables: kube-proxy's nftables proxier's ruleset, loaded with `nft -f`;
- ebpflb: the real agent (`ebpflb run` on the Kubernetes source, talking to the fake API
  server over HTTP) in the node namespace: socket-LB for ClusterIP, tc for NodePort, then
  restarted with --xdp native for the XDP NodePort figure.

Data plane (ebpflb.bench.loadgen, a compiled client; client on CPU 0, server on CPU 1):
connect() latency to the first, the last and a random service in interleaved batches
with conntrack flushed before each; new connections per second to the last service; the
NodePort request rate (connect, request, response, close) from the external namespace.
In the ebpflb phase the no-proxy client runs interleaved with ebpflb's from a cgroup
without socket programs, so the two are compared under the same conditions.

Control plane: programming all N from nothing (kube-proxy modes: the restore / nft load
of the full ruleset; ebpflb: agent start -> every service in the maps), one endpoint
change (kube-proxy: its partial sync; ebpflb: API write -> map entry), CPU seconds of
each, and the kernel memory the rules or maps cost (memory cgroup accounting; for
ebpflb also bpftool's per-map figure).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

from ebpflb.bench import loadgen, scenario
from ebpflb.bench.kubeproxy import iptables, nftables
from ebpflb.bench.report import check_targets
from ebpflb.bench.settings import Settings
from ebpflb.bench.stats import percentile
from ebpflb.bench.sync import RunningAgent, running_agent
from ebpflb.bench.topology import NODE_INTERFACES, NODE_IP, BenchTopology, KernelMemoryCgroup
from ebpflb.errors import EbpflbError

IPTABLES_MODES = ("iptables-legacy", "iptables-nft")  # also the iptables binaries' names
# Everything on one core: a wake-up across CPUs costs more than a whole connection on
# this kind of VM (measured: ~150 µs), which would measure the hypervisor, not the proxy.
CLIENT_CPU = SERVER_CPU = 0
TARGETS = ("first", "last", "random")


# ---- clients ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Client:
    """Who connects where: the namespace and cgroup it runs in and the address block
    ("service i" is base + i + 1) and port it targets."""

    netns: str
    base: str
    port: int
    cgroup_name: str = "plain"

    def index_args(self, target: str, n: int) -> dict[str, int]:
        if target == "first":
            return {"index": 0}
        if target == "last":
            return {"index": n - 1}
        return {"random_count": n}


def cluster_client(topo: BenchTopology, mode: str) -> Client:
    if mode == "none":
        return Client(topo.node, str(scenario.ENDPOINT_CIDR.network_address), scenario.TARGET_PORT)
    cgroup = "lb" if mode == "ebpflb" else "plain"
    return Client(topo.node, str(scenario.SERVICE_CIDR.network_address), scenario.PORT, cgroup)


def nodeport_client(topo: BenchTopology, mode: str, n: int) -> tuple[Client, int]:
    """The external client and the index that reaches the NodePort service (the last)."""
    if mode == "none":
        base = str(scenario.ENDPOINT_CIDR.network_address)
        return Client(topo.external, base, scenario.TARGET_PORT), n - 1
    return Client(topo.external, str(IPv4Address(NODE_IP) - 1), scenario.NODE_PORT), 0


def latency_summary(samples_ns: Sequence[int], errors: int) -> dict[str, Any]:
    if not samples_ns:
        return {"samples": 0, "errors": errors}
    values = sorted(s / 1000 for s in samples_ns)
    return {
        "p50_us": percentile(values, 0.50),
        "p99_us": percentile(values, 0.99),
        "mean_us": statistics.fmean(values),
        "samples": len(values),
        "errors": errors,
    }


def measure_latency(
    topo: BenchTopology, clients: dict[str, Client], n: int, settings: Settings
) -> dict[str, dict[str, Any]]:
    """Interleaved batches: every round runs one batch per (target, mode), in an order
    that rotates, with conntrack flushed before each batch. Returns mode -> target ->
    summary."""
    samples: dict[tuple[str, str], list[int]] = {}
    errors: dict[tuple[str, str], int] = {}
    first_error: dict[str, str] = {}
    order = [(mode, target) for target in TARGETS for mode in clients]
    for round_index in range(settings.rounds):
        shift = round_index % len(order)
        for mode, target in order[shift:] + order[:shift]:
            client = clients[mode]
            topo.flush_conntrack()
            result = loadgen.latency(
                client.netns,
                client.base,
                client.port,
                settings.batch,
                cpu=CLIENT_CPU,
                cgroup=topo.cgroups[client.cgroup_name],
                **client.index_args(target, n),
            )
            samples.setdefault((mode, target), []).extend(result.samples_ns)
            errors[(mode, target)] = errors.get((mode, target), 0) + result.errors
            if result.errors and result.first_error:
                first_error.setdefault(mode, result.first_error)
    report: dict[str, dict[str, Any]] = {}
    for mode in clients:
        report[mode] = {
            target: latency_summary(samples[(mode, target)], errors[(mode, target)])
            for target in TARGETS
        }
        if mode in first_error:
            report[mode]["first_error"] = first_error[mode]
    return report


def measure_rates(
    topo: BenchTopology,
    clients: dict[str, tuple[Client, int]],
    settings: Settings,
    *,
    request: bool,
) -> dict[str, dict[str, Any]]:
    """Connections (or request/response exchanges) per second on one core, the modes'
    runs interleaved; the median of the repeats."""
    runs: dict[str, list[float]] = {mode: [] for mode in clients}
    failures: dict[str, int] = dict.fromkeys(clients, 0)
    first_error: dict[str, str] = {}
    for repeat in range(settings.rate_repeats):
        modes = list(clients)
        if repeat % 2:
            modes.reverse()
        for mode in modes:
            client, index = clients[mode]
            topo.flush_conntrack()
            result = loadgen.rate(
                client.netns,
                client.base,
                client.port,
                settings.rate_seconds,
                index=index,
                cpu=CLIENT_CPU,
                cgroup=topo.cgroups[client.cgroup_name],
                request=request,
            )
            runs[mode].append(result.rate)
            failures[mode] += result.errors
            if result.errors and result.first_error:
                first_error.setdefault(mode, result.first_error)
    report = {}
    for mode, rates in runs.items():
        report[mode] = {"per_s": statistics.median(rates), "runs": rates, "errors": failures[mode]}
        if mode in first_error:
            report[mode]["first_error"] = first_error[mode]
    return report


# ---- programming the kube-proxy modes ----------------------------------------------------


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Timed:
    seconds: float
    cpu_seconds: float


def run_timed(
    argv: Sequence[str],
    netns: str,
    *,
    stdin: str | None = None,
    preexec_fn: Callable[[], None] | None = None,
    timeout: float = 1800,
) -> Timed:
    """One command in the node namespace: wall time and CPU time (user + system, which
    includes the kernel's work on the rules: both loaders commit in their own context)."""
    cpu_before = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(
        ["nsenter", f"--net=/run/netns/{netns}", *argv],
        input=stdin,
        text=True,
        capture_output=True,
        timeout=timeout,
        preexec_fn=preexec_fn,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise EbpflbError(f"{' '.join(argv[:3])} failed ({done.returncode}): {done.stderr[:800]}")
    return Timed(elapsed, _children_cpu() - cpu_before)


@dataclass
class Programmed:
    """A mode's control-plane figures for one N."""

    program_s: float
    program_cpu_s: float
    change_s: list[float] = field(default_factory=list)
    change_cpu_s: list[float] = field(default_factory=list)
    kernel_memory_bytes: int | None = None
    details: dict[str, Any] = field(default_factory=dict)


def change_picks(n: int, count: int) -> list[int]:
    """Services whose endpoints change: spread out, never the first or the last (the
    data plane's targets)."""
    if n < 3:
        return [0] * count
    return [1 + (k * 7919 + n // 2) % (n - 2) for k in range(count)]


@contextlib.contextmanager
def _memory_cgroup(topo: BenchTopology, mode: str) -> Iterator[KernelMemoryCgroup | None]:
    cgroup = KernelMemoryCgroup.create(f"{topo.prefix}-{mode}-mem")
    try:
        yield cgroup
    finally:
        if cgroup is not None:
            cgroup.close()


def program_iptables(
    topo: BenchTopology, mode: str, services: list[scenario.BenchService], settings: Settings
) -> Programmed:
    if mode not in IPTABLES_MODES:
        raise EbpflbError(f"not an iptables mode: {mode}")
    binary = mode
    if shutil.which(f"{binary}-restore") is None:
        raise EbpflbError(f"{binary}-restore not found (Debian package iptables)")
    restore = [f"{binary}-restore", *iptables.RESTORE_FLAGS]
    with _memory_cgroup(topo, mode) as memory:
        enter = memory.enter if memory else None
        # What kube-proxy does before its first sync (counters, chains, jumps), untimed.
        for argv in [*iptables.nfacct_argv(), *iptables.setup_argv(binary)]:
            run_timed(argv, topo.node, preexec_fn=enter)
        full_text = iptables.full_sync(services)
        full = run_timed(restore, topo.node, stdin=full_text, preexec_fn=enter)
        kernel = memory.kernel_bytes() if memory else None
    result = Programmed(full.seconds, full.cpu_seconds, kernel_memory_bytes=kernel)
    result.details = {
        "rules": sum(1 for line in full_text.splitlines() if line.startswith("-A ")),
        "input_bytes": len(full_text),
        "command": " ".join(restore),
    }
    ready = settings.endpoints - 1
    for index in change_picks(len(services), settings.changes):
        text = iptables.partial_sync(services, index, ready)
        timed = run_timed(restore, topo.node, stdin=text)
        result.change_s.append(timed.seconds)
        result.change_cpu_s.append(timed.cpu_seconds)
    return result


def program_nftables(
    topo: BenchTopology, services: list[scenario.BenchService], settings: Settings
) -> Programmed:
    if shutil.which("nft") is None:
        raise EbpflbError("nft not found (Debian package nftables)")
    with _memory_cgroup(topo, "nftables") as memory:
        full_text = nftables.full_sync(services, node_ip=NODE_IP)
        full = run_timed(
            ["nft", "-f", "-"],
            topo.node,
            stdin=full_text,
            preexec_fn=memory.enter if memory else None,
        )
        kernel = memory.kernel_bytes() if memory else None
    result = Programmed(full.seconds, full.cpu_seconds, kernel_memory_bytes=kernel)
    result.details = {"input_bytes": len(full_text), "command": "nft -f -"}
    ready = settings.endpoints - 1
    for index in change_picks(len(services), settings.changes):
        timed = run_timed(
            ["nft", "-f", "-"], topo.node, stdin=nftables.partial_sync(services, index, ready)
        )
        result.change_s.append(timed.seconds)
        result.change_cpu_s.append(timed.cpu_seconds)
    return result


# ---- phases --------------------------------------------------------------------------------


def _cpu_busy_fraction(window: float) -> float:
    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields), idle

    total_before, idle_before = sample()
    time.sleep(window)
    total_after, idle_after = sample()
    elapsed = max(1, total_after - total_before)
    return 1 - (idle_after - idle_before) / elapsed


def wait_until_quiet(
    *, busy_below: float = 0.1, window: float = 0.5, timeout: float = 120
) -> float:
    """Wait for the machine to go idle; the seconds waited. A deleted namespace's rules are
    freed by the kernel in the background (seconds for 20,000 services' worth), which would
    otherwise land inside the next mode's measurements."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if _cpu_busy_fraction(window) < busy_below:
            break
    return time.perf_counter() - started


@contextlib.contextmanager
def _network() -> Iterator[BenchTopology]:
    """A fresh topology with the backend server running: every mode starts from nothing,
    on a quiet machine."""
    wait_until_quiet()
    topo = BenchTopology.create()
    try:
        with loadgen.start_server(
            topo.backends, scenario.TARGET_PORT, cpu=SERVER_CPU, lifetime=3600, owner=topo
        ):
            yield topo
    finally:
        topo.close()


def _data_plane(
    topo: BenchTopology, modes: Sequence[str], n: int, settings: Settings
) -> dict[str, dict[str, Any]]:
    clients = {mode: cluster_client(topo, mode) for mode in modes}
    wait_until_quiet()  # after programming: e.g. rules replaced by a partial sync being freed
    latency = measure_latency(topo, clients, n, settings)
    rates = measure_rates(
        topo, {mode: (c, n - 1) for mode, c in clients.items()}, settings, request=False
    )
    return {mode: {"latency": latency[mode], "connections": rates[mode]} for mode in modes}


def _nodeport(topo: BenchTopology, mode: str, n: int, settings: Settings) -> dict[str, Any]:
    return measure_rates(topo, {mode: nodeport_client(topo, mode, n)}, settings, request=True)[mode]


def kube_proxy_phase(
    mode: str, services: list[scenario.BenchService], settings: Settings
) -> dict[str, Any]:
    n = len(services)
    with _network() as topo:
        if mode == "nftables":
            programmed = program_nftables(topo, services, settings)
        else:
            programmed = program_iptables(topo, mode, services, settings)
        result = _data_plane(topo, [mode], n, settings)[mode]
        result["nodeport"] = _nodeport(topo, mode, n, settings)
    result["control"] = asdict(programmed)
    return result


def ebpflb_phase(
    services: list[scenario.BenchService], settings: Settings, *, with_ebpflb: bool
) -> dict[str, dict[str, Any]]:
    """The no-proxy floor, and ebpflb measured interleaved with it."""
    n = len(services)
    results: dict[str, dict[str, Any]] = {}
    with _network() as topo:
        results["none"] = {"nodeport": _nodeport(topo, "none", n, settings)}
        if not with_ebpflb:
            results["none"].update(_data_plane(topo, ["none"], n, settings)["none"])
            return results
        picks = change_picks(n, settings.changes)
        with (
            _memory_cgroup(topo, "ebpflb") as memory,
            _agent(topo, services, memory=memory, xdp=False) as agent,
        ):
            changes = agent.change_latencies(picks, pause=0.3)
            control = {
                "program_s": agent.figures["start_to_synced_s"],
                "program_cpu_s": agent.figures["cpu_s_at_synced"],
                "change_s": [c["seconds"] for c in changes],
                "change_cpu_s": [c["cpu_s"] for c in changes],
                "kernel_memory_bytes": memory.kernel_bytes() if memory else None,
                "details": {**agent.figures, "bpf_map_bytes": bpf_map_bytes(agent.bpffs)},
            }
            both = _data_plane(topo, ["none", "ebpflb"], n, settings)
            results["none"].update(both["none"])
            results["ebpflb"] = both["ebpflb"]
            results["ebpflb"]["nodeport"] = _nodeport(topo, "ebpflb", n, settings)
            results["ebpflb"]["control"] = control
        if settings.xdp:
            with _agent(topo, services, memory=None, xdp=True) as agent:
                results["ebpflb-xdp"] = {
                    "nodeport": _nodeport(topo, "ebpflb", n, settings),
                    "control": {
                        "program_s": agent.figures["start_to_synced_s"],
                        "details": agent.figures,
                    },
                }
    return results


AGENT_CPU = 1  # away from the data-plane client, so its housekeeping never lands inside


@contextlib.contextmanager
def _agent(
    topo: BenchTopology,
    services: list[scenario.BenchService],
    *,
    memory: KernelMemoryCgroup | None,
    xdp: bool,
) -> Iterator[RunningAgent]:
    """The real agent in the node namespace, on the Kubernetes source (see sync.py)."""

    def enter() -> None:
        if memory is not None:
            memory.enter()
        if (os.cpu_count() or 1) > AGENT_CPU:
            os.sched_setaffinity(0, {AGENT_CPU})

    extra = [
        f"--node-name={scenario.AGENT_NODE}",
        f"--interfaces={','.join(NODE_INTERFACES)}",
        f"--xdp={'native' if xdp else 'off'}",
    ]
    with running_agent(
        services, extra_args=extra, netns=topo.node, cgroup=topo.lb_cgroup.path, preexec_fn=enter
    ) as agent:
        if xdp and not any("ingress in XDP (native)" in line for line in agent.agent.lines):
            raise EbpflbError("the agent did not put NodePort ingress in native XDP")
        yield agent


def bpf_map_bytes(bpffs: Path) -> int | None:
    """bpftool's memory figure summed over the maps pinned under bpffs."""
    done = subprocess.run(
        ["bpftool", "-j", "-f", "map", "show"], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        return None
    return sum(
        int(entry.get("bytes_memlock", 0))
        for entry in json.loads(done.stdout)
        if any(str(path).startswith(f"{bpffs}/") for path in entry.get("pinned", []))
    )


def run_compare(settings: Settings, progress: Callable[[str], None] = print) -> dict[str, Any]:
    settings.validate()
    if os.geteuid() != 0:
        raise EbpflbError("ebpflb bench creates namespaces and loads BPF programs: run as root")
    loadgen.build()
    started = time.perf_counter()
    report: dict[str, Any] = {
        "machine": machine_facts(),
        "settings": asdict(settings),
        "results": {},
    }
    for n in settings.services:
        services = scenario.bench_services(n, settings.endpoints)
        per_mode: dict[str, Any] = {}
        for mode in settings.modes:
            if mode in ("none", "ebpflb") or not settings.runs(mode, n):
                continue
            progress(f"bench: {n:,} services, {mode}")
            phase_started = time.perf_counter()
            per_mode[mode] = kube_proxy_phase(mode, services, settings)
            per_mode[mode]["phase_s"] = time.perf_counter() - phase_started
        if "none" in settings.modes or "ebpflb" in settings.modes:
            with_ebpflb = "ebpflb" in settings.modes
            progress(f"bench: {n:,} services, {'none + ebpflb' if with_ebpflb else 'none'}")
            phase_started = time.perf_counter()
            per_mode.update(ebpflb_phase(services, settings, with_ebpflb=with_ebpflb))
            per_mode["none"]["phase_s"] = time.perf_counter() - phase_started
            if "none" not in settings.modes:
                per_mode["none"]["listed"] = False  # measured as ebpflb's reference only
        report["results"][str(n)] = per_mode
    report["total_s"] = time.perf_counter() - started
    report["problems"] = problems(report)
    report["targets"] = check_targets(report)
    return report


def problems(report: dict[str, Any]) -> list[str]:
    """Failed connections anywhere: the figures of such a mode do not mean what they say."""
    found = []
    for n, per_mode in report["results"].items():
        for mode, data in per_mode.items():
            for kind in ("latency", "connections", "nodeport"):
                figures = data.get(kind) or {}
                groups = figures.values() if kind == "latency" else [figures]
                errors = sum(g.get("errors", 0) for g in groups if isinstance(g, dict))
                if errors:
                    detail = figures.get("first_error", "")
                    found.append(f"{n} services, {mode}, {kind}: {errors} failed ({detail})")
    return found


def _version(argv: Sequence[str]) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (done.stdout or done.stderr).strip().splitlines()[0]
    return "not found"


def machine_facts() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError):
        mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "kernel": platform.release(),
        "cpu": model,
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "iptables": _version(["iptables-legacy", "--version"]),
        "nft": _version(["nft", "--version"]),
        "date": time.strftime("%Y-%m-%d"),
    }
