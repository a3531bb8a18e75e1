"""Maglev benchmark: balance, disruption, memory and build time of ebpflb.maglev.

Backend names and removals come from a fixed random seed, so every figure except the
timings is reproducible. Disruption is put next to its minimum (the removed backends'
share) and next to the references in /work/shared/notes/anchors.md section 3: the paper
itself gives disruption only as a graph, the anchors add a separate simulation table.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ebpflb.maglev import (
    DEFAULT_HASH_SEED,
    build_table,
    build_tables,
    changed_slots,
    table_size_for,
)

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
    *, quick: bool = False, seed: str | bytes = DEFAULT_HASH_SEED
) -> dict[str, Any]:
    """Run every measurement and return a JSON-serialisable report (see render_text)."""
    started = time.perf_counter()
    repeats, removals = (3, 5) if quick else (9, 30)
    rng = random.Random(0)

    # The first call loads the compiled kernels from numba's cache (or compiles them).
    warmup_s = _seconds(
        lambda: (build_table(["w:1"], 101, seed=seed), build_tables([["w:1"]], [101], seed=seed))
    )

    names = {n: _backend_names(rng, n) for n in BACKEND_COUNTS}
    configs = []
    for n in BACKEND_COUNTS:
        ladder = table_size_for(n)
        anchor_sizes = {m for an, m, _, _ in ANCHOR_SIMULATION if an == n}
        for size in sorted({ladder, *FIXED_SIZES, *anchor_sizes}):
            if size >= n:
                row = _measure(names[n], size, rng, removals=removals, repeats=repeats, seed=seed)
                configs.append({"kind": "ladder" if size == ladder else "fixed", **row})

    references = []
    for n, size, removed, anchor in ANCHOR_SIMULATION:
        if removed == 1:
            row = next(c for c in configs if c["n"] == n and c["m"] == size)
            changed = row["changed_fraction"]
        else:
            changed = _disruption(n, size, rng, removed, removals, seed)[0]
        references.append(
            {
                "n": n,
                "m": size,
                "removed": removed,
                "changed_fraction": changed,
                "minimum_fraction": removed / n,
                "anchors_simulation_fraction": anchor,
                "paper": PAPER_NOTE,
            }
        )

    report = {
        "seed": seed if isinstance(seed, str) else seed.hex(),
        "quick": quick,
        "timing_repeats": repeats,
        "removals_per_config": removals,
        "warmup_s": warmup_s,
        "configs": configs,
        "references": references,
        "scale": _scale(rng, repeats=1 if quick else 3, seed=seed),
        "recompute": _recompute(names[RECOMPUTE_BACKENDS], rng, repeats=repeats, seed=seed),
    }
    report["wall_s"] = time.perf_counter() - started
    return report


def render_text(report: dict[str, Any]) -> str:
    """The report as aligned text tables."""
    lines = [
        f"Maglev benchmark: seed {report['seed']!r}, {'quick' if report['quick'] else 'full'} "
        f"run: {report['timing_repeats']} timing repeats, {report['removals_per_config']} "
        f"random backend sets per disruption figure; numba warm-up {report['warmup_s']:.2f} s",
        "",
        "Balance, disruption of removing 1 backend, memory and build time per service table",
    ]
    rows = [
        [
            c["n"],
            c["m"],
            c["kind"],
            f"{c['m'] / c['n']:.0f}",
            f"{c['min_slots']}-{c['max_slots']}",
            f"{c['max_deviation_pct']:.2f}",
            f"{100 * c['changed_fraction']:.3f}",
            f"{100 * c['minimum_fraction']:.3f}",
            f"{100 * c['survivors_moved_fraction']:.3f}",
            f"{100 * c['survivors_moved_max_fraction']:.3f}",
            f"{c['bytes_per_table'] / 1024:.1f}",
            f"{c['build_ms']:.3f}",
        ]
        for c in report["configs"]
    ]
    lines += _table(
        [
            "N",
            "M",
            "size",
            "M/N",
            "slots/backend",
            "max dev %",
            "changed %",
            "min 1/N %",
            "survivors %",
            "survivors max %",
            "KiB/table",
            "build ms",
        ],
        rows,
    )
    lines += ["", "Entries changed when backends are removed, next to references (% of table)"]
    rows = [
        [
            r["n"],
            r["m"],
            r["removed"],
            f"{100 * r['changed_fraction']:.3f}",
            f"{100 * r['minimum_fraction']:.3f}",
            f"{100 * r['anchors_simulation_fraction']:.3f}",
            r["paper"],
        ]
        for r in report["references"]
    ]
    lines += _table(
        ["N", "M", "removed", "ebpflb %", "minimum %", "anchors sim. %", "paper (NSDI'16)"], rows
    )
    lines += [
        "  The paper reports disruption only as a graph (Fig. 12: 1000 backends, M = 65537",
        "  and 655373); 'anchors sim.' is a separate blake2b simulation (anchors.md section 3).",
        "",
    ]
    s, r = report["scale"], report["recompute"]
    lines += [
        f"Scale: {s['services']:,} services x {s['backends']} backends, M = {s['m']}: "
        f"{s['batched_s']:.3f} s batched, {s['one_by_one_s']:.3f} s one by one "
        f"(target < {s['target_s']:g} s: {_ok(s['batched_s'] < s['target_s'])})",
        f"  tables {s['total_bytes'] / 2**20:.1f} MiB ({s['bytes_per_table']} B each; "
        f"limit {s['limit_bytes'] / 2**20:.0f} MiB: {_ok(s['total_bytes'] <= s['limit_bytes'])})",
        f"Recompute: replace 1 of {r['backends']} backends, M = {r['m']}: {r['ms']:.2f} ms "
        f"build + diff (target < {r['target_ms']:g} ms: {_ok(r['ms'] < r['target_ms'])})",
        f"  {r['changed_slots']} slots changed ({100 * r['changed_slots'] / r['m']:.3f}%); "
        f"the replaced backend held {r['replaced_backend_slots']}",
        "",
        f"Wall time: {report['wall_s']:.1f} s",
    ]
    return "\n".join(lines)


def _measure(
    names: Sequence[str],
    size: int,
    rng: random.Random,
    *,
    removals: int,
    repeats: int,
    seed: str | bytes,
) -> dict[str, Any]:
    n = len(names)
    counts = build_table(names, size, seed=seed).slot_counts().values()
    changed, moved, moved_max = _disruption(n, size, rng, 1, removals, seed)
    return {
        "n": n,
        "m": size,
        "min_slots": min(counts),
        "max_slots": max(counts),
        "max_deviation_pct": 100 * max(abs(c - size / n) for c in counts) / (size / n),
        "changed_fraction": changed,
        "minimum_fraction": 1 / n,
        "survivors_moved_fraction": moved,
        "survivors_moved_max_fraction": moved_max,
        "bytes_per_table": size * SLOT_BYTES,
        "build_ms": _median_ms(lambda: build_table(names, size, seed=seed), repeats),
    }


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


def _scale(rng: random.Random, *, repeats: int, seed: str | bytes) -> dict[str, Any]:
    size = table_size_for(SCALE_BACKENDS)
    services = [_backend_names(rng, SCALE_BACKENDS) for _ in range(SCALE_SERVICES)]
    sizes = [size] * SCALE_SERVICES
    return {
        "services": SCALE_SERVICES,
        "backends": SCALE_BACKENDS,
        "m": size,
        "batched_s": _median_ms(lambda: build_tables(services, sizes, seed=seed), repeats) / 1000,
        "one_by_one_s": _seconds(lambda: [build_table(s, size, seed=seed) for s in services]),
        "target_s": SCALE_TARGET_S,
        "bytes_per_table": size * SLOT_BYTES,
        "total_bytes": SCALE_SERVICES * size * SLOT_BYTES,
        "limit_bytes": MEMORY_LIMIT_BYTES,
    }


def _recompute(
    names: Sequence[str], rng: random.Random, *, repeats: int, seed: str | bytes
) -> dict[str, Any]:
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

    return {
        "backends": len(names),
        "m": size,
        "ms": _median_ms(recompute, repeats),
        "target_ms": RECOMPUTE_TARGET_MS,
        "changed_slots": recompute(),
        "replaced_backend_slots": old_table.slot_counts()[replaced],
    }


def _backend_names(rng: random.Random, n: int) -> list[str]:
    """Distinct pod-like addresses in 10.0.0.0/8."""
    return [f"10.{a >> 16}.{(a >> 8) & 255}.{a & 255}:8080" for a in rng.sample(range(2**24), n)]


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    return 1000 * statistics.median(_seconds(fn) for _ in range(repeats))


def _ok(passed: bool) -> str:
    return "ok" if passed else "MISSED"


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return ["  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
