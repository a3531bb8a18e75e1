"""`ebpflb bench pps`'s report as text: one row per mode, then the targets."""

from __future__ import annotations

from lab.bench.records.pps import PpsResult, PpsRun
from lab.bench.texttable import targets_lines, text_table

FLOOR_NOTE = {
    "none": "plain forwarding: the cap of this veth topology",
    "none-xdp-pass": "forwarding, XDP_PASS on the node's interfaces",
}


def _programs(result: PpsResult) -> str:
    """Each NodePort program's ns per packet, and the ceiling their sum sets on one core."""
    total = result.program_ns_per_packet
    if total is None or total <= 0:
        return ""
    each = " + ".join(
        f"{p.program.removeprefix('ebpflb_')} {p.ns_per_exchange:.0f}" for p in result.programs
    )
    return f"{each} ns = {1e3 / total:.1f} Mpps alone"


def render_pps(run: PpsRun) -> str:
    s, m = run.settings, run.machine
    rates = ", ".join(f"{r:,}" for r in s.rates)
    lines = [
        f"ebpflb bench pps: 60-byte UDP frames from {s.flows} flows through a NodePort with"
        f" SNAT, {s.family}, the node's receive queue on one core (trafgen on another);"
        f" saturation: median of {s.repeats} x {s.seconds:g} s; node core at {rates}"
        f" packets/s offered; {m.cpus} CPUs ({m.cpu}), Linux {m.kernel}",
        "",
    ]
    headers = ["mode", "Mpps", "windows", "node core", "offered Mpps"]
    headers += [f"CPU @{r // 1000}k" for r in s.rates] + ["programs (bpf_stats)", ""]
    rows = []
    for r in run.results:
        row: list[object] = [
            r.mode.value,
            f"{r.delivered_pps / 1e6:.3f}",
            " ".join(f"{f.delivered_pps / 1e6:.3f}" for f in r.saturation),
            f"{r.node_busy:.0%}",
            " ".join(f"{f.offered_pps / 1e6:.3f}" for f in r.saturation),
        ]
        measured = {fixed.rate: fixed for fixed in r.rates}
        for rate in s.rates:
            fixed = measured.get(rate)
            ns = fixed.ns_per_packet if fixed else None
            row.append(f"{fixed.node_cpu:.1%} ({ns:.0f} ns)" if fixed and ns else "-")
        row += [_programs(r), FLOOR_NOTE.get(r.mode.value, "")]
        rows.append(row)
    lines += text_table(headers, rows, left=True)
    lines += [
        "",
        "CPU @rate: the node core's share the traffic took (its idle share subtracted), and"
        " that per delivered packet.",
    ]
    lines += targets_lines(run.targets, run.total_s)
    return "\n".join(lines)
