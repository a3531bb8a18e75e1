"""Every `ebpflb bench` report as text: compare's tables (rich), maglev's and sync's aligned
lines. Pure functions of the typed records (plot.py draws compare's figures). Over 400
lines because the three reports share their column and number formats here; sync's part
(startup, churn, targets) is the next to move out if it grows."""

from __future__ import annotations

import io
import statistics
from collections.abc import Iterator, Sequence

from lab.bench import extras
from lab.bench.records.agent import AgentStartup
from lab.bench.records.bulk import BulkRun
from lab.bench.records.codec import Report
from lab.bench.records.compare import CompareRun, Exchange, ModeResult, Target
from lab.bench.records.maglev import MaglevRun
from lab.bench.records.pps import PpsRun
from lab.bench.records.sync import SyncRun
from lab.bench.settings import Mode, SyncSource
from lab.bench.stats import spread
from lab.bench.texttable import text_table


def render(report: Report) -> str:
    if isinstance(report, CompareRun):
        return render_compare(report)
    if isinstance(report, MaglevRun):
        return render_maglev(report)
    if isinstance(report, BulkRun):
        from lab.bench.render_bulk import render_bulk

        return render_bulk(report)
    if isinstance(report, PpsRun):
        from lab.bench.render_pps import render_pps

        return render_pps(report)
    return render_sync(report)


# ---- compare ------------------------------------------------------------------------------


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "MiB":
        return f"{value / 2**20:.1f}"
    if unit == "/s":
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def listed(run: CompareRun) -> Iterator[tuple[int, ModeResult]]:
    """(N, result) of every listed mode, by N, modes in Mode's order."""
    for size in sorted(run.sizes, key=lambda s: s.services):
        for mode in Mode:
            result = size.get(mode)
            if result is not None and result.listed:
                yield size.services, result


def data_plane_rows(run: CompareRun) -> list[list[str]]:
    rows = []
    for n, result in listed(run):
        latency, data = result.data.latency, result.data
        p50 = [latency.of(t).p50_us if latency else None for t in Target]
        rows.append(
            [
                f"{n:,}",
                result.mode.value,
                *(_fmt(value) for value in p50),
                _fmt(latency.last.p99_us if latency else None),
                _fmt(data.connections.per_s if data.connections else None, "/s"),
                _fmt(data.nodeport.per_s if data.nodeport else None, "/s"),
            ]
        )
    return rows


def pod_rows(run: CompareRun) -> list[list[str]]:
    """ClusterIP from the pod: ebpflb's per-packet path beside kube-proxy's PREROUTING."""
    rows = []
    for n, result in listed(run):
        latency, data = result.data.pod_latency, result.data
        if latency is None:
            continue
        per_packet = result.mode is Mode.EBPFLB  # the pod is in no socket-LB cgroup
        rows.append(
            [
                f"{n:,}",
                f"{result.mode.value} (per packet)" if per_packet else result.mode.value,
                *(_fmt(latency.of(t).p50_us) for t in Target),
                _fmt(latency.last.p99_us),
                _fmt(data.pod_connections.per_s if data.pod_connections else None, "/s"),
            ]
        )
    return rows


def request_response_rows(run: CompareRun) -> list[list[str]]:
    """Transactions/s through the ClusterIP: a column per (exchange, flows)."""
    rows = []
    for n, result in listed(run):
        found = {(r.exchange, r.flows): r.rate for r in result.data.request_response}
        if found:
            rows.append(
                [f"{n:,}", result.mode.value]
                + [_fmt(found[key].per_s, "/s") if key in found else "-" for key in RR_COLUMNS]
            )
    return rows


