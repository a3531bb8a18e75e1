"""The plan: the desired state against the realized one, with everything that can run out
of room allocated before anything is written.

`claims` decides who gets each frontend; `Planner.plan_all` turns every frontend whose
desired state differs from what is written into a `Plan` (immutable: what planning
decided). A frontend that cannot be planned (more backends than the largest table allowed
has slots, or no room for its service id, backends, source ranges or table) fails alone:
it gives back what it took before the next frontend is planned, and is reported.
"""

from __future__ import annotations

from collections.abc import Mapping

from ebpflb import maglev
from ebpflb.desired import DesiredFrontend
from ebpflb.errors import EbpflbError, TableSizeError
from ebpflb.model import Frontend, IPNetwork, NamespacedName
from ebpflb.reconcile.backends import Backends
from ebpflb.reconcile.records import Plan
from ebpflb.reconcile.report import LOG_EACH_MAX, Reporter
from ebpflb.reconcile.result import ApplyResult, Failure
from ebpflb.reconcile.space import Space
from ebpflb.reconcile.state import (
    NO_RANGES,
    Realized,
    RealizedState,
    frontend_order,
    source_ranges,
)
from ebpflb.reconcile.state import undersized as is_undersized

Claims = dict[Frontend, tuple[NamespacedName, DesiredFrontend]]
Desired = Mapping[NamespacedName, Mapping[Frontend, DesiredFrontend]]

# struct lb_svc_val.backend_count is a __u16 (bpf/lib/structs.h).
MAX_BACKEND_COUNT = 0xFFFF


def claims(desired: Desired, state: RealizedState, report: Reporter) -> Claims:
    """Who gets each frontend; when two services claim one, the one holding it keeps it."""
    wanted: Claims = {}
    for owner in sorted(desired, key=lambda ref: (ref.namespace, ref.name)):
        for frontend, want in desired[owner].items():
            first = wanted.get(frontend)
            if first is None:
                wanted[frontend] = (owner, want)
                continue
            realized = state.get(frontend)
            if realized is not None and realized.owner == owner:
                report.conflict(frontend, first[0], owner)
                wanted[frontend] = (owner, want)
            else:
                report.conflict(frontend, owner, first[0])
    return wanted


class Planner:
    def __init__(
        self,
        state: RealizedState,
        backends: Backends,
        space: Space,
        report: Reporter,
        *,
        max_table_size: int,
        slots_map: str,
    ) -> None:
        self.state = state
        self.backends = backends
        self.space = space
        self.report = report
        self.max_table_size = max_table_size
        self._slots_map = slots_map  # what a table-size failure is counted under

    def plan_all(self, wanted: Claims, desired: Desired, result: ApplyResult) -> list[Plan]:
        """A plan for every claimed frontend not already as desired, in frontend order."""
        plans = []
        undersized = []
        realized = self.state.frontends
        for frontend, (owner, want) in sorted(
            wanted.items(), key=lambda item: frontend_order(item[0])
        ):
            current = realized.get(frontend)
            if (
                current is not None
                and current.owner not in (None, owner)
                and current.owner not in desired
            ):
                self.report.conflict(frontend, owner, current.owner)
                continue
            if current is not None and current.desired == want and current.owns_range:
                result.unchanged += 1
                continue
            try:
                plan = self.plan(frontend, owner, want, current)
            except EbpflbError as exc:
                failure = Failure.of(exc, self._slots_map)
                self.report.failed(str(want.service), frontend, owner, failure)
                continue
            plans.append(plan)
            if plan.size < maglev.MIN_SLOTS_PER_BACKEND * len(plan.usable) and (
                current is None or not is_undersized(current.entry)
            ):
                undersized.append(plan)  # warned about when it becomes so
        self.backends.planned()
        if undersized:
            verbose = len(plans) <= LOG_EACH_MAX
            self.report.undersized(undersized, self.max_table_size, verbose=verbose)
        return plans

    def plan(
        self,
        frontend: Frontend,
        owner: NamespacedName,
        want: DesiredFrontend,
        current: Realized | None,
    ) -> Plan:
        """Allocate the frontend's service id, backend ids, source ranges and slot range;
        on failure give back whatever it took and raise."""
        name = str(want.service)
        usable = tuple(b for b in want.backends if b.weight > 0)
        ranges = source_ranges(want.source_ranges)

        def label() -> str:
            return f"{name} {frontend}"

        count = len(usable)
        if not count:
            size = 0
        elif count <= self.max_table_size and count <= MAX_BACKEND_COUNT:
            current_size = current.entry.table_size if current is not None else 0
            size = maglev.table_size_for(
                count, max_size=self.max_table_size, current=current_size or None
            )
        else:
            raise self._too_many(count)
        space, backends = self.space, self.backends
        svc_id = current.entry.svc_id if current is not None else 0
        added: frozenset[IPNetwork] = frozenset()
        mark = backends.mark()
        try:
            if current is None:
                svc_id = space.svc_ids.allocate(label)
            ids = tuple(backends.id_for(b.backend, name) for b in usable)
            if ranges:
                new = ranges - (current.ranges if current is not None else NO_RANGES)
                space.reserve_ranges(new, label)
                added = new
            reuse = bool(
                current is not None
                and current.owns_range
                and size
                and current.entry.table_size == size
            )
            if reuse and current is not None:
                offset = current.entry.table_off
            elif size:
                offset = space.allocate_slots(size, label)
            else:
                offset = 0
        except EbpflbError:
            backends.give_back_since(mark)
            if current is None and svc_id:
                space.svc_ids.release(svc_id)
            space.release_ranges(added)
            raise
        return Plan(
            frontend,
            owner,
            want,
            current,
            name,
            usable,
            ranges,
            svc_id,
            ids,
            size,
            offset,
            reuse,
            added,
        )

    def give_back(self, plan: Plan) -> None:
        """What a plan allocated, when a later step failed (nothing refers to it). New
        backend ids are left to `Backends.collect` (another plan may have come to use them)."""
        if plan.new_range:
            self.space.slots.release(plan.offset, plan.size)
        if plan.current is None and plan.svc_id:
            self.space.svc_ids.release(plan.svc_id)
        self.space.release_ranges(plan.added_ranges)

    def _too_many(self, backends: int) -> TableSizeError:
        """More backends than any table allowed can give a slot each (Maglev needs M >= N)."""
        limit = self.max_table_size
        if backends > limit:
            bigger = next((m for m in maglev.TABLE_SIZES if m >= backends), None)
            fix = (
                f"raise --maglev-max-table-size to {bigger} or more"
                if bigger is not None
                else "no Maglev table size holds them: split the service"
            )
            return TableSizeError(backends, limit, "--maglev-max-table-size", fix)
        return TableSizeError(
            backends,
            MAX_BACKEND_COUNT,
            "a frontend's backend count is 16 bits in the datapath",
            "split the service",
        )
