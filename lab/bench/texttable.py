"""Plain-text tables of the bench's reports (the maglev, sync and bulk renderers; compare
draws with rich)."""

from __future__ import annotations

from collections.abc import Sequence

from lab.bench.records.compare import Verdict


def text_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, left: bool = False
) -> list[str]:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return [
        "  "
        + "  ".join(
            c.ljust(w) if left else c.rjust(w) for c, w in zip(row, widths, strict=True)
        ).rstrip()
        for row in cells
    ]


def targets_lines(targets: Sequence[Verdict], total_s: float) -> list[str]:
    """A report's closing lines: its targets judged, and how long the bench took."""
    lines = ["", "Targets"]
    lines += text_table(
        ["target", "", "measured"], [[v.target, v.outcome, v.detail] for v in targets], left=True
    )
    return [*lines, "", f"total bench time {total_s:.0f} s"]
