"""Maglev consistent hashing: the lookup table that spreads a service over its backends.

The algorithm is the one in Eisenbud et al., "Maglev: A Fast and Reliable Software Network
Load Balancer" (NSDI 2016), section 3.4, Pseudocode 1. Each backend gets a permutation of
the M table slots, derived from two hashes of its name; backends then take turns claiming
their next preferred slot that is still empty, until every slot is taken. The datapath
hashes a flow to a slot and reads the backend from it.

Why Maglev rather than picking a random backend: every node builds the same table from the
same backend set, so a flow reaches the same backend whichever node it enters, and a
change of backends remaps only a little more than the flows of the backends that changed.

This module is pure (no kernel, no I/O, no logging) so that the reconciler, the tests and
the benchmark can call it freely; the datapath adapter writes the result into BPF maps.
The fill loop itself is C (fill.c, compiled when the package is installed): the
loop is sequential (each claim depends on all before it), 30-140x faster in C than in
Python, and a numpy version (round by round) was slower still than Python (issue 22).
Weights follow Katran's MaglevHashV2: in each round a backend adds its weight to a running
counter and takes a turn whenever the counter reaches the largest weight.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from ebpflb.errors import MaglevError

try:
    from ebpflb.maglev import fill as maglev_fill
except ImportError as exc:  # a source tree used without `pip install` / `make setup`
    raise ImportError(
        f"ebpflb's Maglev fill loop (ebpflb/maglev/fill.c) is not built ({exc}): install"
        " the package (pip install, or make setup), which compiles it"
    ) from exc

__all__ = [
    "DEFAULT_HASH_SEED",
    "DEFAULT_MAX_TABLE_SIZE",
    "EMPTY_SLOT",
    "MAX_WEIGHT",
    "MIN_SLOTS_PER_BACKEND",
    "TABLE_SIZES",
    "MaglevError",
    "MaglevTable",
    "build_table",
    "build_tables",
    "changed_slots",
    "table_size_for",
]

DEFAULT_HASH_SEED: Final = "ebpflb-maglev-v1"
"""Cluster-wide hash key. Every node must use the same seed, or their tables disagree."""

DEFAULT_MAX_TABLE_SIZE: Final = 131071

MIN_SLOTS_PER_BACKEND: Final = 100
"""The paper's M > 100·N, which keeps backends' shares within about 1% of each other."""

TABLE_SIZES: Final = (101, 251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071)
"""Allowed table sizes, all prime: Cilium's `maglev.tableSize` values plus 101 for tiny services.

Roughly doubling rungs keep the number of distinct sizes (and so of size changes, which
remap nearly every slot) small while wasting at most about half of a table.
"""

EMPTY_SLOT: Final = -1
"""Slot value of an unusable table: the datapath must refuse the service."""

MAX_WEIGHT: Final = 2**32 - 1
"""Largest weight accepted; weights are u32 in Katran and in the datapath's backend entries."""

_MAX_BLAKE2B_KEY: Final = 64

_Int64Array = npt.NDArray[np.int64]
_Int32Array = npt.NDArray[np.int32]


def _fill_many(
    offsets: _Int64Array,
    skips: _Int64Array,
    weights: _Int64Array,
    backend_starts: _Int64Array,
    out: _Int32Array,
    slot_starts: _Int64Array,
) -> None:
    """Fill `out` for many services: service s owns backends [backend_starts[s],
    backend_starts[s+1]) and the same range of `slot_starts` in `out`.

    The C loop checks its inputs again (bounds, offsets, skips, weights) so that no input
    makes it write out of bounds or spin; what it refuses is raised as a MaglevError."""
    try:
        maglev_fill.fill_many(offsets, skips, weights, backend_starts, out, slot_starts)
    except ValueError as exc:
        raise MaglevError(f"building {len(slot_starts) - 1} tables: {exc}") from exc


