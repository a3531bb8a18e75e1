"""Restore from the pins: relearn the realized state and the allocators from the maps.

Run at start (a restarted agent keeps every id and range and rewrites nothing) and at
every full resync (drift repair). When the maps hold exactly what was written, everything
known still holds and is kept (`as_written`). Otherwise it is rebuilt from the maps
(`rebuild`); a frontend whose entry, name, source ranges, table and backends are still as
last written keeps what it was written for, so that the full apply after passes over it;
any other is compared with its desired state in full.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from ebpflb.datapath.maps import BackendEntry, MapSet, ServiceEntry, SlotArray, SourceRange
from ebpflb.errors import MapError
from ebpflb.model import IPNetwork
from ebpflb.reconcile.backends import Backends
from ebpflb.reconcile.space import Space
from ebpflb.reconcile.state import (
    EMPTY_TABLE,
    NO_RANGES,
    Leftovers,
    MapContents,
    Realized,
    RealizedState,
    frontend_order,
    parse_owner,
    table_digest,
    table_ids,
)


class Restored(NamedTuple):
    state: RealizedState
    backends: Backends
    space: Space
    leftovers: Leftovers


def as_written(
    contents: MapContents,
    maps: MapSet,
    state: RealizedState,
    backends: Backends,
    space: Space,
    leftovers: Leftovers,
) -> bool:
    """Whether the maps hold what was written, and nothing else: every frontend known
    (with what it was written for), with its entry, name, ranges and table."""
    if leftovers:
        return False
    if not len(contents.services) == len(contents.metas) == len(state):
        return False
    if sum(map(len, contents.ranges.values())) != space.range_count:
        return False
    if contents.backends != backends.entries:
        return False
    for frontend, entry in contents.services:
        known = state.get(frontend)
        if (
            known is None
            or known.desired is None
            or not known.owns_range
            or known.entry != entry
            or contents.metas.get(entry.svc_id) != known.name
            or contents.ranges.get(entry.svc_id, NO_RANGES) != known.ranges
        ):
            return False
        if entry.table_size:
            table = maps.slots.read(entry.table_off, entry.table_size)
            if table_digest(table) != known.digest:
                return False
    return True


def rebuild(
    contents: MapContents,
    maps: MapSet,
    previous: RealizedState,
    previous_backends: Mapping[int, BackendEntry],
    quarantined: tuple[tuple[int, int], ...],
) -> Restored:
    """Everything relearned from `contents`; `previous` and `previous_backends` (what was
    written before) tell which frontends are still exactly as written."""
    state = RealizedState()
    backends = Backends(maps.backends.name, maps.backends.capacity)
    space = Space(maps)
    leftovers = Leftovers()

    for backend_id, backend_entry in contents.backends.items():
        backends.adopt(backend_id, backend_entry)
    drifted = backends.drifted(previous_backends)

    ranges = dict(contents.ranges)
    space.count_ranges(network for networks in ranges.values() for network in networks)
    used_ids: set[int] = set()
    for frontend, entry in sorted(contents.services, key=lambda item: frontend_order(item[0])):
        if entry.svc_id in used_ids or entry.svc_id == 0:
            leftovers.stray.append(frontend)  # a duplicate id: rewritten or removed by apply
            continue
        used_ids.add(entry.svc_id)
        space.svc_ids.reserve(entry.svc_id)
        name = contents.metas.get(entry.svc_id, "")
        realized = _restored(
            maps,
            space,
            entry,
            name,
            ranges.pop(entry.svc_id, NO_RANGES),
            previous.get(frontend),
        )
        if realized.desired is not None and not drifted.isdisjoint(realized.backend_ids):
            realized.desired = None  # a backend it names was changed behind our back
        state.set(frontend, realized)
        backends.reference(realized.backend_ids)
    space.keep_quarantined(quarantined)
    backends.count_unreferenced()
    leftovers.metas = sorted(set(contents.metas) - used_ids)
    leftovers.ranges = [SourceRange(i, n) for i, nets in ranges.items() for n in nets]
    return Restored(state, backends, space, leftovers)


def _restored(
    maps: MapSet,
    space: Space,
    entry: ServiceEntry,
    name: str,
    ranges: frozenset[IPNetwork],
    before: Realized | None,
) -> Realized:
    """One frontend read back from the maps (its range reserved if it is free)."""
    table: SlotArray = EMPTY_TABLE
    owns_range = True
    if entry.table_size:
        try:
            space.slots.reserve(entry.table_off, entry.table_size)
            table = maps.slots.read(entry.table_off, entry.table_size)
        except (ValueError, MapError):
            owns_range = False  # overlaps another table: the next apply moves it
    digest = table_digest(table) if owns_range and entry.table_size else b""
    realized = Realized(entry, name, parse_owner(name), (), digest, owns_range)
    realized.ranges = ranges
    if (
        before is not None
        and before.owns_range
        and owns_range
        and (before.entry, before.name, before.ranges, before.digest)
        == (entry, name, ranges, digest)
    ):
        realized.backend_ids = before.backend_ids  # the same table: no need to scan it
        realized.desired = before.desired
    elif owns_range:
        realized.backend_ids = table_ids(table)
    return realized
