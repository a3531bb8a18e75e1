"""What the agent's cold start and its process cost, as the bench records them.

Shared by `bench compare` (ebpflb's control-plane figures) and `bench sync`. The start-up
phases come from the agent's /status endpoint (lab.bench.agent reads it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Listing:
    """One initial list of the API source: how many objects, and how long it took."""

    objects: int
    seconds: float


@dataclass(frozen=True)
class MapSizes:
    """The map sizes the bench gave the agent (room for every service, never below the
    defaults)."""

    slot_pool_size: int
    max_services: int
    max_backends: int


@dataclass(frozen=True)
class AgentStartup:
    """The agent's cold start: from the bench spawning `ebpflb run` to every service in the
    maps. Phase times are seconds after the spawn (the agent reports them after its own
    process start; the interpreter's start-up lies between the two)."""

    start_to_synced_s: float
    cpu_s_at_synced: float
    frontends: int
    sync_errors: int
    first_sync_s: float | None = None  # the first sync alone
    # Phase name ("socket_lb_compiled", "attached", "services_listed", ...) -> seconds.
    phases: Mapping[str, float] = field(default_factory=dict)
    # Program set ("socket_lb", "nodeport") -> compile and load seconds.
    compile_s: Mapping[str, float] = field(default_factory=dict)
    # Kind ("Service", "EndpointSlice") -> its initial list.
    lists: Mapping[str, Listing] = field(default_factory=dict)
    api_load_s: float | None = None  # filling the fake API server, before the spawn
    map_sizes: MapSizes | None = None
    table_size: int | None = None  # each service's Maglev table size M
    # Program set -> how its programs got into the kernel: "adopted" (pinned by the previous
    # agent, nothing compiled or loaded), "loaded" (stored bytecode), "compiled" (a child).
    program_origin: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CgroupMemory:
    """The agent's memory cgroup: everything its process tree (the agent, its compile
    children) and the kernel objects it allocates (BPF maps) are charged, which is what
    a pod's memory limit counts. cgroup v2's memory.peak and memory.stat."""

    peak_mib: float  # memory.peak: the most charged at once since the cgroup was made
    current_mib: float  # memory.current when read
    anon_mib: float  # memory.stat when read: the processes' own memory
    file_mib: float  # page cache (headers read by a compile, the slot pool's mapping)
    kernel_mib: float  # kernel memory: BPF maps, page tables, slabs


@dataclass(frozen=True)
class ProcessMemory:
    """VmRSS and its parts, and the peak (VmHWM), of one process. `file_mib` counts the
    mapped slot pool's pages: kernel map memory seen through the mapping, not a copy."""

    rss_mib: float
    peak_rss_mib: float
    anon_mib: float
    file_mib: float
