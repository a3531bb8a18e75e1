"""The tests' oracle for ebpflb.maglev: Pseudocode 1 of the Maglev paper, literally.

Plain Python, slow and independent of the module it checks: its own hashing (keyed
blake2b, the two little-endian 64-bit halves split with int.from_bytes), no numpy, no C.
The only addition to the paper is Katran's weighted turn; with equal weights every backend
takes every turn, which is the paper's loop. permutation[i][j] is the paper's
(offset + j * skip) mod M, computed when read instead of stored: a 131,071-slot table of a
thousand backends would otherwise take gigabytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from ebpflb.maglev import DEFAULT_HASH_SEED, EMPTY_SLOT


@dataclass(frozen=True)
class _Permutation:
    offset: int
    skip: int
    size: int

    def __getitem__(self, j: int) -> int:
        return (self.offset + j * self.skip) % self.size


def reference_fill(
    backends: Mapping[str, int], size: int, seed: str = DEFAULT_HASH_SEED
) -> list[int]:
    """Each slot's backend, as an index into the sorted names (EMPTY_SLOT: none)."""
    names = sorted(backends)
    weights = [backends[n] for n in names]
    permutation = []
    for name in names:
        digest = hashlib.blake2b(name.encode(), key=seed.encode(), digest_size=16).digest()
        offset = int.from_bytes(digest[:8], "little") % size
        skip = int.from_bytes(digest[8:], "little") % (size - 1) + 1
        permutation.append(_Permutation(offset, skip, size))
    entry = [EMPTY_SLOT] * size
    if not any(weights):
        return entry
    max_weight = max(weights)
    cum = [0] * len(names)
    next_ = [0] * len(names)
    n = 0
    while True:
        for i in range(len(names)):
            cum[i] += weights[i]
            if cum[i] < max_weight:
                continue
            cum[i] -= max_weight
            c = permutation[i][next_[i]]
            while entry[c] >= 0:
                next_[i] += 1
                c = permutation[i][next_[i]]
            entry[c] = i
            next_[i] += 1
            n += 1
            if n == size:
                return entry
