"""explain(): the steps of the query's path, in the C code's order, until one concludes."""

from __future__ import annotations

from ebpflb.datapath.maps import MapSet
from ebpflb.explain.affinity import AffinityTable
from ebpflb.explain.engine import OUTSIDE_STEPS, SOCKET_STEPS, Settings, Work
from ebpflb.explain.model import Explanation, Path, Query
from ebpflb.explain.pod import POD_STEPS

STEPS = {Path.SOCKET: SOCKET_STEPS, Path.OUTSIDE: OUTSIDE_STEPS, Path.POD: POD_STEPS}


def explain(
    maps: MapSet, query: Query, settings: Settings, affinity: AffinityTable | None = None
) -> Explanation:
    """`affinity`: the pinned ebpflb_aff4 (explain.affinity.PinnedAffinity); None: not
    read (a frontend with session affinity then says the client's entry may decide)."""
    work = Work(query, maps, settings, affinity_table=affinity)
    for step in STEPS[query.path]:
        found = step(work)
        if found is not None:
            return found
    raise AssertionError("the last step always concludes")  # pragma: no cover
