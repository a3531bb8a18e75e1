"""Maglev benchmark: balance, disruption, memory and build time of ebpflb.maglev.

Backend names and removals come from a fixed random seed, so every figure except the
timings is reproducible. Disruption is put next to its minimum (the removed backends'
share) and next to the references in ../shared/notes/anchors.md section 3: the paper
itself gives disruption only as a graph, the anchors add a separate simulation table.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from ebpflb.maglev import (
    DEFAULT_HASH_SEED,
    build_table,
    build_tables,
    changed_slots,
    table_size_for,
)
from lab.bench.records.maglev import MaglevRun, Recompute, Reference, Scale, TableFigures
from lab.bench.settings import MaglevSettings

BACKEND_COUNTS = (3, 10, 100, 1000)
FIXED_SIZES = (16381, 65537)
"""Comparisons: Cilium's default maglev.tableSize, and the paper's and Katran's 65537."""

ANCHOR_SIMULATION = (
    (10, 251, 1, 0.151),
    (100, 16381, 1, 0.0242),
    (1000, 65537, 1, 0.00645),
    (1000, 65537, 10, 0.0337),
)
"""(N, M, backends removed, fraction of entries changed) from anchors.md section 3."""

PAPER_NOTE = "graph only (Fig. 12)"
SCALE_SERVICES, SCALE_BACKENDS = 10_000, 3
RECOMPUTE_BACKENDS = 1000
SLOT_BYTES = 4
"""The datapath stores one u32 backend ID per slot."""

MEMORY_LIMIT_BYTES = 64 * 2**20
SCALE_TARGET_S = 2.0
RECOMPUTE_TARGET_MS = 100.0


def run_maglev_bench(
    settings: MaglevSettings, *, seed: str | bytes = DEFAULT_HASH_SEED
) -> MaglevRun:
    """Run every measurement (lab.bench.render draws the tables)."""
    started = time.perf_counter()
    repeats, removals = settings.timing_repeats, settings.removals
    rng = random.Random(0)

    names = {n: _backend_names(rng, n) for n in BACKEND_COUNTS}
    configs = []
    for n in BACKEND_COUNTS:
        ladder = table_size_for(n)
        anchor_sizes = {m for an, m, _, _ in ANCHOR_SIMULATION if an == n}
        for size in sorted({ladder, *FIXED_SIZES, *anchor_sizes}):
            if size >= n:
                kind: Literal["ladder", "fixed"] = "ladder" if size == ladder else "fixed"
                configs.append(
                    _measure(
                        names[n], size, rng, kind, removals=removals, repeats=repeats, seed=seed
                    )
                )

    references = []
    for n, size, removed, anchor in ANCHOR_SIMULATION:
        if removed == 1:
            row = next(c for c in configs if c.n == n and c.m == size)
            changed = row.changed_fraction
        else:
            changed = _disruption(n, size, rng, removed, removals, seed)[0]
        references.append(
            Reference(
                n=n,
                m=size,
                removed=removed,
                changed_fraction=changed,
                minimum_fraction=removed / n,
                anchors_simulation_fraction=anchor,
                paper=PAPER_NOTE,
            )
        )

    scale = _scale(rng, repeats=settings.scale_repeats, seed=seed)
    recompute = _recompute(names[RECOMPUTE_BACKENDS], rng, repeats=repeats, seed=seed)
    return MaglevRun(
        seed=seed if isinstance(seed, str) else seed.hex(),
        quick=settings.quick,
        timing_repeats=repeats,
        removals_per_config=removals,
        configs=tuple(configs),
        references=tuple(references),
        scale=scale,
        recompute=recompute,
        wall_s=time.perf_counter() - started,
    )