def program_time_rows(run: CompareRun) -> list[list[str]]:
    """ebpflb's NodePort programs per exchange (bpf_stats), their total beside the gap to
    plain forwarding per exchange in the same size's rates (1/rate - 1/rate of none)."""
    rows = []
    for size in sorted(run.sizes, key=lambda s: s.services):
        none = size.get(Mode.NONE)
        floor = none.data.nodeport if none else None
        for result in size.modes:
            times, rate = result.data.nodeport_program_time, result.data.nodeport
            if not times or not result.listed:
                continue
            n = f"{size.services:,}"
            for t in times:
                rows.append(
                    [n, result.mode.value, t.program, f"{t.ns_per_exchange:,.0f}",
                     f"{t.runs_per_exchange:.1f}", ""]
                )  # fmt: skip
            gap = (
                f"{(1e9 / rate.per_s - 1e9 / floor.per_s):,.0f}"
                if rate and floor and rate.per_s and floor.per_s
                else "-"
            )
            total = sum(t.ns_per_exchange for t in times)
            rows.append([n, result.mode.value, "all", f"{total:,.0f}", "", gap])
    return rows


def program_cost_rows(run: CompareRun) -> list[list[str]]:
    """ebpflb's NodePort programs per packet, timed by the kernel (lab.bench.progcost)."""
    return [
        [
            f"{n:,}",
            result.mode.value,
            cost.program,
            cost.path,
            cost.verdict,
            f"{cost.median_ns:,}",
            f"{cost.p10_ns:,}",
            f"{cost.repeat_mean_ns:,}" if cost.repeat_mean_ns is not None else "-",
            f"{cost.instructions:,}",
        ]
        for n, result in listed(run)
        for cost in result.data.program_costs
    ]


def control_plane_rows(run: CompareRun) -> list[list[str]]:
    rows = []
    for n, result in listed(run):
        control = result.control
        if control is None:
            continue
        rows.append(
            [
                f"{n:,}",
                result.mode.value,
                _fmt(control.program_s, "s"),
                _fmt(control.program_cpu_s, "s"),
                _fmt(statistics.median(control.change_s), "s") if control.change_s else "-",
                _fmt(statistics.median(control.change_cpu_s), "s") if control.change_cpu_s else "-",
                _fmt(control.memory.cgroup_bytes, "MiB"),
                _fmt(control.memory.bpf_map_bytes, "MiB"),
            ]
        )
    return rows


def not_measured(run: CompareRun) -> dict[str, list[str]]:
    """Each reason a NodePort figure is missing -> where ("ebpflb at 1,000"), in order."""
    found: dict[str, list[str]] = {}
    for n, result in listed(run):
        if result.data.nodeport_not_measured:
            found.setdefault(result.data.nodeport_not_measured, []).append(
                f"{result.mode} at {n:,}"
            )
    return found


DATA_HEADERS = [
    "N",
    "mode",
    "connect p50 first µs",
    "p50 last µs",
    "p50 random µs",
    "p99 last µs",
    "new conn/s (1 core)",
    "NodePort req/s",
]
POD_HEADERS = DATA_HEADERS[:-1]  # no NodePort column: the pod's client is ClusterIP only
RR_COLUMNS = tuple((e, flows) for e in Exchange for flows in (1, 32))
RR_HEADERS = ["N", "mode", *(f"{e.value} x{flows} /s" for e, flows in RR_COLUMNS)]
TIME_HEADERS = [
    "N",
    "mode",
    "program",
    "ns per exchange",
    "runs per exchange",
    "gap to plain forwarding, ns per exchange",
]
COST_HEADERS = [
    "N",
    "mode",
    "program",
    "path",
    "verdict",
    "ns p50",
    "ns p10",
    "ns repeated",
    "instructions",
]
CONTROL_HEADERS = [
    "N",
    "mode",
    "program all",
    "CPU",
    "one change",
    "CPU",
    "kernel MiB",
    "BPF maps MiB",
]


