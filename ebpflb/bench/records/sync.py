"""`ebpflb bench sync`'s results: the agent's cold start, memory, resync and changes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ebpflb.bench.records.agent import AgentStartup, ProcessMemory
from ebpflb.bench.settings import SyncSettings


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