@dataclass(frozen=True, eq=False, slots=True)
class MaglevTable:
    """One service's lookup table.

    `slots[k]` is an index into `backends` (sorted names), or EMPTY_SLOT everywhere when the
    table is unusable (no backend, or every weight 0). Indices are only meaningful together
    with `backends`: to compare tables built from different backend sets, map both to
    stable IDs with `map_slots` first. The table owns `slots` and makes it read-only.
    """

    backends: tuple[str, ...]
    slots: _Int32Array
    size: int
    usable: bool

    def __post_init__(self) -> None:
        if self.slots.dtype != np.int32 or self.slots.shape != (self.size,):
            raise MaglevError(f"slots must be int32 of shape ({self.size},)")
        self.slots.setflags(write=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MaglevTable):
            return NotImplemented
        return (
            self.backends == other.backends
            and self.usable == other.usable
            and np.array_equal(self.slots, other.slots)
        )

    def __hash__(self) -> int:
        return hash((self.backends, self.usable, self.slots.tobytes()))

    def slot_counts(self) -> dict[str, int]:
        """Slots held by each backend (0 for drained ones), to check balance and weights."""
        counts = np.bincount(self.slots[self.slots >= 0], minlength=len(self.backends))
        return dict(zip(self.backends, (int(c) for c in counts), strict=True))

    def map_slots(self, ids: Mapping[str, int]) -> _Int64Array:
        """The slots with each backend index replaced by `ids[name]` (e.g. datapath backend IDs).

        EMPTY_SLOT stays EMPTY_SLOT. This is what the reconciler writes, and what
        `changed_slots` should compare when the backend set changed.
        """
        if not self.usable:
            return np.full(self.size, EMPTY_SLOT, np.int64)
        lut = np.array([ids[name] for name in self.backends], np.int64)
        return lut[self.slots]


def table_size_for(
    n_backends: int, *, max_size: int = DEFAULT_MAX_TABLE_SIZE, current: int | None = None
) -> int:
    """Pick the table size M for a service with `n_backends` backends that need slots.

    The minimal size is the smallest rung of TABLE_SIZES holding MIN_SLOTS_PER_BACKEND
    slots per backend, or `max_size` when none below it does (the balance guarantee then
    weakens to floor/ceil of M/N). Changing M remaps almost every slot, so with `current`
    (the size in use) there is hysteresis: grow as soon as 100·N > current, but shrink only
    when the minimal rung is two or more rungs below `current`. A service flapping across
    one boundary therefore keeps its size.

    Without `current` the result is a pure function of N, so fresh nodes agree. With it,
    nodes agree on M when they saw the same history of N or when N is away from a boundary;
    the agent restores `current` from the pinned maps across restarts so that a restart
    does not resize (and reshuffle) tables. A `current` that is not a rung at or below
    `max_size` (e.g. after the cap was lowered) is ignored.

    Raises MaglevError if `max_size` is not in TABLE_SIZES or n_backends exceeds it.
    """
    if max_size not in TABLE_SIZES:
        raise MaglevError(f"max table size {max_size} is not one of {TABLE_SIZES}")
    if n_backends < 0:
        raise MaglevError(f"negative backend count {n_backends}")
    if n_backends > max_size:
        raise MaglevError(
            f"{n_backends} backends exceed the Maglev table size limit of {max_size} slots"
        )
    rungs = TABLE_SIZES[: TABLE_SIZES.index(max_size) + 1]
    needed = MIN_SLOTS_PER_BACKEND * n_backends
    minimal = next((m for m in rungs if m >= needed), max_size)
    if current is None or current not in rungs:
        return minimal
    grow = minimal > current
    shrink = rungs.index(minimal) <= rungs.index(current) - 2
    return minimal if grow or shrink else current


def build_table(
    backends: Mapping[str, int] | Iterable[str],
    size: int,
    *,
    seed: str | bytes = DEFAULT_HASH_SEED,
) -> MaglevTable:
    """Build the Maglev table of one service.

    `backends` maps names (e.g. "10.244.1.11:8080") to weights >= 0, or is an iterable of
    names that all weigh 1. Weight 0 keeps the backend in `backends` with no slot, so its
    flows drain elsewhere. The result depends only on the set of names, the weights,
    `size` and `seed`, never on input order or process, so every node builds the same bytes.

    Raises MaglevError for a size that is not a prime > 1, more weighted backends than
    slots, a weight outside [0, MAX_WEIGHT], a duplicate name or a seed over 64 bytes.
    """
    names, weights = _normalise(backends)
    key = _seed_key(seed)
    _check_size(size, int(np.count_nonzero(weights)))
    offsets, skips = _permutation_params(names, size, key)
    slots = np.empty(size, np.int32)
    _fill_many(
        offsets,
        skips,
        weights,
        np.array([0, len(names)], np.int64),
        slots,
        np.array([0, size], np.int64),
    )
    return MaglevTable(names, slots, size, bool(weights.any()))


