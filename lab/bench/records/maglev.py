"""`ebpflb bench maglev`'s results: balance, disruption, memory and build time of the
Maglev tables, next to the references (see lab.bench.maglev)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal


@dataclass(frozen=True)
class TableFigures:
    """One (N backends, table size M): balance, disruption of removing 1 backend, size."""

    kind: Literal["ladder", "fixed"]  # M from ebpflb's size ladder, or a comparison size
    n: int
    m: int
    min_slots: int
    max_slots: int
    max_deviation_pct: float
    changed_fraction: float  # of the table, mean over random backend sets
    minimum_fraction: float  # the removed backend's share: no table can change less
    survivors_moved_fraction: float
    survivors_moved_max_fraction: float
    bytes_per_table: int
    build_ms: float


@dataclass(frozen=True)
class Reference:
    """Disruption next to the references of anchors.md section 3."""

    n: int
    m: int
    removed: int
    changed_fraction: float
    minimum_fraction: float
    anchors_simulation_fraction: float
    paper: str


@dataclass(frozen=True)
class Scale:
    """Tables for many services at once, against the build-time and memory targets."""

    services: int
    backends: int
    m: int
    batched_s: float
    one_by_one_s: float
    target_s: float
    bytes_per_table: int
    total_bytes: int
    limit_bytes: int


@dataclass(frozen=True)
class Recompute:
    """Replacing one backend: rebuild and diff, as the reconciler does."""

    backends: int
    m: int
    ms: float
    target_ms: float
    changed_slots: int
    replaced_backend_slots: int


@dataclass(frozen=True)
class MaglevRun:
    KIND: ClassVar[str] = "maglev"

    seed: str
    quick: bool
    timing_repeats: int
    removals_per_config: int
    configs: tuple[TableFigures, ...]
    references: tuple[Reference, ...]
    scale: Scale
    recompute: Recompute
    wall_s: float
    # numba's import and cached kernels, in reports from before the fill loop was C.
    warmup_s: float | None = None
