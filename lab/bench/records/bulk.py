"""`ebpflb bench bulk`'s results: bulk TCP through a NodePort with SNAT, per mode and
direction, next to plain forwarding over the same hops (see lab.bench.bulk)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lab.bench.records.compare import Machine, Verdict
from lab.bench.settings import BulkSettings, Mode


@dataclass(frozen=True)
class BulkFigure:
    """One direction through one mode: the median of the repeats."""

    gbit_s: float
    runs_gbit_s: tuple[float, ...]  # every repeat, in order
    retransmits: int  # the sender's, summed over the repeats


@dataclass(frozen=True)
class BulkResult:
    """One mode: the external client's upload and download (iperf3 -R)."""

    mode: Mode
    upload: BulkFigure  # external client -> backend
    download: BulkFigure  # backend -> external client
    # Drops the mode's datapath counted during the transfers (ebpflb: fib_fail and
    # mtu_exceeded); None where the mode has no such counters.
    dropped: int | None = None


@dataclass(frozen=True)
class BulkRun:
    KIND: ClassVar[str] = "bulk"

    machine: Machine
    settings: BulkSettings
    results: tuple[BulkResult, ...]
    targets: tuple[Verdict, ...]
    total_s: float

    def get(self, mode: Mode) -> BulkResult | None:
        return next((r for r in self.results if r.mode is mode), None)
