"""Sync benchmark: the agent's control plane fed by the Kubernetes API, in detail.

The fake API server (ebpflb.testing.fakeapi, real HTTP) holds N Services with one
EndpointSlice of K endpoints each (ebpflb.bench.scenario's addressing, up to 131,070
services) before the real `ebpflb run --kubeconfig` starts, so "programmed from nothing"
is the agent's cold start: process start -> programs compiled and attached, both kinds
listed, every service in the real kernel maps ("initial sync complete"). The agent uses
its own bpffs directory and test cgroup, removed at the end. Measured besides: each
start-up step, the agent's CPU seconds and memory, the periodic full resync, and for a
few single-slice changes (one endpoint turning not ready) the time from the API write to
the pinned map showing the new service entry, polled from this process.

`running_agent` leaves the agent running for other measurements: `ebpflb bench`
(compare.py), which puts it side by side with kube-proxy's modes, uses it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import statistics
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from ipaddress import IPv4Address
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ebpflb.bench.scenario import (
    PORT,
    BenchService,
    bench_services,
    objects,
    slice_object,
)
from ebpflb.bench.stats import percentile
from ebpflb.bench.topology import thread_in_netns
from ebpflb.errors import ConfigError, EbpflbError

if TYPE_CHECKING:
    from ebpflb.testing.agentproc import AgentProcess
    from ebpflb.testing.fakeapi import FakeApiServer

START_TIMEOUT = 600.0
CHANGE_TIMEOUT = 30.0


# ---- ebpflb --------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metric(url: str, name: str, labels: str) -> float | None:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.split()[-1])
    return None


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def live_threads_cpu_seconds(pid: int) -> float:
    """CPU time of a process's live threads in ns resolution (/proc/PID/task/*/schedstat):
    /proc/PID/stat's 10 ms ticks are too coarse for one endpoint change."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def process_memory_mib(pid: int) -> dict[str, float]:
    """VmRSS and its parts, and the peak (VmHWM), from /proc/PID/status. RssFile counts the
    mapped slot pool's pages: kernel map memory seen through the mapping, not a copy."""
    wanted = {"VmRSS": "rss", "VmHWM": "peak_rss", "RssAnon": "anon", "RssFile": "file"}
    memory = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            memory[f"{wanted[key]}_mib"] = int(value.split()[0]) / 1024
    return memory


