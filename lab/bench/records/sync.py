"""`ebpflb bench sync`'s results: the agent's cold start, memory, resync, changes, churn,
and the verdicts on issue 15's control-plane targets.

Fields after `total_s` have defaults: reports saved before them (docs/bench, schema 1 and
early schema 2) still load, and a figure a run did not measure stays None ("not measured"
in the targets). `restart` is filled by a restart step (a second agent on the same pins).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lab.bench.records.agent import AgentStartup, CgroupMemory, ProcessMemory
from lab.bench.records.compare import KernelMemory, Verdict
from lab.bench.settings import SyncSettings


@dataclass(frozen=True)
class Churn:
    """Sustained endpoint changes written to the API at a fixed rate, and the API write ->
    map entry latency of a random sample of them (lab.bench.measure.churn)."""

    rate: float  # changes per second asked for
    seconds: float  # how long they were written
    written: int  # changes written
    achieved_rate: float  # written / the time writing took
    writer_lag_max_s: float  # worst delay of a write behind its schedule
    sampled: int  # changes whose latency was measured
    timed_out: int  # sampled changes never seen in the map within the timeout
    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    poll_interval_s: float  # the poller's sleep between passes
    poller_gap_p99_s: float  # time between its passes: its real resolution, p99 and max
    poller_gap_max_s: float
    poller_cpu_share: float  # the poller thread's CPU seconds / the window's seconds
    agent_cpu_s: float  # the agent's CPU over the window
    syncs: int  # the agent's syncs over the window (its /status count)
    # A periodic full resync was due inside the window by the agent's schedule (the last
    # one's start + the sync period): changes arriving during one wait for it.
    resync_in_window: bool
    min_sync_period: float  # the agent's --min-sync-period in this run


@dataclass(frozen=True)
class SyncRun:
    KIND: ClassVar[str] = "sync"

    settings: SyncSettings
    cpus: int
    kernel: str
    startup: AgentStartup
    memory_after_sync: ProcessMemory
    slot_tables_mib: float  # kernel memory the agent sees through its slot-pool mapping
    cpu_s_settled: float
    periodic_full_resync_s: float | None  # None: no periodic resync came in time
    change_to_map_s: tuple[float, ...]  # API write -> pinned map entry, per change
    change_cpu_s: tuple[float, ...]
    drift_repaired_svc4: float  # service entries a resync found wrong (0 expected)
    memory_end: ProcessMemory
    cpu_s_end: float
    total_s: float
    # Compiler libraries (BCC, LLVM, clang, a JIT's llvmlite) mapped into the agent once synced.
    compiler_libraries: tuple[str, ...] = ()
    # A second agent started on the same pins after the first stopped (SIGTERM): its start-up,
    # memory once ready, and compiler libraries.
    restart: AgentStartup | None = None
    restart_memory: ProcessMemory | None = None
    restart_compiler_libraries: tuple[str, ...] = ()
    # The agent's command-line flags beyond the kubeconfig, pins and cgroup (map sizes,
    # sync periods): what a reader needs to run it the same way.
    agent_args: tuple[str, ...] = ()
    # What the maps cost the kernel: the agent's memory cgroup, bpftool's figure.
    kernel_memory: KernelMemory | None = None
    churn: Churn | None = None
    metrics_scrape_s: float | None = None  # one GET /metrics of the synced agent
    # The agent's memory cgroup at the end of the first agent's measurements: its peak is
    # the run's (start-up, compile, sync, resync, churn), what a pod's limit must allow.
    cgroup_memory: CgroupMemory | None = None
    targets: tuple[Verdict, ...] = ()
