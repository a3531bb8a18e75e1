"""The records an apply passes between its steps: a `Plan` per frontend (what planning
decided), and an `Outcome` per plan (what writing it produced, with its `StoredTable`).
Planning, table building, writing and reporting all read them; none of those steps
imports another for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ebpflb.datapath.maps import ServiceEntry
from ebpflb.desired import DesiredFrontend, WeightedBackend
from ebpflb.errors import EbpflbError
from ebpflb.model import Frontend, IPNetwork, NamespacedName
from ebpflb.reconcile.result import Failure
from ebpflb.reconcile.state import BackendIds, Realized


class Plan(NamedTuple):
    """What planning decided for one frontend (a NamedTuple: immutable, and cheap to make
    by the hundred thousand)."""

    frontend: Frontend
    owner: NamespacedName
    want: DesiredFrontend
    current: Realized | None  # as realized before this apply
    name: str  # of the service port, "namespace/name:port"
    usable: tuple[WeightedBackend, ...]  # backends of weight > 0, which get slots
    ranges: frozenset[IPNetwork]
    svc_id: int
    ids: tuple[int, ...]  # backend id of each usable backend
    size: int  # table size; 0: the frontend refuses
    offset: int
    reuse: bool  # the table keeps its range: only changed slots are written
    added_ranges: frozenset[IPNetwork]  # source ranges counted against their maps' capacity

    @property
    def new_range(self) -> bool:
        """`offset` was allocated for this plan."""
        return bool(self.size) and not self.reuse

    def label(self) -> str:
        return f"{self.name} {self.frontend}"


class StoredTable(NamedTuple):
    """A plan's table as the pool now holds it."""

    ids: BackendIds  # the backend ids it names
    digest: bytes
    written: int  # slots written (0: the pool held it already)


@dataclass(slots=True)
class Outcome:
    """What writing one plan produced; a failure stops its later steps."""

    plan: Plan
    failure: Failure | None = None
    table: StoredTable | None = None  # None: no table, or not stored
    ranges_written: tuple[IPNetwork, ...] = ()  # allowed for this entry by step 3
    entry: ServiceEntry | None = None  # as switched to by step 4

    def fail(self, error: EbpflbError, map_name: str) -> None:
        self.failure = Failure.of(error, map_name)

    @property
    def table_ids(self) -> BackendIds:
        return self.table.ids if self.table is not None else ()

    @property
    def written(self) -> int:
        return self.table.written if self.table is not None else 0
