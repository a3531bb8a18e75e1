"""What each `ebpflb bench` sub-command measures and how much: the defaults, --quick, limits.

Kept apart from the benchmarks themselves so the command line can build them without
importing the measuring code (BCC, the fake API server).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ebpflb.errors import ConfigError
from lab.bench import scenario


class Mode(StrEnum):
    """A way of serving the bench's services; its value is the name in tables and reports."""

    NONE = "none"  # no proxy: the client connects straight to a backend (the floor)
    IPTABLES_LEGACY = "iptables-legacy"  # also the iptables binaries' names
    IPTABLES_NFT = "iptables-nft"
    NFTABLES = "nftables"
    EBPFLB = "ebpflb"
    EBPFLB_XDP = "ebpflb-xdp"  # measured with ebpflb (its NodePort path in XDP), not chosen
    # bench bulk's floor for XDP: forwarding with an XDP_PASS program on the node's
    # interfaces (a veth running XDP stops aggregating what its peer sends).
    NONE_XDP = "none-xdp-pass"


MODES = (Mode.NONE, Mode.IPTABLES_LEGACY, Mode.IPTABLES_NFT, Mode.NFTABLES, Mode.EBPFLB)
"""The modes --modes chooses from, in the tables' order."""
KUBE_PROXY_MODES = (Mode.IPTABLES_LEGACY, Mode.IPTABLES_NFT, Mode.NFTABLES)
IPTABLES_MODES = (Mode.IPTABLES_LEGACY, Mode.IPTABLES_NFT)


def parse_modes(text: str) -> tuple[Mode, ...]:
    """--modes: comma-separated mode names."""
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in {m.value for m in MODES}]
    if unknown:
        raise ConfigError(f"unknown mode {unknown[0]!r}: one of {', '.join(MODES)}")
    return tuple(Mode(name) for name in names)


@dataclass(frozen=True)
class CompareSettings:
    """`ebpflb bench compare`: ebpflb against kube-proxy's modes."""

    services: tuple[int, ...] = (100, 1000, 10_000, 20_000, 100_000)
    modes: tuple[Mode, ...] = MODES
    endpoints: int = 3
    # Latency: interleaved rounds of one batch per target and mode. Many short batches,
    # because this VM's speed changes in steps lasting milliseconds (whole batches ran 25%
    # faster or slower, whatever the mode): each mode must sample the same mixture.
    rounds: int = 20
    batch: int = 150  # new connections per batch
    rate_seconds: float = 1.5
    rate_repeats: int = 3
    # Request/response through the ClusterIP (TCP_RR and TCP_CRR with 1 and 32 flows, each
    # run rate_seconds, rate_repeats times), at these N only: ~20 s per mode.
    request_response_at: tuple[int, ...] = (10_000,)
    changes: int = 3  # single-endpoint changes timed per mode
    # kube-proxy modes stop here: kube-proxy's own scalability target is far below 100k.
    kube_proxy_max_services: int = 20_000
    # iptables-nft's restore grows quadratically: 65 s at 10k, 7 minutes at 20k (measured),
    # which alone would take the full run past 15 minutes.
    iptables_nft_max_services: int = 10_000
    xdp: bool = True
    # Services with session affinity and Local traffic policies (scenario.Mix); none by
    # default, so the published figures keep measuring the same services.
    mix: tuple[scenario.Mix, ...] = ()
    # The IP family of every address in the run (--family): kube-proxy's IPv4 or IPv6 proxier
    # (iptables or ip6tables, table ip or ip6), ebpflb's IPv4 or IPv6 datapath.
    family: scenario.Family = scenario.Family.IPV4
    # Longest wait for the machine to go idle before each phase (a deleted namespace's rules
    # are freed in the background); a test on a busy machine measures nothing and waits less.
    quiet_timeout: float = 120.0

    def validate(self) -> None:
        for mode in self.modes:
            if mode not in MODES:
                raise ConfigError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
        if not self.services:
            raise ConfigError("--services: at least one N")
        for n in self.services:
            # raises with the limits
            scenario.bench_services(n, self.endpoints, mix=self.mix, family=self.family)
        if self.rounds < 1 or self.batch < 10 or self.rate_seconds <= 0 or self.changes < 1:
            raise ConfigError("rounds >= 1, batch >= 10, rate seconds > 0, changes >= 1")
        if self.rate_repeats < 1:
            raise ConfigError("rate repeats >= 1")

    def runs(self, mode: Mode, n: int) -> bool:
        if mode in (Mode.NONE, Mode.EBPFLB):
            return True
        if mode is Mode.IPTABLES_NFT and n > self.iptables_nft_max_services:
            return False
        return n <= self.kube_proxy_max_services


COMPARE_QUICK = CompareSettings(
    services=(100, 1000),
    rounds=8,
    batch=100,
    rate_seconds=1.0,
    rate_repeats=2,
    request_response_at=(1000,),
    changes=2,
)


BULK_MODES = (
    Mode.NONE,
    Mode.NONE_XDP,
    Mode.IPTABLES_LEGACY,
    Mode.IPTABLES_NFT,
    Mode.NFTABLES,
    Mode.EBPFLB,
    Mode.EBPFLB_XDP,
)
"""What `bench bulk --modes` chooses from, in its table's order."""


def parse_bulk_modes(text: str) -> tuple[Mode, ...]:
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in {m.value for m in BULK_MODES}]
    if unknown:
        raise ConfigError(f"unknown mode {unknown[0]!r}: one of {', '.join(BULK_MODES)}")
    return tuple(Mode(name) for name in names)