def build_tables(
    services: Sequence[Mapping[str, int] | Iterable[str]],
    sizes: Sequence[int],
    *,
    seed: str | bytes = DEFAULT_HASH_SEED,
) -> list[MaglevTable]:
    """`build_table` for many services at once, equal results; one call of the C loop
    for all (a full sync: thousands of small services, one crossing into C)."""
    if len(services) != len(sizes):
        raise MaglevError(f"{len(services)} services but {len(sizes)} sizes")
    key = _seed_key(seed)
    normalised = [_normalise(backends) for backends in services]
    for (_, weights), size in zip(normalised, sizes, strict=True):
        _check_size(size, int(np.count_nonzero(weights)))
    counts = [len(names) for names, _ in normalised]
    all_names = [name for names, _ in normalised for name in names]
    offsets, skips = _permutation_params(
        all_names, np.repeat(np.asarray(sizes, np.int64), counts), key
    )
    backend_starts = np.cumsum([0, *counts], dtype=np.int64)
    slot_starts = np.cumsum([0, *sizes], dtype=np.int64)
    out = np.empty(int(slot_starts[-1]), np.int32)
    weights = np.concatenate([w for _, w in normalised]) if normalised else np.empty(0, np.int64)
    _fill_many(offsets, skips, weights, backend_starts, out, slot_starts)
    return [
        MaglevTable(names, out[slot_starts[s] : slot_starts[s + 1]].copy(), sizes[s], bool(w.any()))
        for s, (names, w) in enumerate(normalised)
    ]


def changed_slots(old: npt.NDArray[np.integer], new: npt.NDArray[np.integer]) -> _Int64Array:
    """Indices where two tables of the same size differ: the only slots worth rewriting.

    Compare arrays in one index space (`MaglevTable.map_slots`), not raw `slots` of tables
    built from different backend sets. A size change rewrites everything, so it is an error.
    """
    if old.shape != new.shape:
        raise MaglevError(f"cannot diff tables of shapes {old.shape} and {new.shape}")
    return np.flatnonzero(old != new).astype(np.int64)


def _normalise(backends: Mapping[str, int] | Iterable[str]) -> tuple[tuple[str, ...], _Int64Array]:
    """Sorted names and their weights; sorting makes the turn order independent of input order."""
    if isinstance(backends, str | bytes):
        raise TypeError("backends must be a collection of names, not a single string")
    if isinstance(backends, Mapping):
        items = dict(backends)
    else:
        items = {}
        for name in backends:
            if name in items:
                raise MaglevError(f"duplicate backend {name!r}")
            items[name] = 1
    names = tuple(sorted(items))
    for name in names:
        weight = items[name]
        if not isinstance(name, str):
            raise MaglevError(f"backend name {name!r} is not a str")
        if isinstance(weight, bool) or not isinstance(weight, int):
            raise MaglevError(f"weight of {name!r} is not an int: {weight!r}")
        if not 0 <= weight <= MAX_WEIGHT:
            raise MaglevError(f"weight of {name!r} is {weight}, outside [0, {MAX_WEIGHT}]")
    return names, np.array([items[n] for n in names], np.int64)


def _seed_key(seed: str | bytes) -> bytes:
    key = seed.encode() if isinstance(seed, str) else bytes(seed)
    if len(key) > _MAX_BLAKE2B_KEY:
        raise MaglevError(f"hash seed is {len(key)} bytes, over blake2b's {_MAX_BLAKE2B_KEY}")
    return key


def _check_size(size: int, n_weighted: int) -> None:
    if size not in TABLE_SIZES and not _is_prime(size):
        raise MaglevError(f"table size {size} is not prime")
    if n_weighted > size:
        raise MaglevError(
            f"{n_weighted} backends exceed the Maglev table size limit of {size} slots"
        )


def _is_prime(n: int) -> bool:
    """Trial division is enough: tables hold at most a few million slots."""
    if n < 2 or n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, int(n**0.5) + 1, 2))


def _digests(names: Sequence[str], key: bytes) -> list[bytes]:
    """Keyed blake2b: unlike hash(), identical in every process; the key is the cluster seed."""
    return [hashlib.blake2b(n.encode(), key=key, digest_size=16).digest() for n in names]


def _permutation_params(
    names: Sequence[str], size: int | _Int64Array, key: bytes
) -> tuple[_Int64Array, _Int64Array]:
    """Per-backend (offset, skip) for a table size (or one size per backend, for batches).

    h1 and h2 are the two little-endian 64-bit halves of the digest.
    """
    h = np.frombuffer(b"".join(_digests(names, key)), dtype="<u8").reshape(-1, 2)
    m = np.asarray(size, np.uint64)
    offsets = (h[:, 0] % m).astype(np.int64)
    skips = (h[:, 1] % (m - np.uint64(1)) + np.uint64(1)).astype(np.int64)
    return offsets, skips
