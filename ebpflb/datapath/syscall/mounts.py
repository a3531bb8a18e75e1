"""Where the kernel filesystems ebpflb needs are mounted (from /proc/mounts)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ebpflb.errors import KernelSetupError


def _mounts() -> Iterator[tuple[Path, str]]:
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2:
                yield Path(fields[1]), fields[2]


def cgroup2_root() -> Path:
    """Mount point of the cgroup v2 hierarchy."""
    for path, fstype in _mounts():
        if fstype == "cgroup2":
            return path
    raise KernelSetupError("no cgroup2 filesystem mounted (see /proc/mounts)")


def is_bpffs(path: Path) -> bool:
    return any(fstype == "bpf" and mount == path for mount, fstype in _mounts())
