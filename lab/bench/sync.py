"""`ebpflb bench sync`: the agent's control plane fed by the Kubernetes API, in detail.

The real agent serves N Services of K endpoints from the fake API server (up to 131,070
services x 16 endpoints; lab.bench.agentrun) or from one manifest file of 2 x N
documents (`--source manifests`), with its own bpffs directory, test cgroup and memory
cgroup, all removed at the end. A run is a source (what starts the agent on the services:
SOURCES) and a list of steps (STEPS), each measuring one thing on the running agent into
SyncFigures; the record (SyncRun) and the verdicts on the targets
(lab.bench.synctargets) are built from those at the end. Another source or measurement
plugs in as an entry in SOURCES or STEPS.

Measured by the default steps: each start-up step (from /status), the agent's CPU seconds,
memory and mapped compiler libraries once settled, the kernel memory of its maps, one
periodic full resync (its /status result), right after it a few lone single-slice changes
(one endpoint turning not ready, or its document edited; source write -> the pinned map
showing the new entry, polled from this process) and sustained churn (API source;
lab.bench.measure.churn), the drift the resync repaired, and last a restart on the same
pins (restart -> ready, and what the new process then costs in memory).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from ebpflb.errors import ConfigError, EbpflbError
from lab.bench.agentrun import RunningAgent, running_agent
from lab.bench.measure.churn import POLL, churn
from lab.bench.measure.cost import mapped_libraries
from lab.bench.records.agent import AgentStartup, CgroupMemory, ProcessMemory
from lab.bench.records.compare import KernelMemory
from lab.bench.records.sync import Churn, SyncRun
from lab.bench.scenario import BenchService, bench_services
from lab.bench.settings import SyncSettings, SyncSource
from lab.bench.stats import spread
from lab.bench.synctargets import judge

SLOT_BYTES = 4  # one u32 backend id per Maglev slot
METRICS_TIMEOUT = 120.0  # /metrics at 100,000 services, one series per frontend: seconds


@dataclass
class SyncFigures:
    """What the steps measured so far (None: not yet, or not by this run's steps)."""

    memory_after_sync: ProcessMemory | None = None
    cpu_s_settled: float | None = None
    kernel_memory: KernelMemory | None = None
    periodic_full_resync_s: float | None = None
    resync_started: float | None = None  # unix time the measured resync started
    change_to_map_s: tuple[float, ...] = ()
    change_cpu_s: tuple[float, ...] = ()
    changed: tuple[int, ...] = ()  # services the lone changes left with one endpoint down
    churn: Churn | None = None
    drift_repaired_svc4: float = 0.0
    metrics_scrape_s: float | None = None
    compiler_libraries: tuple[str, ...] = ()  # mapped into the settled agent
    memory_end: ProcessMemory | None = None
    cpu_s_end: float | None = None
    cgroup_memory: CgroupMemory | None = None
    restart: AgentStartup | None = None
    restart_memory: ProcessMemory | None = None
    restart_compiler_libraries: tuple[str, ...] = ()


# ---- sources: the agent started on the services ----------------------------------------

Source = Callable[
    [SyncSettings, Sequence[BenchService]], contextlib.AbstractContextManager[RunningAgent]
]


def agent_source(manifests: bool) -> Source:
    """`ebpflb run` on the fake API server (`--kubeconfig`) or on one manifest file
    (`--manifests`), in a memory cgroup of its own."""

    @contextlib.contextmanager
    def start(settings: SyncSettings, specs: Sequence[BenchService]) -> Iterator[RunningAgent]:
        from lab.bench.measure.cost import memory_cgroup

        with (
            memory_cgroup(f"ebpflb-bench-sync-{os.getpid()}") as cgroup,
            running_agent(
                specs,
                extra_args=settings.agent_args,
                sync_period=settings.sync_period,
                min_sync_period=settings.min_sync_period,
                preexec_fn=cgroup.enter if cgroup is not None else None,
                manifests=manifests,
            ) as run,
        ):
            run.memory_cgroup = cgroup
            yield run

    return start


SOURCES: dict[SyncSource, Source] = {
    SyncSource.API: agent_source(manifests=False),
    SyncSource.MANIFESTS: agent_source(manifests=True),
}


# ---- steps ---------------------------------------------------------------------------------

Step = Callable[[SyncSettings, RunningAgent, SyncFigures], None]


def settle(settings: SyncSettings, run: RunningAgent, figures: SyncFigures) -> None:
    """Memory and CPU once the agent has settled after its first sync (GC, heap trim)."""
    time.sleep(settings.min_sync_period + 0.2)
    figures.memory_after_sync = run.memory()
    figures.compiler_libraries = mapped_libraries(run.pid)
    figures.cpu_s_settled = run.cpu_seconds()


def kernel_memory(settings: SyncSettings, run: RunningAgent, figures: SyncFigures) -> None:
    """Kernel memory charged to the agent's memory cgroup, and bpftool's map figure."""
    from lab.bench.measure.cost import bpf_map_bytes

    cgroup = run.memory_cgroup
    figures.kernel_memory = KernelMemory(
        cgroup_bytes=cgroup.kernel_bytes() if cgroup is not None else None,
        bpf_map_bytes=bpf_map_bytes(run.bpffs),
    )


def sync_picks(services: int, changes: int) -> list[int]:
    """The services whose slices change: spread out."""
    return [(k * 7919 + services // 2) % services for k in range(changes)]


def lone_changes(settings: SyncSettings, run: RunningAgent, figures: SyncFigures) -> None:
    """A few single-slice changes, each past the minimum interval since the last sync."""
    picks = sync_picks(settings.services, settings.changes)
    changes = run.change_latencies(picks, pause=settings.min_sync_period + 0.2)
    figures.change_to_map_s = tuple(c.seconds for c in changes)
    figures.change_cpu_s = tuple(c.cpu_s for c in changes)
    figures.changed = tuple(picks)


def periodic_resync(settings: SyncSettings, run: RunningAgent, figures: SyncFigures) -> None:
    """The duration of one periodic full resync (re-read, compare, repair)."""
    result = run.endpoints.wait_for_full_resync(timeout=settings.sync_period + 120)
    if result is not None:
        figures.periodic_full_resync_s = result.duration_s
        if result.finished is not None:
            figures.resync_started = result.finished - result.duration_s


def sustained_churn(settings: SyncSettings, run: RunningAgent, figures: SyncFigures) -> None:
    """churn_rate changes/s for churn_seconds, soon after the periodic resync (so that the
    next one is most of a sync period away); their sampled API -> map latency. The bench
    process's cyclic GC is off meanwhile: its pauses would count as the agent's latency.
    Written to the API server: only when the agent reads it."""
    if not settings.churn or settings.source is not SyncSource.API:
        return
    from lab.bench.measure.cost import live_threads_cpu_seconds

    syncs, cpu = run.endpoints.status().sync_count, live_threads_cpu_seconds(run.pid)
    window_start = time.time()
    gc.disable()
    try:
        measured = churn(
            run.api,
            run.bpffs,
            run.services,
            rate=settings.churn_rate,
            seconds=settings.churn_seconds,
            sample=settings.churn_sample,
            skip=figures.changed,
        )
    finally:
        gc.enable()
    agent_cpu = live_threads_cpu_seconds(run.pid) - cpu
    window_end = time.time()
    syncs = run.endpoints.status().sync_count - syncs
    latencies = measured.latencies_s
    s = spread(latencies) if latencies else None
    gaps = spread(measured.poller_gaps_s) if measured.poller_gaps_s else None
    next_full = (
        figures.resync_started + settings.sync_period
        if figures.resync_started is not None
        else None
    )
    figures.churn = Churn(
        rate=settings.churn_rate,
        seconds=settings.churn_seconds,
        written=measured.written,
        achieved_rate=measured.written / measured.writing_s if measured.writing_s else 0.0,
        writer_lag_max_s=measured.writer_lag_max_s,
        sampled=len(latencies) + measured.timed_out,
        timed_out=measured.timed_out,
        p50_s=s.median if s else None,
        p99_s=s.p99 if s else None,
        max_s=s.maximum if s else None,
        poll_interval_s=POLL,
        poller_gap_p99_s=gaps.p99 if gaps else 0.0,
        poller_gap_max_s=gaps.maximum if gaps else 0.0,
        poller_cpu_share=measured.poller_cpu_s / (window_end - window_start),
        agent_cpu_s=agent_cpu,
        syncs=syncs,
        resync_in_window=next_full is None or window_start <= next_full <= window_end,
        min_sync_period=settings.min_sync_period,
    )


def drift(settings: SyncSettings, run: RunningAgent, figures: SyncFigures) -> None:
    """Service entries the resync found wrong (0 expected). Last: at 100,000 services the
    agent takes seconds to render /metrics (one series per frontend), CPU no other step
    should compete with."""
    endpoints = dataclasses.replace(run.endpoints, timeout=METRICS_TIMEOUT)
    started = time.perf_counter()
    repaired = endpoints.metric("ebpflb_drift_repaired_total", {"map": "ebpflb_svc4"})
    figures.metrics_scrape_s = time.perf_counter() - started
    figures.drift_repaired_svc4 = repaired or 0.0


def end_of_run(settings: SyncSettings, run: RunningAgent, figures: SyncFigures) -> None:
    """The first agent's memory and CPU at the end of its measurements, and its memory
    cgroup's peak (before the restart adds a second process's start-up to it)."""
    figures.memory_end, figures.cpu_s_end = run.memory(), run.cpu_seconds()
    if run.memory_cgroup is not None:
        figures.cgroup_memory = run.memory_cgroup.usage()


def restart(settings: SyncSettings, run: RunningAgent, figures: SyncFigures) -> None:
    """A restart on the same pins (SIGTERM, then a new process): the programs are adopted,
    the maps relearned; the new process's start-up, memory and compiler libraries."""
    figures.restart = run.restart()
    time.sleep(settings.min_sync_period + 0.2)
    figures.restart_memory = run.memory()
    figures.restart_compiler_libraries = mapped_libraries(run.pid)


# The resync first: the first one is due a sync period after the first sync *started*,
# which at 100,000 services can be right after it ended; changes behind it would wait.
# The restart last: it replaces the process the other steps measure.
STEPS: tuple[Step, ...] = (
    settle,
    kernel_memory,
    periodic_resync,
    lone_changes,
    sustained_churn,
    drift,
    end_of_run,
    restart,
)


# ---- a run ---------------------------------------------------------------------------------


def agent_flags(args: Sequence[str]) -> tuple[str, ...]:
    """The flags worth reporting: map sizes, sync periods and the run's own extra flags
    (not paths or ports, which change every run)."""
    wanted = (
        "--slot-pool-size",
        "--max-services",
        "--max-backends",
        "--sync-period",
        "--min-sync-period",
        "--per-service-metrics",
    )
    return tuple(a for a in args if a.startswith(wanted))


def run_sync_bench(
    settings: SyncSettings,
    *,
    sources: Mapping[SyncSource, Source] = SOURCES,
    steps: Sequence[Step] = STEPS,
) -> SyncRun:
    settings.validate()
    source = sources.get(settings.source)
    if source is None:
        raise ConfigError(f"bench sync: no {settings.source.value!r} source in this build")
    specs = bench_services(settings.services, settings.endpoints)
    started = time.perf_counter()
    figures = SyncFigures()
    with source(settings, specs) as run:
        for step in steps:
            step(settings, run, figures)
        startup, args = run.startup, run.agent.argv
    if figures.memory_after_sync is None or figures.cpu_s_settled is None:
        raise EbpflbError("bench sync: the steps measured no settled memory (settle step)")
    table_size = startup.table_size or 0
    record = SyncRun(
        settings=settings,
        cpus=os.cpu_count() or 1,
        kernel=os.uname().release,
        startup=startup,
        memory_after_sync=figures.memory_after_sync,
        # Kernel memory the agent sees through its mapping of the slot pool (in RssFile).
        slot_tables_mib=startup.frontends * table_size * SLOT_BYTES / 2**20,
        cpu_s_settled=figures.cpu_s_settled,
        periodic_full_resync_s=figures.periodic_full_resync_s,
        change_to_map_s=figures.change_to_map_s,
        change_cpu_s=figures.change_cpu_s,
        drift_repaired_svc4=figures.drift_repaired_svc4,
        memory_end=figures.memory_end or figures.memory_after_sync,
        cpu_s_end=figures.cpu_s_end if figures.cpu_s_end is not None else figures.cpu_s_settled,
        total_s=time.perf_counter() - started,
        compiler_libraries=figures.compiler_libraries,
        restart_memory=figures.restart_memory,
        restart_compiler_libraries=figures.restart_compiler_libraries,
        agent_args=agent_flags(args),
        kernel_memory=figures.kernel_memory,
        churn=figures.churn,
        restart=figures.restart,
        metrics_scrape_s=figures.metrics_scrape_s,
        cgroup_memory=figures.cgroup_memory,
    )
    return dataclasses.replace(record, targets=judge(record))
