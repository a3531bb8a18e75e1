"""`ebpflb bench bulk`'s report as text: one row per mode, then the targets."""

from __future__ import annotations

from lab.bench.records.bulk import BulkFigure, BulkRun
from lab.bench.texttable import targets_lines, text_table

FLOOR_NOTE = {
    "none": "plain forwarding (the floor of tc and the kube-proxy modes)",
    "none-xdp-pass": "forwarding, XDP_PASS on the node's interfaces (the floor of XDP)",
}


def _runs(figure: BulkFigure) -> str:
    return " ".join(f"{g:.2f}" for g in figure.runs_gbit_s)


def render_bulk(run: BulkRun) -> str:
    s, m = run.settings, run.machine
    lines = [
        f"ebpflb bench bulk: one TCP transfer each way through a NodePort with SNAT, GRO on,"
        f" {s.family}, {s.repeats} x {s.seconds} s per direction (iperf3);"
        f" {m.cpus} CPUs, Linux {m.kernel}",
        "",
    ]
    rows = [
        [
            r.mode.value,
            f"{r.upload.gbit_s:.2f}",
            f"{r.download.gbit_s:.2f}",
            _runs(r.upload),
            _runs(r.download),
            r.upload.retransmits + r.download.retransmits,
            "-" if r.dropped is None else r.dropped,
            FLOOR_NOTE.get(r.mode.value, ""),
        ]
        for r in run.results
    ]
    headers = ["mode", "up Gbit/s", "down Gbit/s", "up runs", "down runs", "retrans", "dropped", ""]
    lines += text_table(headers, rows, left=True)
    lines += targets_lines(run.targets, run.total_s)
    return "\n".join(lines)