@dataclass(frozen=True)
class BulkSettings:
    """`ebpflb bench bulk`: one TCP transfer each way through a NodePort with SNAT (GRO on,
    as on a real NIC), per mode, against forwarding over the same hops."""

    modes: tuple[Mode, ...] = BULK_MODES
    seconds: int = 3  # per transfer (iperf3 counts whole seconds)
    repeats: int = 3  # per direction and mode: the median is the figure
    family: scenario.Family = scenario.Family.IPV4
    quiet_timeout: float = 120.0

    def validate(self) -> None:
        for mode in self.modes:
            if mode not in BULK_MODES:
                raise ConfigError(f"unknown mode {mode!r}: one of {', '.join(BULK_MODES)}")
        if self.seconds < 1 or self.repeats < 1:
            raise ConfigError("bulk: seconds >= 1 (whole seconds), repeats >= 1")


BULK_QUICK = BulkSettings(seconds=1, repeats=1)


PPS_MODES = BULK_MODES
"""What `bench pps --modes` chooses from, in its table's order."""


@dataclass(frozen=True)
class PpsSettings:
    """`ebpflb bench pps`: a packet generator (trafgen) floods a UDP NodePort with minimum
    frames from the external namespace; the node's receive queue runs on one core of its
    own. Per mode: packets per second delivered at saturation, and the node core's busy
    share at fixed offered rates."""

    modes: tuple[Mode, ...] = PPS_MODES
    seconds: float = 5.0  # per saturation measurement
    repeats: int = 3  # saturation measurements per mode: the median is the figure
    rates: tuple[int, ...] = (100_000, 300_000)  # offered packets/s for the CPU figures
    rate_seconds: float = 3.0  # per fixed rate
    flows: int = 256  # distinct source ports, as many conntrack entries in every mode
    family: scenario.Family = scenario.Family.IPV4
    quiet_timeout: float = 120.0

    def validate(self) -> None:
        for mode in self.modes:
            if mode not in PPS_MODES:
                raise ConfigError(f"unknown mode {mode!r}: one of {', '.join(PPS_MODES)}")
        if self.seconds <= 0 or self.rate_seconds <= 0 or self.repeats < 1:
            raise ConfigError("pps: seconds > 0, rate seconds > 0, repeats >= 1")
        if not self.rates or any(rate < 1 for rate in self.rates):
            raise ConfigError("pps: one offered rate at least, each at least 1 packet/s")
        if not 1 <= self.flows <= 65_536 - 1024:
            raise ConfigError("pps: flows between 1 and 64,512 (source ports 1024 and up)")


PPS_QUICK = PpsSettings(seconds=1.0, repeats=1, rates=(50_000,), rate_seconds=1.0)


class SyncSource(StrEnum):
    """Where `bench sync`'s agent reads the services from."""

    API = "api"  # the fake API server (`ebpflb run --kubeconfig`)
    MANIFESTS = "manifests"  # one file of 2 x N documents (`ebpflb run --manifests`)


@dataclass(frozen=True)
class SyncSettings:
    """`ebpflb bench sync`: the agent's control plane fed by the Kubernetes API (or by a
    manifest file)."""

    services: int = 10_000
    endpoints: int = 3
    changes: int = 5  # single-slice changes timed
    # A full resync is timed once: the bench waits up to one period for it.
    sync_period: float = 15.0
    # The agent's --min-sync-period. Its default (0.5 s, kube-proxy's minSyncPeriod idea)
    # alone would put a churned change's p99 near 0.5 s: every change waiting for the next
    # allowed sync. An ebpflb sync costs O(changed) (a few ms for 100 changes), so a
    # cluster with sustained churn runs it at 50 ms: 20 syncs a second at most, each
    # coalescing ~50 changes at 1,000/s, which is what the churn target is judged at.
    min_sync_period: float = 0.05
    # Sustained churn: endpoint changes per second written for churn_seconds (0: none),
    # the latency of a random churn_sample share of them measured.
    churn_rate: int = 1000
    churn_seconds: float = 10.0
    churn_sample: float = 0.1
    source: SyncSource = SyncSource.API
    # More flags for `ebpflb run` (e.g. --per-service-metrics=false), after the bench's own.
    agent_args: tuple[str, ...] = ()

    def validate(self) -> None:
        scenario.bench_services(self.services, self.endpoints)  # raises with the limits
        if self.changes < 1:
            raise ConfigError("--changes must be at least 1")
        if self.sync_period <= 0 or not 0 < self.min_sync_period < self.sync_period:
            raise ConfigError("0 < min sync period < sync period")
        if self.churn_rate < 0 or self.churn_seconds < 0 or not 0 < self.churn_sample <= 1:
            raise ConfigError("--churn-rate >= 0, --churn-seconds >= 0, 0 < sample share <= 1")
        # The churn must end before the next periodic resync: the bench starts it right
        # after one, and says so when one fell inside anyway.
        if self.churn_rate and self.churn_seconds >= self.sync_period - 1:
            raise ConfigError(
                f"--churn-seconds {self.churn_seconds:g} must end a second before the next"
                f" full resync (sync period {self.sync_period:g} s)"
            )

    @property
    def churn(self) -> bool:
        return self.churn_rate > 0 and self.churn_seconds > 0


SYNC_QUICK = SyncSettings(services=1000, changes=3, sync_period=5.0, churn_seconds=3.0)


@dataclass(frozen=True)
class MaglevSettings:
    """`ebpflb bench maglev`: how often each figure is measured."""

    timing_repeats: int = 9  # build timings: the median of this many
    removals: int = 30  # random backend sets per disruption figure
    scale_repeats: int = 3  # the 10,000-table build

    @property
    def quick(self) -> bool:
        return self == MAGLEV_QUICK


MAGLEV_QUICK = MaglevSettings(timing_repeats=3, removals=5, scale_repeats=1)