def map_sizes(services: int, endpoints: int, frontends: int | None = None) -> dict[str, int]:
    """--slot-pool-size, --max-services and --max-backends with room for every service's
    table, frontend and backend (and for resizes), never below the defaults."""
    from ebpflb.config import Config
    from ebpflb.maglev import table_size_for

    default = Config()
    frontends = frontends or services + 8

    def room(needed: int, floor: int) -> int:
        return max(1 << (needed * 5 // 4).bit_length(), floor)

    return {
        "slot_pool_size": room(services * table_size_for(endpoints), default.slot_pool_size),
        "max_services": room(frontends, default.max_services),
        "max_backends": room(services * endpoints, default.max_backends),
    }


# The agent's log lines the start-up figures come from.
_STARTUP_LINES = {
    "socket_lb_compiled": r"compiled and loaded socket-LB programs in ([\d.]+)s",
    "nodeport_compiled": r"compiled and loaded NodePort programs in ([\d.]+)s",
    "attached": r"socket-LB attached",
    "services_listed": r"listed (\d+) Services at resourceVersion \S+ in ([\d.]+)s",
    "slices_listed": r"listed (\d+) EndpointSlices at resourceVersion \S+ in ([\d.]+)s",
    "synced": r"initial sync complete in ([\d.]+)s: (\d+) frontends, (\d+) errors",
}


def _log_time(line: str) -> float | None:
    """The wall-clock time a log line was written (logging's asctime, to the millisecond)."""
    match = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ", line)
    if match is None:
        return None
    return datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S").timestamp() + int(match[2]) / 1000


def startup_figures(lines: Sequence[str], started_wall: float) -> dict[str, Any]:
    """When each start-up step ended (seconds after process start, from the log's own
    timestamps) and what the agent says it took."""
    figures: dict[str, Any] = {}
    for name, pattern in _STARTUP_LINES.items():
        for line in lines:
            match = re.search(pattern, line)
            if match is None:
                continue
            at = _log_time(line)
            if at is not None:
                figures[f"start_to_{name}_s"] = round(at - started_wall, 3)
            if name.endswith("_compiled"):
                figures[f"{name.removesuffix('_compiled')}_compile_s"] = float(match[1])
            elif name.endswith("_listed"):
                figures[f"{name.removesuffix('_listed')}_list_s"] = float(match[2])
                figures[f"{name.removesuffix('_listed')}_listed"] = int(match[1])
            elif name == "synced":
                figures["sync_s"] = float(match[1])
                figures["frontends"] = int(match[2])
                figures["sync_errors"] = int(match[3])
            break
    return figures


def latency_summary(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "median_s": statistics.median(ordered),
        "p99_s": percentile(ordered, 0.99),
        "min_s": ordered[0],
        "max_s": ordered[-1],
    }


@dataclass
class RunningAgent:
    """An `ebpflb run` process serving the bench's services, and what it cost so far."""

    agent: AgentProcess
    api: FakeApiServer
    services: Sequence[BenchService]
    bpffs: Path
    cgroup: Path
    metrics_url: str | None
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.agent.proc.pid

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)

    def memory(self) -> dict[str, float]:
        return process_memory_mib(self.pid)

    def change_latencies(self, picks: Sequence[int], *, pause: float) -> list[dict[str, float]]:
        """Per service index in `picks`: one of its endpoints turns not ready in the API;
        the seconds until the pinned service entry shows one backend fewer, and the agent's
        CPU seconds for it. `pause` before each, so that each is a lone change."""
        from ebpflb.datapath.kernel import KernelMapSet
        from ebpflb.model import Frontend, Proto

        results = []
        with KernelMapSet(self.bpffs) as maps:
            for index in picks:
                svc = self.services[index]
                frontend = Frontend(IPv4Address(svc.vip), PORT, Proto.TCP)
                entry = maps.services.get(frontend)
                if entry is None or entry.backend_count != svc.endpoint_count:
                    raise EbpflbError(f"{svc.name}: unexpected map entry {entry}")
                time.sleep(pause)
                cpu = live_threads_cpu_seconds(self.pid)
                started = time.perf_counter()
                self.api.update(slice_object(svc, not_ready=1))
                while (entry := maps.services.get(frontend)) is None or (
                    entry.backend_count != svc.endpoint_count - 1
                ):
                    if time.perf_counter() - started > CHANGE_TIMEOUT:
                        raise EbpflbError(f"{svc.name}: change not in the map after 30 s")
                    time.sleep(0.0001)
                latency = time.perf_counter() - started
                time.sleep(0.05)  # the agent finishes the sync (logging) it was in
                results.append(
                    {"seconds": latency, "cpu_s": live_threads_cpu_seconds(self.pid) - cpu}
                )
        return results


@contextlib.contextmanager
def running_agent(
    services: Sequence[BenchService],
    *,
    extra_args: Sequence[str] = (),
    netns: str | None = None,
    cgroup: Path | None = None,
    sync_period: float = 3600.0,
    min_sync_period: float = 0.1,
    metrics: bool = False,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[RunningAgent]:
    """Serve `services` from a fake API server, start `ebpflb run` on it (inside `netns` if
    given, with `extra_args` such as `--interfaces eth0,eth1`), wait for its first sync
    and yield it with its start-up figures; stop it and remove everything it made on exit.

    `cgroup`: where socket-LB attaches (default: a test cgroup made here). The agent's own
    bpffs directory is made here. `preexec_fn` runs in the agent's process before exec
    (e.g. CPU affinity, a memory cgroup). `metrics`: serve /metrics on a free port of
    127.0.0.1 (RunningAgent.metrics_url; reachable from here only without `netns`).
    Root only.
    """
    # Imported here so that `bench sync --help` works without bcc and without root.
    from ebpflb.datapath import loader
    from ebpflb.testing.agentproc import AgentProcess, cleanup_datapath
    from ebpflb.testing.fakeapi import FakeApiServer
    from ebpflb.testing.netns import Cgroup

    if os.geteuid() != 0:
        raise EbpflbError("the agent loads BPF programs: run the bench as root")
    tag = uuid.uuid4().hex[:8]
    bpffs = Path(f"/sys/fs/bpf/ebpflb-bench-{tag}")
    workdir = Path(tempfile.mkdtemp(prefix="ebpflb-bench-"))
    api = FakeApiServer()
    own_cgroup: Cgroup | None = None
    agent: AgentProcess | None = None
    try:
        # The agent's 127.0.0.1 is its namespace's: the API server must listen there.
        with thread_in_netns(netns) if netns else contextlib.nullcontext():
            api.start()
        loaded = time.perf_counter()
        api.load(objects(list(services)))
        api.compact()
        api_load_s = time.perf_counter() - loaded
        if cgroup is None:
            own_cgroup = Cgroup.create(f"ebpflb-bench-{tag}")
            cgroup = own_cgroup.path
        sizes = map_sizes(len(services), services[0].endpoint_count)
        metrics_port = _free_port() if metrics else None
        argv = [
            "--kubeconfig",
            str(api.write_kubeconfig(workdir / "kubeconfig")),
            "--bpffs",
            str(bpffs),
            "--cgroup",
            str(cgroup),
            *(f"--{name.replace('_', '-')}={value}" for name, value in sizes.items()),
            f"--sync-period={sync_period}",
            f"--min-sync-period={min_sync_period}",
            *([f"--metrics-bind-address=127.0.0.1:{metrics_port}"] if metrics_port else []),
            *extra_args,
        ]
        started_wall, started = time.time(), time.perf_counter()
        agent = AgentProcess(
            argv, netns=netns, log_file=workdir / "agent.log", preexec_fn=preexec_fn
        )
        try:
            line = agent.wait_for("initial sync complete", timeout=START_TIMEOUT)
        except (RuntimeError, TimeoutError) as exc:  # the agent died or hung: say why
            raise EbpflbError(f"ebpflb run did not sync: {exc}") from exc
        synced = time.perf_counter() - started
        cpu = process_cpu_seconds(agent.proc.pid)
        figures = startup_figures(agent.lines, started_wall)
        if figures.get("sync_errors") or figures.get("frontends", 0) < len(services):
            raise EbpflbError(f"unexpected initial sync: {line}\n{agent.output()[-3000:]}")
        figures.update(
            start_to_synced_s=synced,
            cpu_s_at_synced=cpu,
            api_load_s=api_load_s,
            **sizes,
            table_size=_table_size(services[0].endpoint_count),
        )
        url = f"http://127.0.0.1:{metrics_port}/metrics" if metrics_port else None
        yield RunningAgent(agent, api, services, bpffs, cgroup, url, figures)
    finally:
        if agent is not None:
            agent.stop()
        api.close()
        if cgroup is not None:
            cleanup_datapath(bpffs, cgroup, _interfaces_in(extra_args), netns=netns)
        if bpffs.exists():  # pins the cleanup did not know (or cleanup failed)
            loader.cleanup(bpffs, Path("/nonexistent"), interfaces=())
        if own_cgroup is not None:
            own_cgroup.close()
        shutil.rmtree(workdir, ignore_errors=True)  # failures quote the agent's log already


def _interfaces_in(args: Sequence[str]) -> list[str]:
    """The interfaces an `--interfaces` argument names (the only ones to clean up)."""
    names: list[str] = []
    for index, arg in enumerate(args):
        if arg.startswith("--interfaces="):
            names = arg.partition("=")[2].split(",")
        elif arg == "--interfaces" and index + 1 < len(args):
            names = args[index + 1].split(",")
    return [name for name in names if name]


def _table_size(endpoints: int) -> int:
    from ebpflb.maglev import table_size_for

    return table_size_for(endpoints)


def _after_sync(run: RunningAgent, *, pause: float) -> dict[str, Any]:
    figures = dict(run.figures)
    time.sleep(pause)  # the agent settles after its first sync (GC freeze, heap trim)
    figures["memory_after_sync"] = run.memory()
    # Kernel memory the agent sees through its mapping of the slot pool (in RssFile).
    figures["slot_tables_mib"] = figures["frontends"] * figures["table_size"] * 4 / 2**20
    figures["cpu_s_settled"] = run.cpu_seconds()
    return figures


def _change_figures(run: RunningAgent, changes: Sequence[int], *, pause: float) -> dict[str, Any]:
    results = run.change_latencies(changes, pause=pause) if changes else []
    seconds = [r["seconds"] for r in results]
    return {
        "change_to_map_s": seconds,
        "change_cpu_s": [r["cpu_s"] for r in results],
        "change_latency": latency_summary(seconds),
    }


def _periodic_resync_s(run: RunningAgent, first_sync_s: float, sync_period: float) -> float | None:
    """The duration of one periodic full resync (re-read, compare, repair), from metrics."""
    assert run.metrics_url is not None
    labels = 'kind="full",result="ok"'
    deadline = time.perf_counter() + sync_period + 120
    while (_metric(run.metrics_url, "ebpflb_syncs_total", labels) or 0) < 2:
        if time.perf_counter() > deadline:
            return None
        time.sleep(0.2)
    count = _metric(run.metrics_url, "ebpflb_syncs_total", labels) or 0
    total = _metric(run.metrics_url, "ebpflb_sync_duration_seconds_sum", 'kind="full"') or 0.0
    return (total - first_sync_s) / (count - 1)


def bench_ebpflb(
    services: Sequence[BenchService],
    changes: Sequence[int],
    *,
    sync_period: float,
    min_sync_period: float,
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    with running_agent(
        services,
        extra_args=extra_args,
        sync_period=sync_period,
        min_sync_period=min_sync_period,
        metrics=True,
    ) as run:
        # Past the minimum interval since the last sync, as a lone change would be.
        pause = min_sync_period + 0.2
        report = _after_sync(run, pause=pause)
        report["periodic_full_resync_s"] = _periodic_resync_s(run, report["sync_s"], sync_period)
        # The changes right after that resync: none waits behind the next one (a change
        # that comes during a full resync waits for it: the figure above).
        report.update(_change_figures(run, changes, pause=pause))
        assert run.metrics_url is not None
        repaired = _metric(run.metrics_url, "ebpflb_drift_repaired_total", 'map="ebpflb_svc4"')
        report["drift_repaired_svc4"] = repaired or 0.0
        report["memory_end"] = run.memory()
        report["cpu_s_end"] = run.cpu_seconds()
    return report


# ---- the whole bench -----------------------------------------------------------------------


def run_sync_bench(
    *,
    services: int = 10_000,
    endpoints: int = 3,
    changes: int = 5,
    sync_period: float = 15.0,
    min_sync_period: float = 0.5,
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """The whole bench (kube-proxy's modes side by side: `ebpflb bench`, compare.py)."""
    specs = bench_services(services, endpoints)
    if changes < 1:
        raise ConfigError("--changes must be at least 1")
    picks = [(k * 7919 + services // 2) % services for k in range(changes)]  # spread out
    started = time.perf_counter()
    report: dict[str, Any] = {
        "services": services,
        "endpoints_per_service": endpoints,
        "changes": changes,
        "cpus": os.cpu_count(),
        "kernel": os.uname().release,
        "ebpflb": bench_ebpflb(
            specs,
            picks,
            sync_period=sync_period,
            min_sync_period=min_sync_period,
            extra_args=extra_args,
        ),
    }
    report["ebpflb"]["sync_period_s"] = sync_period
    report["ebpflb"]["min_sync_period_s"] = min_sync_period
    report["total_s"] = time.perf_counter() - started
    return report


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _spread(values: Sequence[float]) -> str:
    if len(values) == 1:
        return _ms(values[0])
    summary = latency_summary(values)
    return (
        f"median {_ms(summary['median_s'])} (p99 {_ms(summary['p99_s'])},"
        f" min {_ms(summary['min_s'])}, max {_ms(summary['max_s'])})"
    )


def _row(label: str, value: str) -> str:
    return f"  {label:<46}{value}"


def _ebpflb_lines(e: dict[str, Any]) -> list[str]:
    lines = []
    for name, label in (("socket_lb", "socket-LB"), ("nodeport", "NodePort")):
        if f"{name}_compile_s" in e:
            lines.append(_row(f"compile + load {label} programs", _ms(e[f"{name}_compile_s"])))
    if "start_to_attached_s" in e:
        lines.append(_row("start -> programs attached", _ms(e["start_to_attached_s"])))
    for kind, label in (("services", "Services"), ("slices", "EndpointSlices")):
        if f"{kind}_list_s" in e:
            lines.append(
                _row(
                    f"list {e[f'{kind}_listed']:,} {label} (in parallel)",
                    f"{_ms(e[f'{kind}_list_s'])}, done at {_ms(e[f'start_to_{kind}_listed_s'])}",
                )
            )
    lines += [
        _row(
            f"first sync: {e['frontends']:,} frontends, M={e['table_size']} each",
            _ms(e["sync_s"]),
        ),
        _row("start -> synced", _ms(e["start_to_synced_s"])),
        _row("agent CPU, start -> synced", f"{e['cpu_s_at_synced']:.2f} s"),
        _row(
            "one slice change -> map entry written",
            f"{_spread(e['change_to_map_s'])}, {len(e['change_to_map_s'])} changes",
        ),
    ]
    if e.get("periodic_full_resync_s") is not None:
        lines.append(
            _row(
                f"periodic full resync (every {e['sync_period_s']:g} s here)",
                f"{_ms(e['periodic_full_resync_s'])} (re-read, compare, repair)",
            )
        )
    memory = e["memory_after_sync"]
    lines += [
        _row(
            "agent memory after sync",
            f"RSS {memory['rss_mib']:.0f} MiB, peak {memory['peak_rss_mib']:.0f} MiB",
        ),
        _row("  its own (anonymous)", f"{memory['anon_mib']:.0f} MiB"),
        _row(
            "  file-backed: libraries, mapped slot pool",
            f"{memory['file_mib']:.0f} MiB, of which ~{e['slot_tables_mib']:.0f} MiB slot"
            " tables (kernel memory)",
        ),
    ]
    return lines


def render_text(report: dict[str, Any]) -> str:
    e = report["ebpflb"]
    n, k = report["services"], report["endpoints_per_service"]
    lines = [
        f"ebpflb bench sync: {n:,} Services x {k} endpoints ({n * k:,} endpoints, {n:,}"
        f" EndpointSlices), {report['cpus']} CPUs, Linux {report['kernel']}",
        "",
        "ebpflb: `ebpflb run --kubeconfig` on the fake API server (127.0.0.1), real BPF maps",
        *_ebpflb_lines(e),
    ]
    lines += ["", f"total bench time {report['total_s']:.0f} s"]
    return "\n".join(lines)
