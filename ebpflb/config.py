"""The agent's configuration: one frozen value, validated once, owning every size.

The datapath's sizes live here and reach the C code as -D flags (``cflags()``); the C
headers only keep ``#ifndef`` defaults. Changing a size changes the pinned maps' layout,
which the loader detects and handles (see ``ebpflb.datapath.loader``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ebpflb.errors import ConfigError
from ebpflb.maglev import DEFAULT_HASH_SEED, DEFAULT_MAX_TABLE_SIZE, TABLE_SIZES

DEFAULT_BPFFS_DIR = Path("/sys/fs/bpf/ebpflb")
# kube-proxy's metricsBindAddress default.
DEFAULT_METRICS_BIND_ADDRESS = "127.0.0.1:10249"


@dataclass(frozen=True, slots=True)
class Config:
    bpffs_dir: Path = DEFAULT_BPFFS_DIR
    # cgroup v2 directory the socket programs attach to; None = the cgroup2 mount root.
    cgroup_dir: Path | None = None
    node_name: str = ""
    hash_seed: str = DEFAULT_HASH_SEED
    maglev_max_table_size: int = DEFAULT_MAX_TABLE_SIZE
    max_services: int = 65536
    max_backends: int = 65536
    slot_pool_size: int = 4 * 1024 * 1024
    rev_sk_max: int = 262144
    # Bounded-frequency sync (kube-proxy's minSyncPeriod / syncPeriod): bursts within
    # min_sync_period coalesce; every max_sync_period the maps are re-read and repaired.
    min_sync_period: float = 0.5
    max_sync_period: float = 30.0
    retry_period: float = 2.0
    metrics_bind_address: str = DEFAULT_METRICS_BIND_ADDRESS

    def __post_init__(self) -> None:
        for name in ("max_services", "max_backends", "slot_pool_size", "rev_sk_max"):
            value = getattr(self, name)
            if not 1 <= value < 2**31:
                raise ConfigError(f"{name.replace('_', '-')} must be in [1, 2^31), got {value}")
        if self.maglev_max_table_size not in TABLE_SIZES:
            raise ConfigError(
                f"maglev-max-table-size {self.maglev_max_table_size} is not one of {TABLE_SIZES}"
            )
        if self.maglev_max_table_size > self.slot_pool_size:
            raise ConfigError(
                f"maglev-max-table-size {self.maglev_max_table_size} exceeds "
                f"slot-pool-size {self.slot_pool_size}"
            )
        if not self.hash_seed:
            raise ConfigError("hash-seed must not be empty (it must match on every node)")
        if not 0 < self.min_sync_period <= self.max_sync_period:
            raise ConfigError("need 0 < min-sync-period <= max-sync-period")

    def replace(self, **changes: object) -> Config:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def cflags(self) -> list[str]:
        """The -D flags that size the maps and place the pins (bpf/lib/consts.h)."""
        return [
            f'-DEBPFLB_PIN_DIR="{self.bpffs_dir}"',
            f"-DEBPFLB_MAX_SERVICES={self.max_services}",
            f"-DEBPFLB_MAX_BACKENDS={self.max_backends}",
            f"-DEBPFLB_SLOT_POOL_SIZE={self.slot_pool_size}",
            f"-DEBPFLB_REV_SK_MAX={self.rev_sk_max}",
        ]
