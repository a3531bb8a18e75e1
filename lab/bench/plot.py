"""`ebpflb bench compare --plot`: six panels against N (log scale), one line per mode;
`ebpflb bench bulk --plot`: Gbit/s per mode, both directions."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.bench import extras
from lab.bench.records.bulk import BulkRun
from lab.bench.records.compare import CompareRun, ModeResult
from lab.bench.render import listed
from lab.bench.settings import Mode

# One colour and style per mode in every panel (matplotlib's cycle would shift them).
MODE_STYLE: dict[Mode, dict[str, str]] = {
    Mode.NONE: {"color": "black", "linestyle": "--"},
    Mode.IPTABLES_LEGACY: {"color": "tab:orange"},
    Mode.IPTABLES_NFT: {"color": "tab:red"},
    Mode.NFTABLES: {"color": "tab:blue"},
    Mode.EBPFLB: {"color": "tab:green"},
    Mode.EBPFLB_XDP: {"color": "tab:olive", "linestyle": ":"},
}


def _median(values: tuple[float, ...]) -> float | None:
    return statistics.median(values) if values else None


# (title, the figure of a mode's result, logarithmic y axis)
PANELS: tuple[tuple[str, Callable[[ModeResult], float | None], bool], ...] = (
    (
        "connect() p50 to the last service (µs)",
        lambda r: r.data.latency.last.p50_us if r.data.latency else None,
        False,
    ),
    (
        "connect() p50 to a random service (µs)",
        lambda r: r.data.latency.random.p50_us if r.data.latency else None,
        False,
    ),
    (
        "new connections/s, one core",
        lambda r: r.data.connections.per_s if r.data.connections else None,
        False,
    ),
    (
        "NodePort requests/s from outside",
        lambda r: r.data.nodeport.per_s if r.data.nodeport else None,
        False,
    ),
    (
        "program all N services from nothing (s)",
        lambda r: r.control.program_s if r.control else None,
        True,
    ),
    (
        "one endpoint change (s, median)",
        lambda r: _median(r.control.change_s) if r.control else None,
        True,
    ),
)


def _pyplot(command: str) -> Any:
    """matplotlib's pyplot, drawing to files only (Agg); an error naming the extra if absent."""
    extras.require("matplotlib", command)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(run: CompareRun, path: Path) -> None:
    plt = _pyplot("ebpflb bench --plot")
    figure, axes = plt.subplots(2, 3, figsize=(16, 9))
    m = run.machine
    figure.suptitle(
        f"ebpflb bench: Linux {m.kernel}, {m.cpus} CPUs ({m.cpu}),"
        f" {run.settings.family}, {run.settings.endpoints} endpoints per service"
    )
    points = list(listed(run))
    for axis, (title, value_of, log_y) in zip(axes.flat, PANELS, strict=True):
        for mode in Mode:
            xs, ys = [], []
            for n, result in points:
                value = value_of(result) if result.mode is mode else None
                if value is not None:
                    xs.append(n)
                    ys.append(value)
            if xs:
                axis.plot(xs, ys, marker="o", label=mode.value, **MODE_STYLE[mode])
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


def plot_bulk(run: BulkRun, path: Path) -> None:
    """`ebpflb bench bulk --plot`: Gbit/s per mode, upload and download side by side (the
    median as a bar, every repeat as a dot), the forwarding floors as lines."""
    plt = _pyplot("ebpflb bench bulk --plot")
    figure, axis = plt.subplots(figsize=(10, 5))
    m = run.machine
    figure.suptitle(
        f"ebpflb bench bulk: Linux {m.kernel}, {m.cpus} CPUs ({m.cpu}), {run.settings.family},"
        f" {run.settings.repeats} x {run.settings.seconds} s per direction"
    )
    width = 0.38
    for index, result in enumerate(run.results):
        for offset, (label, figure_of) in zip(
            (-width / 2, width / 2),
            (("upload", result.upload), ("download", result.download)),
            strict=True,
        ):
            x = index + offset
            axis.bar(
                x,
                figure_of.gbit_s,
                width,
                color="tab:green" if label == "upload" else "tab:blue",
                label=label if index == 0 else None,
            )
            axis.plot([x] * len(figure_of.runs_gbit_s), figure_of.runs_gbit_s, "k.", markersize=4)
    floor = run.get(Mode.NONE)
    if floor is not None:
        axis.axhline(
            floor.upload.gbit_s,
            color="black",
            linestyle="--",
            linewidth=0.8,
            label="plain forwarding (upload)",
        )
    axis.set_xticks(range(len(run.results)), [r.mode.value for r in run.results], rotation=20)
    axis.set_ylabel("Gbit/s (median of the repeats; dots: each repeat)")
    axis.grid(True, axis="y", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
