"""`ebpflb bench sync`: the agent's control plane fed by the Kubernetes API, in detail.

The real agent serves N Services of K endpoints from the fake API server (up to 131,070
services; ebpflb.bench.agentrun), or with `--source manifests` from one manifest file of
2 x N documents, in this namespace with its own bpffs directory and test cgroup, all
removed at the end. Measured: each start-up step (from /status), the agent's
CPU seconds and memory once settled, one periodic full resync (its /status result), and
for a few single-slice changes (one endpoint turning not ready) the time from the API
write to the pinned map showing the new service entry, polled from this process. Last,
the agent is stopped and started again on the same pins (restart -> ready, and what it
then costs in memory), and the compiler libraries mapped into either process are listed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from ebpflb.bench.agentrun import RunningAgent, running_agent
from ebpflb.bench.measure.cost import mapped_libraries
from ebpflb.bench.records.sync import SyncRun
from ebpflb.bench.scenario import bench_services
from ebpflb.bench.settings import SyncSettings, SyncSource

SLOT_BYTES = 4  # one u32 backend id per Maglev slot


def _periodic_resync_s(run: RunningAgent, sync_period: float) -> float | None:
    """The duration of one periodic full resync (re-read, compare, repair)."""
    result = run.endpoints.wait_for_full_resync(timeout=sync_period + 120)
    return result.duration_s if result else None


def sync_picks(services: int, changes: int) -> list[int]:
    """The services whose slices change: spread out."""
    return [(k * 7919 + services // 2) % services for k in range(changes)]


def run_sync_bench(settings: SyncSettings, *, extra_args: Sequence[str] = ()) -> SyncRun:
    settings.validate()
    specs = bench_services(settings.services, settings.endpoints)
    picks = sync_picks(settings.services, settings.changes)
    started = time.perf_counter()
    with running_agent(
        specs,
        extra_args=extra_args,
        sync_period=settings.sync_period,
        min_sync_period=settings.min_sync_period,
        manifests=settings.source is SyncSource.MANIFESTS,
    ) as run:
        # Past the minimum interval since the last sync, as a lone change would be.
        pause = settings.min_sync_period + 0.2
        time.sleep(pause)  # the agent settles after its first sync (GC freeze, heap trim)
        memory_after_sync = run.memory()
        libraries = mapped_libraries(run.pid)
        cpu_s_settled = run.cpu_seconds()
        resync_s = _periodic_resync_s(run, settings.sync_period)
        # The changes right after that resync: none waits behind the next one (a change
        # that comes during a full resync waits for it: the figure above).
        changes = run.change_latencies(picks, pause=pause)
        repaired = run.endpoints.metric("ebpflb_drift_repaired_total", {"map": "ebpflb_svc4"})
        memory_end, cpu_s_end = run.memory(), run.cpu_seconds()
        startup = run.startup
        # A restart on the same pins: the programs are adopted, the maps relearned.
        restart = run.restart()
        time.sleep(pause)
        restart_memory, restart_libraries = run.memory(), mapped_libraries(run.pid)
    table_size = startup.table_size or 0
    return SyncRun(
        settings=settings,
        cpus=os.cpu_count() or 1,
        kernel=os.uname().release,
        startup=startup,
        memory_after_sync=memory_after_sync,
        # Kernel memory the agent sees through its mapping of the slot pool (in RssFile).
        slot_tables_mib=startup.frontends * table_size * SLOT_BYTES / 2**20,
        cpu_s_settled=cpu_s_settled,
        periodic_full_resync_s=resync_s,
        change_to_map_s=tuple(c.seconds for c in changes),
        change_cpu_s=tuple(c.cpu_s for c in changes),
        drift_repaired_svc4=repaired or 0.0,
        memory_end=memory_end,
        cpu_s_end=cpu_s_end,
        total_s=time.perf_counter() - started,
        compiler_libraries=libraries,
        restart=restart,
        restart_memory=restart_memory,
        restart_compiler_libraries=restart_libraries,
    )
