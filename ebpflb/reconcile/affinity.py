"""ebpflb_affpair4 kept equal to what the realized frontends with session affinity need:
one (service id, backend id) -> timeout entry per backend of each such frontend's table.

The datapath honours a client's affinity entry only while that pair exists (bpf/lib/lb.h
lb_affinity_backend), so a backend leaving a frontend, affinity switched off or a new
timeout take effect for new connections as soon as this step has run, without touching
the clients' entries (an LRU the programs own). It runs after the entries were switched:
between the two, a new connection may still follow an affinity entry to a backend that
has just left the table, as one that started a moment earlier would.

Incremental applies diff the frontends they touched against what this step last wrote; a
full apply (and the first) reads the map back, so drift and a restart are repaired too.
"""

from __future__ import annotations

from collections.abc import Iterable

from ebpflb.datapath.maps import AffinityMatch, MapSet
from ebpflb.errors import MapError
from ebpflb.model import Frontend, SvcFlags
from ebpflb.reconcile.result import ApplyResult
from ebpflb.reconcile.state import Realized, RealizedState

# backend id -> timeout, for one service id
Pairs = dict[int, int]


def expected(realized: Realized) -> Pairs:
    """What one realized frontend needs in ebpflb_affpair4."""
    want = realized.desired
    if want is None or not want.affinity_timeout or not realized.entry.flags & SvcFlags.AFFINITY:
        return {}
    return {backend_id: want.affinity_timeout for backend_id in realized.backend_ids}


class AffinityMatches:
    def __init__(self) -> None:
        self._written: dict[int, Pairs] | None = None  # by service id; None: not known

    @property
    def entries(self) -> int | None:
        """Pairs written to ebpflb_affpair4 (None before the first sync read them)."""
        return None if self._written is None else sum(map(len, self._written.values()))

    def sync(
        self,
        maps: MapSet,
        state: RealizedState,
        touched: Iterable[Frontend],
        released: Iterable[int],
        result: ApplyResult,
        *,
        full: bool,
    ) -> dict[int, MapError]:
        """Write what the `touched` frontends need and drop what the service ids
        `released` (of removed frontends) had; with `full`, everything. Returns the
        service ids whose pairs could not all be written (the map is full), each with its
        error: their frontends keep working, with affinity only to the backends written,
        and the next full apply tries again."""
        table = maps.affinity_match
        if full or self._written is None:
            current: dict[int, Pairs] = {}
            for key, timeout in table.items():
                current.setdefault(key.svc_id, {})[key.backend_id] = timeout
            wanted = {r.entry.svc_id: expected(r) for r in state.frontends.values()}
            self._written = current
        else:
            wanted = {svc_id: {} for svc_id in released}
            for frontend in touched:
                realized = state.get(frontend)
                if realized is not None:
                    wanted[realized.entry.svc_id] = expected(realized)
        written = self._written
        puts: list[tuple[AffinityMatch, int]] = []
        deletes: list[AffinityMatch] = []
        for svc_id in set(wanted) | (set(written) if full else set()):
            want, have = wanted.get(svc_id, {}), written.get(svc_id, {})
            puts += [
                (AffinityMatch(svc_id, b), t) for b, t in sorted(want.items()) if have.get(b) != t
            ]
            deletes += [AffinityMatch(svc_id, b) for b in sorted(have) if b not in want]
        failures = table.put_many(puts)
        failed: dict[int, MapError] = {}
        for index, (key, timeout) in enumerate(puts):
            if index in failures:
                failed.setdefault(key.svc_id, failures[index])
            else:
                written.setdefault(key.svc_id, {})[key.backend_id] = timeout
        for key in deletes:
            table.delete(key)
            pairs = written.get(key.svc_id, {})
            pairs.pop(key.backend_id, None)
            if not pairs:
                written.pop(key.svc_id, None)
        result.count_write(table.name, len(puts) - len(failures) + len(deletes))
        return failed