def render_compare(run: CompareRun, *, width: int = 140) -> str:
    """The tables as text (rich), for a terminal or a README."""
    extras.require("rich", "ebpflb bench's tables")
    from rich.console import Console
    from rich.markup import escape  # details may hold [IPv6]:port, which is markup to rich
    from rich.table import Table

    console = Console(width=width, record=True, file=io.StringIO())
    m = run.machine
    console.print(
        f"ebpflb bench: Linux {m.kernel}, {m.cpus} x {m.cpu}, {m.memory_gib} GiB; {m.iptables};"
        f" {m.nft}; {run.settings.family}; {run.settings.endpoints} endpoints per service;"
        f" {run.total_s:.0f} s"
    )
    for title, headers, rows in (
        ("Data plane", DATA_HEADERS, data_plane_rows(run)),
        ("ClusterIP from a pod behind the node", POD_HEADERS, pod_rows(run)),
        (
            "Request/response through a ClusterIP (transactions/s, one core)",
            RR_HEADERS,
            request_response_rows(run),
        ),
        ("NodePort per packet (BPF_PROG_TEST_RUN)", COST_HEADERS, program_cost_rows(run)),
        ("NodePort programs per exchange (bpf_stats)", TIME_HEADERS, program_time_rows(run)),
        ("Control plane", CONTROL_HEADERS, control_plane_rows(run)),
    ):
        if not rows:  # a figure the run (or an older report) does not have
            continue
        table = Table(title=title, title_justify="left")
        for i, header in enumerate(headers):
            table.add_column(header, justify="left" if i == 1 else "right")
        for i, row in enumerate(rows):
            last_of_n = i + 1 == len(rows) or rows[i + 1][0] != row[0]
            table.add_row(*row, end_section=last_of_n)
        console.print(table)
    verdicts = Table(title="Targets", title_justify="left")
    for header in ("N", "target", "", "measured"):
        verdicts.add_column(header)
    for v in run.targets:
        verdicts.add_row(f"{v.services:,}", v.target, v.outcome, escape(v.detail))
    console.print(verdicts)
    for reason, where in not_measured(run).items():
        console.print(f"NodePort not measured ({', '.join(where)}): {escape(reason)}")
    for problem in run.problems:
        console.print(f"[bold red]problem:[/] {escape(problem)}")
    return console.export_text()


# ---- maglev -------------------------------------------------------------------------------


def _ok(passed: bool) -> str:
    return "ok" if passed else "MISSED"


MAGLEV_HEADERS = [
    "N",
    "M",
    "size",
    "M/N",
    "slots/backend",
    "max dev %",
    "changed %",
    "min 1/N %",
    "survivors %",
    "survivors max %",
    "KiB/table",
    "build ms",
]


def render_maglev(run: MaglevRun) -> str:
    """The report as aligned text tables."""
    lines = [
        f"Maglev benchmark: seed {run.seed!r}, {'quick' if run.quick else 'full'} "
        f"run: {run.timing_repeats} timing repeats, {run.removals_per_config} "
        f"random backend sets per disruption figure"
        + (f"; numba warm-up {run.warmup_s:.2f} s" if run.warmup_s is not None else ""),
        "",
        "Balance, disruption of removing 1 backend, memory and build time per service table",
    ]
    rows = [
        [
            c.n,
            c.m,
            c.kind,
            f"{c.m / c.n:.0f}",
            f"{c.min_slots}-{c.max_slots}",
            f"{c.max_deviation_pct:.2f}",
            f"{100 * c.changed_fraction:.3f}",
            f"{100 * c.minimum_fraction:.3f}",
            f"{100 * c.survivors_moved_fraction:.3f}",
            f"{100 * c.survivors_moved_max_fraction:.3f}",
            f"{c.bytes_per_table / 1024:.1f}",
            f"{c.build_ms:.3f}",
        ]
        for c in run.configs
    ]
    lines += text_table(MAGLEV_HEADERS, rows)
    lines += ["", "Entries changed when backends are removed, next to references (% of table)"]
    rows = [
        [
            r.n,
            r.m,
            r.removed,
            f"{100 * r.changed_fraction:.3f}",
            f"{100 * r.minimum_fraction:.3f}",
            f"{100 * r.anchors_simulation_fraction:.3f}",
            r.paper,
        ]
        for r in run.references
    ]
    lines += text_table(
        ["N", "M", "removed", "ebpflb %", "minimum %", "anchors sim. %", "paper (NSDI'16)"], rows
    )
    lines += [
        "  The paper reports disruption only as a graph (Fig. 12: 1000 backends, M = 65537",
        "  and 655373); 'anchors sim.' is a separate blake2b simulation (anchors.md section 3).",
        "",
    ]
    s, r = run.scale, run.recompute
    lines += [
        f"Scale: {s.services:,} services x {s.backends} backends, M = {s.m}: "
        f"{s.batched_s:.3f} s batched, {s.one_by_one_s:.3f} s one by one "
        f"(target < {s.target_s:g} s: {_ok(s.batched_s < s.target_s)})",
        f"  tables {s.total_bytes / 2**20:.1f} MiB ({s.bytes_per_table} B each; "
        f"limit {s.limit_bytes / 2**20:.0f} MiB: {_ok(s.total_bytes <= s.limit_bytes)})",
        f"Recompute: replace 1 of {r.backends} backends, M = {r.m}: {r.ms:.2f} ms "
        f"build + diff (target < {r.target_ms:g} ms: {_ok(r.ms < r.target_ms)})",
        f"  {r.changed_slots} slots changed ({100 * r.changed_slots / r.m:.3f}%); "
        f"the replaced backend held {r.replaced_backend_slots}",
        "",
        f"Wall time: {run.wall_s:.1f} s",
    ]
    return "\n".join(lines)


