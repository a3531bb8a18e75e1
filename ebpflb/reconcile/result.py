"""What an apply did (`ApplyResult`), and why a frontend could not be programmed
(`Failure`: the error, the map or limit it hit, and the reason label it is counted under).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ebpflb.errors import EbpflbError, MapFullError, TableSizeError
from ebpflb.model import NamespacedName


class Reason(enum.StrEnum):
    """`reason` label of ebpflb_map_errors_total."""

    FULL = "full"  # a map or the slot pool has no room (MapFullError)
    TABLE_SIZE = "table_size"  # more backends than the largest table allowed has slots
    ERROR = "error"  # the kernel refused a write


@dataclass(frozen=True, slots=True)
class Failure:
    """Why one frontend is not programmed; `map_name` is the map (or the limit's map)."""

    error: EbpflbError
    map_name: str
    reason: Reason

    @classmethod
    def of(cls, error: EbpflbError, map_name: str) -> Failure:
        """`map_name`: the map the failed step wrote; a full map names itself."""
        if isinstance(error, MapFullError):
            return cls(error, error.map_name, Reason.FULL)
        if isinstance(error, TableSizeError):
            return cls(error, map_name, Reason.TABLE_SIZE)
        return cls(error, map_name, Reason.ERROR)


@dataclass(slots=True)
class ApplyResult:
    added: int = 0
    updated: int = 0
    removed: int = 0
    unchanged: int = 0
    slots_written: int = 0
    # Entries written or deleted, by map. In a full resync every write is a repair: the
    # realized state was just re-read from the kernel, so only drift differs.
    writes: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    failed: set[NamespacedName] = field(default_factory=set)

    @property
    def changed(self) -> int:
        return self.added + self.updated + self.removed

    def count_write(self, map_name: str, count: int = 1) -> None:
        if count:
            self.writes[map_name] = self.writes.get(map_name, 0) + count
