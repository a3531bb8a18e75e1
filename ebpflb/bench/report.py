"""`ebpflb bench`'s verdicts, table and plot, from the report dict compare.run_compare makes.

Pure functions of the report (no kernel), so they are unit-tested on synthetic reports.
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MODE_ORDER = ("none", "iptables-legacy", "iptables-nft", "nftables", "ebpflb", "ebpflb-xdp")
KUBE_PROXY_MODES = ("iptables-legacy", "iptables-nft", "nftables")
# One colour and style per mode in every panel (matplotlib's cycle would shift them).
MODE_STYLE = {
    "none": {"color": "black", "linestyle": "--"},
    "iptables-legacy": {"color": "tab:orange"},
    "iptables-nft": {"color": "tab:red"},
    "nftables": {"color": "tab:blue"},
    "ebpflb": {"color": "tab:green"},
    "ebpflb-xdp": {"color": "tab:olive", "linestyle": ":"},
}

# The targets, as ratios or limits within one run.
CONNECT_P50_MAX_RATIO = 1.05  # ebpflb / none
CONNECT_RATE_MIN_RATIO = 0.95  # ebpflb / none
CHANGE_MAX_S = {20_000: 0.005}
PROGRAM_MAX_S = {20_000: 5.0, 100_000: 30.0}


def _results(report: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    for n, per_mode in sorted(report["results"].items(), key=lambda item: int(item[0])):
        yield int(n), per_mode


def _get(data: dict[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _verdict(name: str, n: int, ok: bool, detail: str) -> dict[str, Any]:
    return {"target": name, "services": n, "ok": ok, "detail": detail}


def check_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target the run has the figures for; one verdict per (target, N)."""
    verdicts = []
    for n, per_mode in _results(report):
        ebpflb, none = per_mode.get("ebpflb"), per_mode.get("none")
        if ebpflb and none:
            for target in ("first", "last", "random"):
                mine = _get(ebpflb, "latency", target, "p50_us")
                floor = _get(none, "latency", target, "p50_us")
                if mine and floor:
                    ratio = mine / floor
                    verdicts.append(
                        _verdict(
                            f"connect p50 ({target}) within 5% of no proxy",
                            n,
                            ratio <= CONNECT_P50_MAX_RATIO,
                            f"{mine:.1f} vs {floor:.1f} µs (x{ratio:.3f})",
                        )
                    )
            mine = _get(ebpflb, "connections", "per_s")
            floor = _get(none, "connections", "per_s")
            if mine and floor:
                ratio = mine / floor
                verdicts.append(
                    _verdict(
                        "new connections/s within 5% of no proxy",
                        n,
                        ratio >= CONNECT_RATE_MIN_RATIO,
                        f"{mine:,.0f} vs {floor:,.0f}/s (x{ratio:.3f})",
                    )
                )
        if ebpflb:
            changes = _get(ebpflb, "control", "change_s")
            if changes and n in CHANGE_MAX_S:
                worst = max(changes)
                verdicts.append(
                    _verdict(
                        f"one endpoint change < {CHANGE_MAX_S[n] * 1000:g} ms",
                        n,
                        worst < CHANGE_MAX_S[n],
                        f"worst {worst * 1000:.2f} ms of {len(changes)}",
                    )
                )
            program = _get(ebpflb, "control", "program_s")
            if program is not None and n in PROGRAM_MAX_S:
                verdicts.append(
                    _verdict(
                        f"all services programmed from nothing < {PROGRAM_MAX_S[n]:g} s",
                        n,
                        program < PROGRAM_MAX_S[n],
                        f"{program:.2f} s",
                    )
                )
            tc = _get(ebpflb, "nodeport", "per_s")
            for mode in KUBE_PROXY_MODES:
                theirs = _get(per_mode, mode, "nodeport", "per_s")
                if tc and theirs:
                    verdicts.append(
                        _verdict(
                            f"NodePort via tc at least as fast as {mode}",
                            n,
                            tc >= theirs,
                            f"{tc:,.0f} vs {theirs:,.0f} req/s",
                        )
                    )
            xdp_runs = _get(per_mode, "ebpflb-xdp", "nodeport", "runs")
            tc_runs = _get(ebpflb, "nodeport", "runs")
            if xdp_runs and tc_runs:
                # "Measurably": every XDP run beats every tc run.
                verdicts.append(
                    _verdict(
                        "NodePort via XDP measurably faster than tc",
                        n,
                        min(xdp_runs) > max(tc_runs),
                        f"{statistics.median(xdp_runs):,.0f} vs"
                        f" {statistics.median(tc_runs):,.0f} req/s",
                    )
                )
    return verdicts


