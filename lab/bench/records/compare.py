"""`ebpflb bench compare`'s results: per N and mode, the data plane, the control plane and
its memory; the verdicts on the targets; the machine and settings of the run."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from lab.bench.records.agent import AgentStartup
from lab.bench.settings import CompareSettings, Mode


class Target(StrEnum):
    """Which service a latency batch connects to."""

    FIRST = "first"
    LAST = "last"  # the NodePort service, behind all the others in iptables' lists
    RANDOM = "random"  # a uniformly random one of the N per connection


@dataclass(frozen=True)
class Machine:
    kernel: str
    cpu: str
    cpus: int
    memory_gib: float
    iptables: str
    nft: str
    date: str = ""


# ---- data plane ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LatencySummary:
    """connect() latency to one target over all batches; no percentiles without samples."""

    samples: int
    errors: int
    p50_us: float | None = None
    p99_us: float | None = None
    mean_us: float | None = None


@dataclass(frozen=True)
class ConnectLatency:
    first: LatencySummary
    last: LatencySummary
    random: LatencySummary
    first_error: str | None = None  # the first failed connect's error, if any failed

    def of(self, target: Target) -> LatencySummary:
        return {Target.FIRST: self.first, Target.LAST: self.last, Target.RANDOM: self.random}[
            target
        ]

    @property
    def errors(self) -> int:
        return self.first.errors + self.last.errors + self.random.errors


@dataclass(frozen=True)
class Rate:
    """Connections (or request/response exchanges) per second: the median of the runs."""

    per_s: float
    runs: tuple[float, ...]
    errors: int
    first_error: str | None = None


class Exchange(StrEnum):
    """How a request/response flow connects (netperf's names, as Cilium's benchmarks)."""

    RR = "RR"  # one long-lived connection per flow, a request and response after another
    CRR = "CRR"  # a new connection for each request


@dataclass(frozen=True)
class RequestResponse:
    """Transactions per second through the ClusterIP (the last service) from the node's
    client: a 16-byte request and its response each, `flows` at once (lab.bench.loadgen)."""

    exchange: Exchange
    flows: int
    rate: Rate


@dataclass(frozen=True)
class ProgramCost:
    """What one packet on one path cost one of ebpflb's programs, timed by the kernel
    (BPF_PROG_TEST_RUN on the running agent's program and maps: lab.bench.progcost)."""

    program: str  # the C entry point (ebpflb_np_in, ebpflb_np_xdp)
    path: str  # "new flow (SYN)", "known flow (ACK)", "not a NodePort"
    verdict: str  # what the program returned on every run (REDIRECT, OK, PASS, ...)
    runs: int
    median_ns: int  # of single runs, each on a fresh copy of the frame
    p10_ns: int
    repeat_mean_ns: int | None  # mean of one call's repeated runs (unchanged frames only)
    instructions: int  # the program's, after the verifier (xlated)
    jited_bytes: int


@dataclass(frozen=True)
class ProgramTime:
    """One of ebpflb's programs over a NodePort run with kernel.bpf_stats_enabled: its time
    and runs per request/response exchange (every interface it is attached to)."""

    program: str
    ns_per_exchange: float
    runs_per_exchange: float


@dataclass(frozen=True)
class DataPlane:
    latency: ConnectLatency | None = None
    connections: Rate | None = None  # new connections/s to the last service
    nodeport: Rate | None = None  # NodePort exchanges/s from the external namespace
    # Why `nodeport` is missing where the mode has a NodePort path (e.g. IPv6 before the
    # datapath translates it): the table shows "-" and the report says this.
    nodeport_not_measured: str | None = None
    # The same ClusterIP figures from a pod behind the node (its own namespace and link):
    # kube-proxy's PREROUTING rules, and ebpflb's per-packet path on the pod's interface
    # (the client in no socket-LB cgroup). None in reports from before it was measured.
    pod_latency: ConnectLatency | None = None
    pod_connections: Rate | None = None
    # ebpflb's programs per packet (BPF_PROG_TEST_RUN); () for kube-proxy's modes and in
    # reports from before it was measured.
    program_costs: tuple[ProgramCost, ...] = ()
    # ebpflb's NodePort programs per exchange in one more NodePort run, with bpf_stats on.
    nodeport_program_time: tuple[ProgramTime, ...] = ()
    # RR and CRR at 1 and 32 flows, where the run measured them (settings.request_response_at).
    request_response: tuple[RequestResponse, ...] = ()


# ---- control plane ------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelMemory:
    """What the rules or maps cost the kernel."""

    cgroup_bytes: int | None = None  # kernel memory charged to the loader's memory cgroup
    bpf_map_bytes: int | None = None  # bpftool's figure for the agent's pinned maps


@dataclass(frozen=True)
class RulesLoad:
    """How a kube-proxy mode's full ruleset was loaded."""

    command: str
    input_bytes: int
    rules: int | None = None  # iptables: -A lines


@dataclass(frozen=True)
class ControlPlane:
    program_s: float  # all N services from nothing
    program_cpu_s: float | None = None
    change_s: tuple[float, ...] = ()  # one endpoint change each
    change_cpu_s: tuple[float, ...] = ()
    memory: KernelMemory = field(default_factory=KernelMemory)
    rules: RulesLoad | None = None  # kube-proxy modes
    agent: AgentStartup | None = None  # ebpflb


# ---- a run --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModeResult:
    mode: Mode
    data: DataPlane = field(default_factory=DataPlane)
    control: ControlPlane | None = None
    phase_s: float | None = None  # the mode's whole phase, set-up to clean-up
    # False: measured only as ebpflb's reference (--modes without "none").
    listed: bool = True


@dataclass(frozen=True)
class SizeResult:
    """Every mode measured at one N."""

    services: int
    modes: tuple[ModeResult, ...]

    def get(self, mode: Mode) -> ModeResult | None:
        return next((m for m in self.modes if m.mode is mode), None)


@dataclass(frozen=True)
class Verdict:
    """One target judged at one N: met or missed, with the figures; `ok` None: not measured
    in this run (`bench sync` lists every target, saying which it could not judge)."""

    target: str
    services: int
    ok: bool | None
    detail: str

    @property
    def outcome(self) -> str:
        return "not measured" if self.ok is None else "met" if self.ok else "MISSED"


@dataclass(frozen=True)
class CompareRun:
    KIND: ClassVar[str] = "compare"

    machine: Machine
    settings: CompareSettings
    sizes: tuple[SizeResult, ...]
    total_s: float
    problems: tuple[str, ...] = ()
    targets: tuple[Verdict, ...] = ()

    def results(self) -> Iterator[tuple[int, ModeResult]]:
        """(N, mode result) by N, then in the order measured."""
        for size in sorted(self.sizes, key=lambda s: s.services):
            for result in size.modes:
                yield size.services, result
