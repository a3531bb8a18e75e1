"""`ebpflb bench sync`'s targets (issue 15's control-plane ones), judged on one run.

Every target is listed in every run: met, MISSED (with the figure) or "not measured" (the
run lacks the figure: another N, another source, a step that did not run), so a reader
sees what a run did not show. A target is an entry in TARGETS: a name and a function of the
run giving (met or not, or None for not measured; the text shown).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lab.bench.records.compare import Verdict
from lab.bench.records.sync import SyncRun
from lab.bench.settings import SyncSource

Outcome = tuple[bool | None, str]

RESTART_MAX_S = {1_000: 0.5, 10_000: 1.0}  # services -> restart -> ready limit
# services -> the agent's memory cgroup at its peak (issue 28: what a pod's limit counts)
CGROUP_PEAK_MAX_MIB = {10_000: 150.0, 100_000: 600.0}
MANIFEST_SERVICES = 10_000  # 10,000 Services + 10,000 EndpointSlices in one file
MANIFEST_START_MAX_S = 3.0
MANIFEST_EDIT_MAX_S = 1.0
MILLION = 1_000_000
CHURN_P99_MAX_S = 0.1


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _n(run: SyncRun) -> str:
    return f"{run.settings.services:,} services"


def restart_at(services: int) -> Callable[[SyncRun], Outcome]:
    def outcome(run: SyncRun) -> Outcome:
        if run.settings.services != services:
            return None, f"(run at {_n(run)})"
        if run.restart is None:
            return None, "(no restart step in this run)"
        seconds = run.restart.start_to_synced_s
        return seconds < RESTART_MAX_S[services], f"{_ms(seconds)} ({run.settings.source.value})"

    return outcome


def cgroup_peak_at(services: int) -> Callable[[SyncRun], Outcome]:
    def outcome(run: SyncRun) -> Outcome:
        if run.settings.services != services:
            return None, f"(run at {_n(run)})"
        cgroup = run.cgroup_memory
        if cgroup is None:
            return None, "(no memory cgroup figures in this run)"
        rss = run.memory_after_sync
        detail = (
            f"peak {cgroup.peak_mib:.0f} MiB; at the end anon {cgroup.anon_mib:.0f}, file"
            f" {cgroup.file_mib:.0f}, kernel {cgroup.kernel_mib:.0f}; agent RSS"
            f" {rss.rss_mib:.0f} (own {rss.anon_mib:.0f}), {run.settings.endpoints} endpoints"
            " each"
        )
        return cgroup.peak_mib <= CGROUP_PEAK_MAX_MIB[services], detail

    return outcome


def _manifest_run(run: SyncRun) -> str | None:
    """Why this run cannot judge a manifest target (None: it can)."""
    if run.settings.source is not SyncSource.MANIFESTS:
        return f"(source {run.settings.source.value})"
    if run.settings.services != MANIFEST_SERVICES:
        return f"(run at {_n(run)})"
    return None


def manifest_start(run: SyncRun) -> Outcome:
    why = _manifest_run(run)
    if why is not None:
        return None, why
    seconds = run.startup.start_to_synced_s
    return seconds <= MANIFEST_START_MAX_S, _ms(seconds)


def manifest_edit(run: SyncRun) -> Outcome:
    """A manifests run's lone changes are each one document edited in the file."""
    why = _manifest_run(run)
    if why is not None or not run.change_to_map_s:
        return None, why or "(no changes in this run)"
    worst = max(run.change_to_map_s)
    return worst < MANIFEST_EDIT_MAX_S, f"worst {_ms(worst)} of {len(run.change_to_map_s)}"


def million(run: SyncRun) -> Outcome:
    n, k = run.settings.services, run.settings.endpoints
    if n * k < MILLION:
        return None, f"(run with {n * k:,} endpoints)"
    s = run.startup
    kernel = run.kernel_memory
    kernel_mib = (
        f", kernel {kernel.cgroup_bytes / 2**20:.0f} MiB"
        if kernel is not None and kernel.cgroup_bytes is not None
        else ""
    )
    memory = run.memory_after_sync
    detail = (
        f"{n * k:,} in {_ms(s.start_to_synced_s)}, RSS {memory.rss_mib:.0f} MiB"
        f" (own {memory.anon_mib:.0f}){kernel_mib}"
    )
    if s.sync_errors:
        detail += f", {s.sync_errors} failed"
    return s.frontends >= n and not s.sync_errors, detail


def churn_p99(run: SyncRun) -> Outcome:
    c = run.churn
    if c is None or c.p99_s is None:
        return None, "(no churn in this run)"
    detail = (
        f"p99 {_ms(c.p99_s)} (p50 {_ms(c.p50_s or 0)}, max {_ms(c.max_s or 0)}) of"
        f" {c.sampled:,} sampled at {c.achieved_rate:,.0f}/s"
    )
    if c.timed_out:
        detail += f", {c.timed_out} never seen"
    if c.resync_in_window:
        detail += ", a full resync in the window"
    return c.p99_s < CHURN_P99_MAX_S and not c.timed_out, detail


@dataclass(frozen=True)
class SyncTarget:
    name: str
    outcome: Callable[[SyncRun], Outcome]


TARGETS: tuple[SyncTarget, ...] = (
    *(
        SyncTarget(f"restart -> ready < {limit:g} s at {n:,} services", restart_at(n))
        for n, limit in RESTART_MAX_S.items()
    ),
    *(
        SyncTarget(
            f"agent's memory cgroup (a pod's limit) peak <= {limit:g} MiB at {n:,} services",
            cgroup_peak_at(n),
        )
        for n, limit in CGROUP_PEAK_MAX_MIB.items()
    ),
    SyncTarget(
        f"manifests {MANIFEST_SERVICES:,}+{MANIFEST_SERVICES:,} from start <="
        f" {MANIFEST_START_MAX_S:g} s",
        manifest_start,
    ),
    SyncTarget(
        f"one edit in {2 * MANIFEST_SERVICES:,} documents < {MANIFEST_EDIT_MAX_S:g} s",
        manifest_edit,
    ),
    SyncTarget("a million endpoints programmed (report)", million),
    SyncTarget(f"churn: API write -> map p99 < {CHURN_P99_MAX_S * 1000:g} ms", churn_p99),
)


def judge(run: SyncRun, targets: Sequence[SyncTarget] = TARGETS) -> tuple[Verdict, ...]:
    """One verdict per target, in TARGETS' order."""
    verdicts = []
    for target in targets:
        ok, detail = target.outcome(run)
        verdicts.append(Verdict(target.name, run.settings.services, ok, detail))
    return tuple(verdicts)
