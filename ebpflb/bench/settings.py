"""What `ebpflb bench` measures and how much: the defaults, --quick, their limits.

Kept apart from the benchmark itself so the command line can build it without importing
the measuring code.
"""

from __future__ import annotations

from dataclasses import dataclass

from ebpflb.bench import scenario
from ebpflb.errors import ConfigError

MODES = ("none", "iptables-legacy", "iptables-nft", "nftables", "ebpflb")


@dataclass(frozen=True)
class Settings:
    services: tuple[int, ...] = (100, 1000, 10_000, 20_000, 100_000)
    modes: tuple[str, ...] = MODES
    endpoints: int = 3
    # Latency: interleaved rounds of one batch per target and mode. Many short batches,
    # because this VM's speed changes in steps lasting milliseconds (whole batches ran 25%
    # faster or slower, whatever the mode): each mode must sample the same mixture.
    rounds: int = 20
    batch: int = 150  # new connections per batch
    rate_seconds: float = 1.5
    rate_repeats: int = 3
    changes: int = 3  # single-endpoint changes timed per mode
    # kube-proxy modes stop here: kube-proxy's own scalability target is far below 100k.
    kube_proxy_max_services: int = 20_000
    # iptables-nft's restore grows quadratically: 65 s at 10k, 7 minutes at 20k (measured),
    # which alone would take the full run past 15 minutes.
    iptables_nft_max_services: int = 10_000
    xdp: bool = True

    def validate(self) -> None:
        for mode in self.modes:
            if mode not in MODES:
                raise ConfigError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
        if not self.services:
            raise ConfigError("--services: at least one N")
        for n in self.services:
            scenario.bench_services(n, self.endpoints)  # raises with the limits
        if self.rounds < 1 or self.batch < 10 or self.rate_seconds <= 0 or self.changes < 1:
            raise ConfigError("rounds >= 1, batch >= 10, rate seconds > 0, changes >= 1")

    def runs(self, mode: str, n: int) -> bool:
        if mode in ("none", "ebpflb"):
            return True
        if mode == "iptables-nft" and n > self.iptables_nft_max_services:
            return False
        return n <= self.kube_proxy_max_services


QUICK = Settings(
    services=(100, 1000),
    rounds=8,
    batch=100,
    rate_seconds=1.0,
    rate_repeats=2,
    changes=2,
)
