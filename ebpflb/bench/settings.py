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
    rounds: int = 10  # latency: interleaved rounds of one batch per target and mode
    batch: int = 500  # new connections per batch
    rate_seconds: float = 2.0
    rate_repeats: int = 3
    changes: int = 3  # single-endpoint changes timed per mode
    # kube-proxy modes stop here: iptables-nft's restore grows quadratically (minutes at
    # 20k) and kube-proxy's own scalability target is far below 100k services.
    kube_proxy_max_services: int = 20_000
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
        return mode in ("none", "ebpflb") or n <= self.kube_proxy_max_services


QUICK = Settings(
    services=(100, 1000),
    rounds=4,
    batch=200,
    rate_seconds=1.0,
    rate_repeats=2,
    changes=2,
)