# ---- sync ---------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _spread(values: Sequence[float]) -> str:
    if len(values) == 1:
        return _ms(values[0])
    s = spread(values)
    return f"median {_ms(s.median)} (p99 {_ms(s.p99)}, min {_ms(s.minimum)}, max {_ms(s.maximum)})"


def _row(label: str, value: str) -> str:
    return f"  {label:<46}{value}"


def startup_lines(e: AgentStartup) -> list[str]:
    lines = []
    for name, label in (("socket_lb", "socket-LB"), ("nodeport", "NodePort")):
        if name in e.compile_s:
            how = e.program_origin.get(name)
            lines.append(
                _row(
                    f"{label} programs {how}" if how else f"compile + load {label} programs",
                    _ms(e.compile_s[name]),
                )
            )
    if "attached" in e.phases:
        lines.append(_row("start -> programs attached", _ms(e.phases["attached"])))
    for kind, phase, label in (
        ("Service", "services_listed", "Services"),
        ("EndpointSlice", "slices_listed", "EndpointSlices"),
    ):
        listing = e.lists.get(kind)
        if listing is not None:
            done = f", done at {_ms(e.phases[phase])}" if phase in e.phases else ""
            lines.append(
                _row(f"list {listing.objects:,} {label} (in parallel)", _ms(listing.seconds) + done)
            )
    if e.first_sync_s is not None:
        size = f", M={e.table_size} each" if e.table_size is not None else ""
        lines.append(_row(f"first sync: {e.frontends:,} frontends{size}", _ms(e.first_sync_s)))
    lines += [
        _row("start -> synced", _ms(e.start_to_synced_s)),
        _row("agent CPU, start -> synced", f"{e.cpu_s_at_synced:.2f} s"),
    ]
    return lines


def churn_lines(run: SyncRun) -> list[str]:
    c = run.churn
    if c is None:
        return []
    lines = [
        _row(
            f"churn: {c.rate:,.0f} changes/s for {c.seconds:g} s",
            f"{c.written:,} written at {c.achieved_rate:,.0f}/s (writer at most"
            f" {_ms(c.writer_lag_max_s)} behind)",
        ),
    ]
    if c.p50_s is not None and c.p99_s is not None and c.max_s is not None:
        lines.append(
            _row(
                "  API write -> map entry, sampled",
                f"p50 {_ms(c.p50_s)}, p99 {_ms(c.p99_s)}, max {_ms(c.max_s)}"
                f" ({c.sampled:,} sampled, {c.timed_out} never seen)",
            )
        )
    lines += [
        _row(
            "  agent: syncs, CPU",
            f"{c.syncs} syncs (--min-sync-period {c.min_sync_period:g} s),"
            f" {c.agent_cpu_s:.2f} CPU s ({c.agent_cpu_s / c.seconds:.0%} of a core)",
        ),
        _row(
            "  poller: between passes, own CPU",
            f"p99 {_ms(c.poller_gap_p99_s)}, max {_ms(c.poller_gap_max_s)} (sleeps"
            f" {_ms(c.poll_interval_s)}); {c.poller_cpu_share:.1%} of a core",
        ),
    ]
    if c.resync_in_window:
        lines.append(_row("  a periodic full resync fell in the window", "changes waited"))
    return lines