def _measure(
    names: Sequence[str],
    size: int,
    rng: random.Random,
    kind: Literal["ladder", "fixed"],
    *,
    removals: int,
    repeats: int,
    seed: str | bytes,
) -> TableFigures:
    n = len(names)
    counts = build_table(names, size, seed=seed).slot_counts().values()
    changed, moved, moved_max = _disruption(n, size, rng, 1, removals, seed)
    return TableFigures(
        kind=kind,
        n=n,
        m=size,
        min_slots=min(counts),
        max_slots=max(counts),
        max_deviation_pct=100 * max(abs(c - size / n) for c in counts) / (size / n),
        changed_fraction=changed,
        minimum_fraction=1 / n,
        survivors_moved_fraction=moved,
        survivors_moved_max_fraction=moved_max,
        bytes_per_table=size * SLOT_BYTES,
        build_ms=_median_ms(lambda: build_table(names, size, seed=seed), repeats),
    )


def _disruption(
    n: int, size: int, rng: random.Random, removed: int, trials: int, seed: str | bytes
) -> tuple[float, float, float]:
    """Fractions of slots changed (mean) and moved between survivors (mean, max) when
    `removed` of `n` backends go; each trial draws a fresh backend set, since with few
    backends the removals of one set give only a handful of distinct outcomes."""
    changed, moved = [], []
    for _ in range(trials):
        names = _backend_names(rng, n)
        ids = {name: i for i, name in enumerate(names)}
        gone = set(rng.sample(names, removed))
        old = build_table(names, size, seed=seed).map_slots(ids)
        new = build_table([b for b in names if b not in gone], size, seed=seed).map_slots(ids)
        diff = changed_slots(old, new)
        changed.append(len(diff) / size)
        survivor = ~np.isin(old[diff], [ids[b] for b in gone])
        moved.append(int(np.count_nonzero(survivor)) / size)
    return statistics.fmean(changed), statistics.fmean(moved), max(moved)


def _scale(rng: random.Random, *, repeats: int, seed: str | bytes) -> Scale:
    size = table_size_for(SCALE_BACKENDS)
    services = [_backend_names(rng, SCALE_BACKENDS) for _ in range(SCALE_SERVICES)]
    sizes = [size] * SCALE_SERVICES
    return Scale(
        services=SCALE_SERVICES,
        backends=SCALE_BACKENDS,
        m=size,
        batched_s=_median_ms(lambda: build_tables(services, sizes, seed=seed), repeats) / 1000,
        one_by_one_s=_seconds(lambda: [build_table(s, size, seed=seed) for s in services]),
        target_s=SCALE_TARGET_S,
        bytes_per_table=size * SLOT_BYTES,
        total_bytes=SCALE_SERVICES * size * SLOT_BYTES,
        limit_bytes=MEMORY_LIMIT_BYTES,
    )


def _recompute(
    names: Sequence[str], rng: random.Random, *, repeats: int, seed: str | bytes
) -> Recompute:
    """Replace one backend (a pod restarted with a new IP) and diff, as the reconciler does."""
    size = table_size_for(len(names))
    replaced = rng.choice(names)
    newcomer = "192.168.0.1:8080"
    ids = {name: i for i, name in enumerate([*names, newcomer])}
    old_table = build_table(names, size, seed=seed)
    old = old_table.map_slots(ids)
    after = [b for b in names if b != replaced] + [newcomer]

    def recompute() -> int:
        return len(changed_slots(old, build_table(after, size, seed=seed).map_slots(ids)))

    return Recompute(
        backends=len(names),
        m=size,
        ms=_median_ms(recompute, repeats),
        target_ms=RECOMPUTE_TARGET_MS,
        changed_slots=recompute(),
        replaced_backend_slots=old_table.slot_counts()[replaced],
    )


def _backend_names(rng: random.Random, n: int) -> list[str]:
    """Distinct pod-like addresses in 10.0.0.0/8."""
    return [f"10.{a >> 16}.{(a >> 8) & 255}.{a & 255}:8080" for a in rng.sample(range(2**24), n)]


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    return 1000 * statistics.median(_seconds(fn) for _ in range(repeats))