# ---- the table --------------------------------------------------------------------------


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


def _modes(per_mode: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for mode in MODE_ORDER:
        if mode in per_mode and per_mode[mode].get("listed", True):
            yield mode, per_mode[mode]


def data_plane_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for n, per_mode in _results(report):
        for mode, data in _modes(per_mode):
            rows.append(
                [
                    f"{n:,}",
                    mode,
                    *(
                        _fmt(_get(data, "latency", t, "p50_us"))
                        for t in ("first", "last", "random")
                    ),
                    _fmt(_get(data, "latency", "last", "p99_us")),
                    _fmt(_get(data, "connections", "per_s"), "/s"),
                    _fmt(_get(data, "nodeport", "per_s"), "/s"),
                ]
            )
    return rows


def control_plane_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for n, per_mode in _results(report):
        for mode, data in _modes(per_mode):
            control = data.get("control")
            if not control:
                continue
            changes = control.get("change_s") or []
            change_cpu = control.get("change_cpu_s") or []
            rows.append(
                [
                    f"{n:,}",
                    mode,
                    _fmt(control.get("program_s"), "s"),
                    _fmt(control.get("program_cpu_s"), "s"),
                    _fmt(statistics.median(changes), "s") if changes else "-",
                    _fmt(statistics.median(change_cpu), "s") if change_cpu else "-",
                    _fmt(control.get("kernel_memory_bytes"), "MiB"),
                    _fmt(_get(control, "details", "bpf_map_bytes"), "MiB"),
                ]
            )
    return rows


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


def render(report: dict[str, Any], *, width: int = 140) -> str:
    """The tables as text (rich), for a terminal or a README."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width, record=True, file=io.StringIO())
    machine = report["machine"]
    console.print(
        f"ebpflb bench: Linux {machine['kernel']}, {machine['cpus']} x {machine['cpu']},"
        f" {machine['memory_gib']} GiB; {machine['iptables']}; {machine['nft']};"
        f" {report['settings']['endpoints']} endpoints per service; {report['total_s']:.0f} s"
    )
    for title, headers, rows in (
        ("Data plane", DATA_HEADERS, data_plane_rows(report)),
        ("Control plane", CONTROL_HEADERS, control_plane_rows(report)),
    ):
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
    for v in check_targets(report):
        verdicts.add_row(
            f"{v['services']:,}", v["target"], "met" if v["ok"] else "MISSED", v["detail"]
        )
    console.print(verdicts)
    for problem in report.get("problems", []):
        console.print(f"[bold red]problem:[/] {problem}")
    return console.export_text()


# ---- the plot ---------------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    """Six panels against N (log scale), one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("connect() p50 to the last service (µs)", ("latency", "last", "p50_us"), False),
        ("connect() p50 to a random service (µs)", ("latency", "random", "p50_us"), False),
        ("new connections/s, one core", ("connections", "per_s"), False),
        ("NodePort requests/s from outside", ("nodeport", "per_s"), False),
        ("program all N services from nothing (s)", ("control", "program_s"), True),
        ("one endpoint change (s, median)", ("control", "change_s"), True),
    ]
    figure, axes = plt.subplots(2, 3, figsize=(16, 9))
    machine = report["machine"]
    figure.suptitle(
        f"ebpflb bench: Linux {machine['kernel']}, {machine['cpus']} CPUs"
        f" ({machine['cpu']}), {report['settings']['endpoints']} endpoints per service"
    )
    for axis, (title, path_keys, log_y) in zip(axes.flat, panels, strict=True):
        for mode in MODE_ORDER:
            xs, ys = [], []
            for n, per_mode in _results(report):
                if mode not in per_mode or not per_mode[mode].get("listed", True):
                    continue
                value = _get(per_mode[mode], *path_keys)
                if isinstance(value, list):
                    value = statistics.median(value) if value else None
                if value is not None:
                    xs.append(n)
                    ys.append(value)
            if xs:
                axis.plot(xs, ys, marker="o", label=mode, **MODE_STYLE[mode])
        axis.set_title(title, fontsize=10)
        axis.set_xscale("log")
        if log_y:
            axis.set_yscale("log")
        axis.set_xlabel("services (N)")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