def sync_target_lines(run: SyncRun) -> list[str]:
    from lab.bench.synctargets import judge

    # Reports saved before the targets existed are judged now, from their figures.
    verdicts = run.targets or judge(run)
    return [
        "",
        "Targets",
        *text_table(
            ["target", "", "measured"],
            [[v.target, v.outcome, v.detail] for v in verdicts],
            left=True,
        ),
    ]


def render_sync(run: SyncRun) -> str:
    n, k = run.settings.services, run.settings.endpoints
    manifests = run.settings.source is SyncSource.MANIFESTS
    lines = [
        f"ebpflb bench sync: {n:,} Services x {k} endpoints ({n * k:,} endpoints, {n:,}"
        f" EndpointSlices), {run.cpus} CPUs, Linux {run.kernel}",
        "",
        f"ebpflb: `ebpflb run --manifests FILE`, one file of {2 * n:,} documents, real BPF maps"
        if manifests
        else "ebpflb: `ebpflb run --kubeconfig` on the fake API server (127.0.0.1), real BPF maps",
    ]
    if run.agent_args:
        lines.append(_row("agent flags", " ".join(run.agent_args)))
    lines += [
        *startup_lines(run.startup),
        _row(
            "one document edited: file write -> map entry"
            if manifests
            else "one slice change -> map entry written",
            f"{_spread(run.change_to_map_s)}, {len(run.change_to_map_s)} changes",
        ),
    ]
    if run.periodic_full_resync_s is not None:
        lines.append(
            _row(
                f"periodic full resync (every {run.settings.sync_period:g} s here)",
                f"{_ms(run.periodic_full_resync_s)} (re-read, compare, repair)",
            )
        )
    lines += churn_lines(run)
    memory = run.memory_after_sync
    lines += [
        _row(
            "agent memory after sync",
            f"RSS {memory.rss_mib:.0f} MiB, peak {memory.peak_rss_mib:.0f} MiB",
        ),
        _row("  its own (anonymous)", f"{memory.anon_mib:.0f} MiB"),
        _row(
            "  file-backed (libraries)",
            f"{memory.file_mib:.0f} MiB; slot tables ~{run.slot_tables_mib:.0f} MiB of kernel"
            " memory, the pool mapped during syncs only",
        ),
        _row("  compiler libraries mapped", ", ".join(run.compiler_libraries) or "none"),
    ]
    if run.restart is not None:
        lines += ["", "restart: SIGTERM, then `ebpflb run` again on the same pins"]
        lines += startup_lines(run.restart)
        if run.restart_memory is not None:
            m = run.restart_memory
            lines.append(
                _row(
                    "agent memory after the restart",
                    f"RSS {m.rss_mib:.0f} MiB (anonymous {m.anon_mib:.0f}, file-backed"
                    f" {m.file_mib:.0f}), peak {m.peak_rss_mib:.0f} MiB",
                )
            )
        lines.append(
            _row(
                "  compiler libraries mapped",
                ", ".join(run.restart_compiler_libraries) or "none",
            )
        )
    kernel = run.kernel_memory
    if kernel is not None:
        lines.append(
            _row(
                "kernel memory: agent's cgroup, BPF maps",
                f"{_fmt(kernel.cgroup_bytes, 'MiB')} MiB, {_fmt(kernel.bpf_map_bytes, 'MiB')}"
                " MiB (bpftool)",
            )
        )
    cgroup = run.cgroup_memory
    if cgroup is not None:
        lines.append(
            _row(
                "agent's memory cgroup (a pod's limit)",
                f"peak {cgroup.peak_mib:.0f} MiB; at the end {cgroup.current_mib:.0f} MiB:"
                f" anon {cgroup.anon_mib:.0f}, file {cgroup.file_mib:.0f}, kernel"
                f" {cgroup.kernel_mib:.0f}",
            )
        )
    if run.metrics_scrape_s is not None:
        lines.append(_row("one GET /metrics after sync", _ms(run.metrics_scrape_s)))
    lines += [*sync_target_lines(run), "", f"total bench time {run.total_s:.0f} s"]
    return "\n".join(lines)
