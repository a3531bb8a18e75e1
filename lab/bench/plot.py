"""`ebpflb bench compare --plot`: six panels against N (log scale), one line per mode."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from lab.bench import extras
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


def plot(run: CompareRun, path: Path) -> None:
    extras.require("matplotlib", "ebpflb bench --plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
