"""Summaries of measured samples, shared by the benchmarks."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile q (0..1) of non-empty, sorted samples: always a measured
    value, never an interpolation."""
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass(frozen=True)
class Spread:
    median: float
    p99: float
    minimum: float
    maximum: float


def spread(values: Sequence[float]) -> Spread:
    """Median, p99 (nearest rank), min and max of non-empty samples."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    return Spread(statistics.median(ordered), percentile(ordered, 0.99), ordered[0], ordered[-1])
