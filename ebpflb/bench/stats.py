"""Summaries of measured samples, shared by the benchmarks."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile q (0..1) of non-empty, sorted samples: always a measured
    value, never an interpolation."""
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]
