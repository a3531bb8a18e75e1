"""The Maglev fill loop compiled with numba, for builds too large for the Python loop.

Imported only by a large build (ebpflb.maglev.COMPILED_MIN_SLOTS): importing numba and
loading the compiled loop from its cache costs about a second on a host and 10-20 s in an
emulated VM, which most agents (clusters of a few hundred services) never need to pay.
The loop is ebpflb.maglev._fill_python's on arrays; the tests check both against the
paper's pseudocode (tests/unit/maglev_reference.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt

_Int64Array = npt.NDArray[np.int64]
_Int32Array = npt.NDArray[np.int32]
_F = TypeVar("_F", bound=Callable[..., object])


def _njit(func: _F) -> _F:
    """Compile with numba, keeping the signature visible to mypy (numba has no stubs).

    The on-disk cache avoids recompiling (about a second) on every agent start. A read-only
    image with no writable cache directory makes numba refuse cache=True; compiling once
    per process is then the fallback rather than failing at import.
    """
    try:
        return cast(_F, numba.njit(cache=True)(func))
    except RuntimeError:
        return cast(_F, numba.njit(func))


@_njit
def _fill(offsets: _Int64Array, skips: _Int64Array, weights: _Int64Array, out: _Int32Array) -> None:
    """Fill `out` (len M) with backend indices: Pseudocode 1 with Katran's weighted turns."""
    size = out.shape[0]
    n = offsets.shape[0]
    out[:] = -1
    max_weight = 0
    for i in range(n):
        max_weight = max(max_weight, weights[i])
    if max_weight == 0:
        return
    pos = offsets.copy()
    cum = np.zeros(n, np.int64)
    filled = 0
    while True:
        for i in range(n):
            cum[i] += weights[i]
            if cum[i] < max_weight:
                continue
            cum[i] -= max_weight
            c = pos[i]
            while out[c] >= 0:
                c += skips[i]
                if c >= size:
                    c -= size
            out[c] = i
            c += skips[i]
            if c >= size:
                c -= size
            pos[i] = c
            filled += 1
            if filled == size:
                return


@_njit
def fill_many(
    offsets: _Int64Array,
    skips: _Int64Array,
    weights: _Int64Array,
    backend_starts: _Int64Array,
    out: _Int32Array,
    slot_starts: _Int64Array,
) -> None:
    """`_fill` for many services in one call, saving a dispatch per service.

    Service s owns backends [backend_starts[s], backend_starts[s+1]) and the same range of
    `slot_starts` in `out`.
    """
    for s in range(backend_starts.shape[0] - 1):
        b0, b1 = backend_starts[s], backend_starts[s + 1]
        _fill(
            offsets[b0:b1], skips[b0:b1], weights[b0:b1], out[slot_starts[s] : slot_starts[s + 1]]
        )


def warm_up() -> None:
    """Load (or compile) the loop now rather than inside a sync."""
    out = np.empty(101, np.int32)
    one = np.zeros(1, np.int64)
    fill_many(one, one + 1, one + 1, np.array([0, 1], np.int64), out, np.array([0, 101], np.int64))
