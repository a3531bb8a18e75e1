"""What the agent is doing and has done, as typed values: the record behind /status.

Start-up phases, compile times, the source's list sizes and times, every sync's result,
the XDP mode each interface got, the programs taken over from a previous agent, and the
input it had to reject. The app records start-up, the agent records syncs (it calls the
SyncObserver methods), the source is asked at read time (`Source.progress()`); HTTP
threads read `to_json()`. Tests, the demo and the bench read these figures from /status
(and the metrics made from them), never from log lines.
"""

from __future__ import annotations

import enum
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebpflb.clock import Clock
from ebpflb.k8s.sources.base import Kind, SourceProgress
from ebpflb.model import NamespacedName
from ebpflb.observe.health import ProxyHealth

# Problems listed in /status at most per section (their total is given too).
MAX_LISTED = 100
# Error messages kept from one sync.
MAX_SYNC_ERRORS = 20


class Phase(enum.Enum):
    """Start-up steps, in the order they usually end (lists overlap the compile)."""

    PIN_DIR_LOCKED = "pin_dir_locked"  # this agent alone on the pins (ebpflb.host.lock)
    SOCKET_LB_COMPILED = "socket_lb_compiled"
    NODEPORT_COMPILED = "nodeport_compiled"
    POD_COMPILED = "pod_compiled"  # the per-packet ClusterIP path's (--pod-interfaces)
    ATTACHED = "attached"  # every program attached (socket-LB, then NodePort)
    SERVICES_LISTED = "services_listed"
    SLICES_LISTED = "slices_listed"
    FIRST_SYNC = "first_sync"


LIST_PHASES = {Kind.SERVICE: Phase.SERVICES_LISTED, Kind.ENDPOINT_SLICE: Phase.SLICES_LISTED}


class SyncRecordKind(enum.Enum):
    FIRST = "first"  # the first sync: every service, after restoring what the maps hold
    INCREMENTAL = "incremental"  # the services changed since the last sync
    FULL = "full"  # periodic: maps re-read and repaired


@dataclass(frozen=True, slots=True)
class SyncRecord:
    """One sync's outcome. Counts are frontends, except `failed`: services whose change
    could not be written (retried)."""

    kind: SyncRecordKind
    finished: float  # unix time
    duration_s: float
    frontends: int  # programmed after it
    ok: bool  # nothing left to retry
    added: int = 0
    updated: int = 0
    removed: int = 0
    unchanged: int = 0
    failed: int = 0
    errors: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "finished": self.finished,
            "duration_s": self.duration_s,
            "added": self.added,
            "updated": self.updated,
            "removed": self.removed,
            "unchanged": self.unchanged,
            "failed": self.failed,
            "errors": list(self.errors[:MAX_SYNC_ERRORS]),
            "error_count": len(self.errors),
            "frontends": self.frontends,
            "ok": self.ok,
        }


