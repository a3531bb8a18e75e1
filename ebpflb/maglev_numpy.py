"""Candidate (b) of issue 22: the Maglev fill loop vectorised with numpy, no compiled code.

The paper's loop is sequential (each claim depends on every claim before it), so this one
runs it round by round: in a round, every backend that has a turn (Katran's weighted turns
are a fixed schedule: backend i of weight w in a table of largest weight m takes a turn in
round r when floor(r*w/m) > floor((r-1)*w/m)) of every table in the call looks for its next
free slot at once. Claims of one table in one round are taken in backend order: a prefix of
the table's participants up to the first whose slot an earlier one also found is accepted;
the rest look again from there (a later backend cannot be accepted before an earlier one
is settled: the earlier one's next slot may be the later one's). The result is the
sequential loop's, slot for slot.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_Int64Array = npt.NDArray[np.int64]
_Int32Array = npt.NDArray[np.int32]


def fill_many(
    offsets: _Int64Array,
    skips: _Int64Array,
    weights: _Int64Array,
    backend_starts: _Int64Array,
    out: _Int32Array,
    slot_starts: _Int64Array,
) -> None:
    """The fill of many tables, as ebpflb.maglev_fill.fill_many."""
    out[:] = -1
    n_tables = len(backend_starts) - 1
    if n_tables <= 0 or len(offsets) == 0:
        return
    counts = np.diff(backend_starts)
    table = np.repeat(np.arange(n_tables), counts)  # each backend's table
    sizes = np.diff(slot_starts)
    size = sizes[table]
    base = slot_starts[:-1][table]  # where its table starts in `out`
    index = (np.arange(len(offsets)) - backend_starts[:-1][table]).astype(np.int32)
    max_weight = np.zeros(n_tables, np.int64)
    np.maximum.at(max_weight, table, weights)
    m = max_weight[table]
    pos = offsets.copy()
    cum = np.zeros(len(offsets), np.int64)
    room = np.where(max_weight > 0, sizes, 0)  # slots still free in each table
    # Backends of tables still filling, with a weight (the others never take a turn).
    live = np.flatnonzero((weights > 0) & (room[table] > 0))
    first_claim = np.full(int(slot_starts[-1]), np.iinfo(np.int64).max, np.int64)
    while live.size:
        cum[live] += weights[live]
        turn = cum[live] >= m[live]
        todo = live[turn]  # this round's participants, in backend order
        cum[todo] -= m[todo]
        while todo.size:
            _probe(todo, pos, skips, size, base, out)
            slot = base[todo] + pos[todo]
            # Which participants found a slot an earlier one (same table) also found.
            order = np.arange(todo.size, dtype=np.int64)
            np.minimum.at(first_claim, slot, order)
            lost = first_claim[slot] != order
            first_claim[slot] = np.iinfo(np.int64).max
            tab = table[todo]
            starts = np.flatnonzero(np.r_[True, tab[1:] != tab[:-1]])
            run = np.diff(np.r_[starts, todo.size])
            first = np.repeat(starts, run)
            rank = order - first  # position among the table's participants
            losses = np.cumsum(lost)
            before = losses - np.repeat(losses[starts] - lost[starts], run)
            take = (before == 0) & (rank < room[tab])
            won = todo[take]
            out[slot[take]] = index[won]
            step = pos[won] + skips[won]
            pos[won] = np.where(step >= size[won], step - size[won], step)
            np.subtract.at(room, table[won], 1)
            rest = todo[~take]
            todo = rest[room[table[rest]] > 0]
        live = live[room[table[live]] > 0]


def _probe(
    todo: _Int64Array,
    pos: _Int64Array,
    skips: _Int64Array,
    size: _Int64Array,
    base: _Int64Array,
    out: _Int32Array,
) -> None:
    """Move each backend in `todo` along its permutation to its next free slot."""
    busy = todo[out[base[todo] + pos[todo]] >= 0]
    while busy.size:
        step = pos[busy] + skips[busy]
        pos[busy] = np.where(step >= size[busy], step - size[busy], step)
        busy = busy[out[base[busy] + pos[busy]] >= 0]
