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
    # Compiler libraries (BCC, LLVM, clang, numba's llvmlite) mapped into the agent once synced.
    compiler_libraries: tuple[str, ...] = ()
    # A second agent started on the same pins after the first stopped (SIGTERM): its start-up,
    # memory once ready, and compiler libraries.
    restart: AgentStartup | None = None
    restart_memory: ProcessMemory | None = None
    restart_compiler_libraries: tuple[str, ...] = ()
