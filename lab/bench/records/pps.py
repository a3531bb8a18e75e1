"""`ebpflb bench pps`'s results: packets per second through a UDP NodePort on one node
core, per mode, next to plain forwarding over the same hops (see lab.bench.pps)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import ClassVar

from lab.bench.records.compare import Machine, ProgramTime, Verdict
from lab.bench.settings import Mode, PpsSettings


@dataclass(frozen=True)
class Flood:
    """One measuring window of the generator's traffic."""

    seconds: float
    offered_pps: float  # frames the generator handed to its interface
    delivered_pps: float  # UDP that reached the backends translated (to the target port)
    misdelivered: int  # UDP that reached the backends to another port: must be 0
    node_busy: float  # the node core's busy share over the window (0..1)
    generator_busy: float  # the generator core's

    @property
    def ns_per_packet(self) -> float | None:
        """The node core's time per delivered packet."""
        if self.delivered_pps <= 0:
            return None
        return self.node_busy * 1e9 / self.delivered_pps


@dataclass(frozen=True)
class FixedRate:
    """The node core at one offered rate, its idle share just before subtracted."""

    rate: int  # packets/s asked of the generator
    flood: Flood
    idle_busy: float  # the node core's busy share over a window with no traffic

    @property
    def node_cpu(self) -> float:
        """The share of the node core the traffic took (0..1)."""
        return max(0.0, self.flood.node_busy - self.idle_busy)

    @property
    def ns_per_packet(self) -> float | None:
        if self.flood.delivered_pps <= 0:
            return None
        return self.node_cpu * 1e9 / self.flood.delivered_pps


@dataclass(frozen=True)
class PpsResult:
    """One mode: the saturation windows, the fixed rates, and (ebpflb) what its NodePort
    programs took per delivered packet under the first fixed rate, timed by the kernel
    (bpf_stats; ProgramTime's exchange is one packet here)."""

    mode: Mode
    saturation: tuple[Flood, ...]
    rates: tuple[FixedRate, ...]
    programs: tuple[ProgramTime, ...] = ()

    @property
    def delivered_pps(self) -> float:
        """The figure: the median window's delivered packets/s at saturation."""
        return statistics.median(f.delivered_pps for f in self.saturation)

    @property
    def node_busy(self) -> float:
        return statistics.median(f.node_busy for f in self.saturation)

    @property
    def misdelivered(self) -> int:
        return sum(f.misdelivered for f in (*self.saturation, *(r.flood for r in self.rates)))

    @property
    def program_ns_per_packet(self) -> float | None:
        if not self.programs:
            return None
        return sum(p.ns_per_exchange for p in self.programs)


@dataclass(frozen=True)
class PpsRun:
    KIND: ClassVar[str] = "pps"

    machine: Machine
    settings: PpsSettings
    results: tuple[PpsResult, ...]
    targets: tuple[Verdict, ...]
    total_s: float

    def get(self, mode: Mode) -> PpsResult | None:
        return next((r for r in self.results if r.mode is mode), None)