def process_start_time() -> float:
    """Unix time this process started: its start in clock ticks after boot (/proc), so the
    interpreter's own start-up counts too."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - after_boot)
    except (OSError, ValueError, IndexError):
        return time.time()


class AgentStatus:
    """Thread-safe; one per agent process. Implements the agent's SyncObserver."""

    def __init__(self, health: ProxyHealth, clock: Clock, process_start: float) -> None:
        self.health = health
        self.process_start = process_start
        self._clock = clock
        self._lock = threading.Lock()
        self._phases: dict[Phase, float] = {}
        self._compile: dict[str, float] = {}
        self._origin: dict[str, str] = {}
        self._headers: dict[str, str] = {}
        self._replaced = 0
        self._interfaces: dict[str, str] = {}
        self._pod_interfaces: dict[str, Any] = {}
        self._socket_lb: dict[str, Any] = {}
        self._program_ids: dict[str, int] = {}
        self._syncs = 0
        self._first: SyncRecord | None = None
        self._last: SyncRecord | None = None
        self._changes = {"added": 0, "updated": 0, "removed": 0}
        self._invalid: dict[tuple[str, str], str] = {}
        self._orphans: dict[NamespacedName, tuple[NamespacedName, ...]] = {}
        self._progress: Callable[[], SourceProgress] = SourceProgress
        self._lock_wait: dict[str, Any] | None = None  # waiting for the pin directory
        self._features: dict[str, dict[str, Any]] = {}
        self._pin_layout: dict[str, Any] = {}

    # ---- start-up (the app) --------------------------------------------------------------

    def phase_done(self, phase: Phase) -> None:
        """`phase` ended now (the first time only)."""
        seconds = self._clock.wall() - self.process_start
        with self._lock:
            self._phases.setdefault(phase, seconds)

    def compiled(
        self, program: str, seconds: float, phase: Phase, origin: str = "", headers: str = ""
    ) -> None:
        """`program`'s programs are in the kernel after `seconds`; `origin` says how they
        got there ("adopted", "loaded", "compiled": ebpflb.datapath.programs.programset.Origin),
        `headers` which kernel header tree compiled them (headers.KernelHeaders.describe)."""
        with self._lock:
            self._compile[program] = seconds
            if origin:
                self._origin[program] = origin
            if headers:
                self._headers[program] = headers
        self.phase_done(phase)

    def programs_replaced(self, count: int) -> None:
        with self._lock:
            self._replaced += count

    def interfaces_attached(self, xdp_modes: Mapping[str, str]) -> None:
        """The XDP mode ("native", "generic", or "off": tc only) each interface got."""
        with self._lock:
            self._interfaces.update(xdp_modes)

    def program_ids(self, ids: Mapping[str, int]) -> None:
        """Each loaded program's id (function name -> id, for `bpftool prog show id N`)."""
        with self._lock:
            self._program_ids.update(ids)

    def socket_lb(self, scope: str, netns_cookie: int | None, udp_destroy: str) -> None:
        """--socket-lb's scope ("all", "hostns-only", "off"), for hostns-only the network
        namespace cookie the programs translate for, and how connected UDP sockets of a
        backend that left are destroyed."""
        with self._lock:
            self._socket_lb = {
                "scope": scope,
                "netns_cookie": netns_cookie,
                "udp_socket_destroy": udp_destroy,
            }

    def pod_interfaces(
        self, patterns: Sequence[str], attached: Sequence[str], failed: Sequence[str]
    ) -> None:
        """The per-packet ClusterIP path: the name patterns followed, the interfaces it is
        attached to now, and the last attempts that failed ("name: error")."""
        with self._lock:
            self._pod_interfaces = {
                "patterns": list(patterns),
                "attached": list(attached),
                "failed": list(failed),
            }

    def waiting_for_lock(self, pin_dir: str, holder_pid: int | None) -> None:
        """Another agent holds the pin directory; this one waits for it to exit."""
        with self._lock:
            self._lock_wait = {
                "pin_dir": pin_dir,
                "holder_pid": holder_pid,  # None: not visible in this PID namespace
                "since": self._clock.wall(),
            }

    def lock_taken(self) -> None:
        with self._lock:
            self._lock_wait = None
        self.phase_done(Phase.PIN_DIR_LOCKED)

    def pin_layout(
        self,
        layout: int,
        found: int | None,
        written_by: str | None,
        verdict: str,
        refused: str | None = None,
    ) -> None:
        """The pin directory's layout (ebpflb.datapath.maps.pinlayout): this agent's, the one
        found (None: no maps pinned), its writer, what this agent did, and why it refused."""
        with self._lock:
            self._pin_layout = {
                "layout": layout,
                "found": found,
                "written_by": written_by,
                "verdict": verdict,
                "refused": refused,
            }

    def kernel_features(self, features: Mapping[str, Mapping[str, Any]]) -> None:
        """The kernel feature probe's findings (ebpflb.datapath.probes), shown as is."""
        with self._lock:
            self._features = {key: dict(value) for key, value in features.items()}

    def read_source(self, progress: Callable[[], SourceProgress]) -> None:
        self._progress = progress

    # ---- SyncObserver (the agent) --------------------------------------------------------

    def list_done(self, kind: Kind) -> None:
        self.phase_done(LIST_PHASES[kind])

    def change_queued(self) -> None:
        self.health.queued_update()

    def sync_started(self) -> None:
        self.health.sync_started()

    def sync_finished(self, record: SyncRecord) -> None:
        with self._lock:
            self._syncs += 1
            self._last = record
            if self._first is None:
                self._first = record
            self._changes["added"] += record.added
            self._changes["updated"] += record.updated
            self._changes["removed"] += record.removed
        if record.kind is SyncRecordKind.FIRST:
            self.phase_done(Phase.FIRST_SYNC)
        self.health.sync_finished(ok=record.ok)

    def object_rejected(self, kind: str, ref: str, message: str) -> None:
        with self._lock:
            self._invalid[kind, ref] = message

    def object_accepted(self, kind: str, ref: str) -> None:
        """Valid now, or deleted: no longer a problem."""
        if self._invalid:  # a dict read: no lock needed to skip the common case
            with self._lock:
                self._invalid.pop((kind, ref), None)

    def orphan_slices(self, orphans: Mapping[NamespacedName, tuple[NamespacedName, ...]]) -> None:
        """Slices naming a service that does not exist: {service: slices}."""
        with self._lock:
            self._orphans = dict(orphans)

    # ---- reading -------------------------------------------------------------------------

    def phases(self) -> dict[str, float]:
        with self._lock:
            return {phase.value: self._phases[phase] for phase in Phase if phase in self._phases}

    def frontend_changes(self) -> dict[str, int]:
        with self._lock:
            return dict(self._changes)

    def to_json(self) -> dict[str, Any]:
        """The /status document (see PLAN.md: these keys stay, more may be added)."""
        health = self.health.snapshot()
        progress = self._progress()
        with self._lock:
            last, first = self._last, self._first
            invalid = sorted(self._invalid.items())
            lock_wait = dict(self._lock_wait) if self._lock_wait else None
            orphans = sorted(self._orphans.items())
            document: dict[str, Any] = {
                "ready": health.ready,
                "healthy": health.healthy,
                "process_start": self.process_start,
                "phases": {p.value: self._phases[p] for p in Phase if p in self._phases},
                "compile_seconds": dict(self._compile),
                "lists": {
                    kind.value: {"objects": figures.objects, "seconds": figures.seconds}
                    for kind, figures in progress.lists.items()
                },
                "sync": {
                    "count": self._syncs,
                    "last": last.to_json() if last else None,
                    "first": first.to_json() if first else None,
                    "oldest_pending_s": health.oldest_pending_age,
                    "health_timeout_s": self.health.timeout,
                },
                "frontends": last.frontends if last else 0,
                "frontend_changes": dict(self._changes),
                "programs": {
                    "replaced_previous": self._replaced,
                    "origin": dict(self._origin),
                    "headers": dict(self._headers),
                    "ids": dict(sorted(self._program_ids.items())),
                },
                "interfaces": {name: {"xdp": mode} for name, mode in self._interfaces.items()},
                "pod_interfaces": dict(self._pod_interfaces) or None,
                "socket_lb": dict(self._socket_lb) or None,
                "features": {key: dict(value) for key, value in self._features.items()},
                "pin_layout": dict(self._pin_layout) or None,
            }
        document["problems"] = {
            "invalid_objects": [
                {"kind": kind, "name": ref, "error": message}
                for (kind, ref), message in invalid[:MAX_LISTED]
            ],
            "invalid_object_count": len(invalid),
            "source_errors": list(progress.errors[:MAX_LISTED]),
            "source_error_count": len(progress.errors),
            "orphan_slices": [
                {"slice": str(slice_), "service": str(service)}
                for service, slices in orphans[:MAX_LISTED]
                for slice_ in slices
            ],
            # Not None while another agent holds the pin directory and this one waits.
            "waiting_for_pin_dir": lock_wait,
        }
        return document
