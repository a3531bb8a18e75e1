"""Restore after a crash part-way through a sync (the pins hold what a killed agent left),
on the fake maps: the states a SIGKILL can leave between two of the reconciler's writes,
and what the next agent makes of them. tests/kernel/agent/test_crash.py kills the real agent."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from ebpflb.datapath.maps import SlotWrite, SourceRange
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.desired import DesiredFrontend, WeightedBackend
from ebpflb.errors import MapError
from ebpflb.model import Backend, Frontend, NamespacedName, Proto, ServicePortName, SvcFlags
from ebpflb.reconcile import Reconciler

OLD = NamespacedName("default", "old")
NEW = NamespacedName("default", "new")


def lb(ip: str, owner: NamespacedName, *ranges: str) -> tuple[Frontend, DesiredFrontend]:
    frontend = Frontend(IPv4Address(ip), 80, Proto.TCP)
    backend = WeightedBackend(Backend(IPv4Address("10.244.1.11"), 8080, Proto.TCP))
    want = DesiredFrontend(
        frontend,
        ServicePortName(owner, "http", Proto.TCP),
        SvcFlags.LOADBALANCER | SvcFlags.SOURCE_RANGES,
        (backend,),
        tuple(IPv4Network(r) for r in ranges),
    )
    return frontend, want


def test_source_ranges_of_a_removal_cut_short_never_reach_the_frontend_taking_its_id() -> None:
    """Killed while removing a frontend: its entry is gone, its name and source ranges
    are not. The next agent gives the free service id to a new frontend; the dead one's
    ranges must not widen who may reach the new one (a firewall hole)."""
    maps = FakeMapSet(max_services=8, max_backends=64, slot_pool_size=4096)
    old_fe, old = lb("203.0.113.1", OLD, "198.51.100.0/24")
    Reconciler(maps).apply({OLD: {old_fe: old}})
    svc_id = maps.services.data[old_fe].svc_id
    maps.services.delete(old_fe)  # the removal's first write, then SIGKILL

    new_fe, new = lb("203.0.113.2", NEW, "192.0.2.0/24")
    restarted = Reconciler(maps)
    restarted.restore()
    result = restarted.apply({NEW: {new_fe: new}}, full=True)
    assert result.errors == []
    assert maps.services.data[new_fe].svc_id == svc_id  # the id came free, and was taken
    assert set(maps.source_ranges4.data) == {SourceRange(svc_id, IPv4Network("192.0.2.0/24"))}
    assert maps.service_meta.data == {svc_id: "default/new:http"}
    # What the agent counts is what the map holds.
    assert restarted.space.range_count == len(maps.source_ranges4.data)


# ---- every crash point of one sync --------------------------------------------------------


class Killed(BaseException):
    """SIGKILL: nothing after it runs (not an Exception, so no handler of the agent's sees it)."""


def die_after(maps: FakeMapSet, budget: int) -> list[int]:
    """Make `maps` kill the writer after `budget` element writes or deletes. A batch dies
    part-way like a sequence of single writes; a slot write that dies has stored the first
    half of its slots (the pool is written as memory: a kill can land inside a copy)."""
    left = [budget]

    def tick() -> None:
        if left[0] <= 0:
            raise Killed
        left[0] -= 1

    for kv in (maps.services, maps.backends, maps.service_meta, maps.source_ranges):
        put, delete = kv.put, kv.delete

        def guarded_put(key: object, value: object, put: Any = put) -> None:
            tick()
            put(key, value)

        def guarded_delete(key: object, delete: Any = delete) -> bool:
            tick()
            return bool(delete(key))

        kv.put = guarded_put  # type: ignore[method-assign]
        kv.delete = guarded_delete  # type: ignore[method-assign]
    pool = maps.slots
    write_many = pool.write_many

    def guarded_write_many(writes: Sequence[SlotWrite]) -> dict[int, MapError]:
        for write in writes:
            try:
                tick()
            except Killed:
                size = len(write.table) if write.changed is None else len(write.changed)
                half = write.changed[: size // 2] if write.changed is not None else None
                table = write.table if half is not None else write.table[: size // 2 // 2 * 2]
                write_many([SlotWrite(write.offset, table, half)])
                raise
            write_many([write])
        return {}

    pool.write_many = guarded_write_many  # type: ignore[method-assign]
    return left


def revive(maps: FakeMapSet) -> None:
    """The maps as a new agent finds them: the kill switch removed."""
    for kv in (maps.services, maps.backends, maps.service_meta, maps.source_ranges):
        del kv.put, kv.delete  # type: ignore[attr-defined]
    del maps.slots.write_many  # type: ignore[attr-defined]


def generation(gen: int) -> dict[NamespacedName, dict[Frontend, DesiredFrontend]]:
    """Thirty ClusterIP frontends; from one generation to the next some go, some come,
    endpoints shift (tables rewritten in place) and counts change (tables move)."""
    wanted: dict[NamespacedName, dict[Frontend, DesiredFrontend]] = {}
    for k in range(30):
        if (k + gen) % 5 == 0:
            continue
        owner = NamespacedName("crash", f"svc-{k}")
        frontend = Frontend(IPv4Address(f"10.96.1.{k + 1}"), 80, Proto.TCP)
        count = 1 + (k + (gen if k % 3 == 0 else 0)) % 3  # a third change count
        bes = tuple(
            WeightedBackend(
                Backend(IPv4Address(f"10.244.{k}.{(j + gen) % 50 + 1}"), 8080, Proto.TCP)
            )
            for j in range(count)
        )
        ranges = (IPv4Network(f"198.51.{k}.0/24"),) if k % 4 == 0 and gen % 2 else ()
        flags = SvcFlags.CLUSTER_IP | (SvcFlags.SOURCE_RANGES if ranges else SvcFlags(0))
        want = DesiredFrontend(
            frontend, ServicePortName(owner, "http", Proto.TCP), flags, bes, ranges
        )
        wanted[owner] = {frontend: want}
    return wanted


def consistency_errors(maps: FakeMapSet) -> list[str]:
    """What a datapath reading the maps now could trip over (as tests/kernel/agent/test_crash.py
    checks the real maps)."""
    errors = []
    spans = []
    ids = set()
    for frontend, entry in maps.services.data.items():
        if entry.svc_id in ids:
            errors.append(f"{frontend}: svc_id {entry.svc_id} twice")
        ids.add(entry.svc_id)
        if entry.svc_id not in maps.service_meta.data:
            errors.append(f"{frontend}: no name")
        if not entry.table_size:
            continue
        table = maps.slots.read(entry.table_off, entry.table_size)
        missing = {int(i) for i in table} - set(maps.backends.data)
        if missing:
            errors.append(f"{frontend}: slots name missing backends {sorted(missing)}")
        spans.append((entry.table_off, entry.table_size, frontend))
    spans.sort()
    for (off_a, size_a, fe_a), (off_b, _, fe_b) in itertools.pairwise(spans):
        if off_a + size_a > off_b:
            errors.append(f"{fe_a} and {fe_b} share slots")
    return errors


def programmed(maps: FakeMapSet) -> dict[Frontend, tuple[str, frozenset[str], frozenset[str]]]:
    """Frontend -> (name, backends its table names, source ranges)."""
    ranges: dict[int, set[str]] = {}
    for source_range in maps.source_ranges4.data:
        ranges.setdefault(source_range.svc_id, set()).add(str(source_range.network))
    found = {}
    for frontend, entry in maps.services.data.items():
        table = maps.slots.read(entry.table_off, entry.table_size)
        names = frozenset(str(maps.backends.data[int(i)].backend) for i in set(table.tolist()))
        found[frontend] = (
            maps.service_meta.data[entry.svc_id],
            names,
            frozenset(ranges.get(entry.svc_id, ())),
        )
    return found


def expected(
    wanted: dict[NamespacedName, dict[Frontend, DesiredFrontend]],
) -> dict[Frontend, tuple[str, frozenset[str], frozenset[str]]]:
    return {
        frontend: (
            str(want.service),
            frozenset(str(b.backend) for b in want.backends),
            frozenset(str(n) for n in want.source_ranges),
        )
        for frontends in wanted.values()
        for frontend, want in frontends.items()
    }


def new_maps() -> FakeMapSet:
    maps = FakeMapSet(max_services=64, max_backends=256, slot_pool_size=1 << 14)
    Reconciler(maps).apply(generation(1), full=True)
    return maps


def sync(maps: FakeMapSet, gen: int) -> Reconciler:
    """A (re)started agent's first sync."""
    rec = Reconciler(maps)
    rec.restore()
    rec.apply(generation(gen), full=True)
    return rec


def test_a_kill_after_any_write_of_a_sync_leaves_consistent_maps_and_the_restart_converges() -> (
    None
):
    """Every crash point of a sync from generation 1 to 2 (after the 0th, 1st, ... write):
    the maps are consistent at the kill; the next agent (restore, full apply) programs
    generation 3 exactly, keeps no backend nobody names, and its allocators account for
    exactly what is in the maps."""
    maps = new_maps()
    left = die_after(maps, 10**9)
    sync(maps, 2)
    total = 10**9 - left[0]  # element writes and deletes of the sync
    assert total > 50  # a sync worth killing: adds, removals, moves, in-place rewrites
    for budget in range(total + 1):
        maps = new_maps()
        die_after(maps, budget)
        with contextlib.suppress(Killed):
            sync(maps, 2)
        revive(maps)
        assert consistency_errors(maps) == [], f"killed after write {budget}"

        restarted = Reconciler(maps)
        restarted.restore()
        result = restarted.apply(generation(3), full=True)
        assert result.errors == [], budget
        assert programmed(maps) == expected(generation(3)), f"killed after write {budget}"
        named = {
            int(i)
            for e in maps.services.data.values()
            for i in maps.slots.read(e.table_off, e.table_size)
        }
        assert set(maps.backends.data) == named, f"backends nobody names ({budget})"
        assert restarted.space.range_count == len(maps.source_ranges4.data), budget
        restarted.apply(generation(3), full=True)  # the quarantined ranges come free
        used = sum(-(-e.table_size // 2) * 2 for e in maps.services.data.values())
        assert restarted.space.slots.used == used, f"slot ranges leaked ({budget})"
        assert len(restarted.space.svc_ids) == len(maps.services.data), budget
