"""The machine a run measured on, and waiting for it to be idle before measuring."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from lab.bench.records.compare import Machine


def cpu_busy_fraction(window: float) -> float:
    """How busy all CPUs were over `window` seconds (0..1), from /proc/stat."""

    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields), idle

    total_before, idle_before = sample()
    time.sleep(window)
    total_after, idle_after = sample()
    elapsed = max(1, total_after - total_before)
    return 1 - (idle_after - idle_before) / elapsed


def core_times() -> dict[int, tuple[int, int]]:
    """Each CPU's (busy, total) clock ticks so far, from /proc/stat (idle and iowait are
    not busy)."""
    times = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        ticks = [int(v) for v in values]
        times[int(name[3:])] = (sum(ticks) - ticks[3] - ticks[4], sum(ticks))
    return times


def wait_until_quiet(
    *, busy_below: float = 0.1, window: float = 0.5, timeout: float = 120
) -> float:
    """Wait for the machine to go idle; the seconds waited. A deleted namespace's rules are
    freed by the kernel in the background (seconds for 20,000 services' worth), which would
    otherwise land inside the next mode's measurements."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if cpu_busy_fraction(window) < busy_below:
            break
    return time.perf_counter() - started


def _version(argv: Sequence[str]) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (done.stdout or done.stderr).strip().splitlines()[0]
    return "not found"


def machine_facts() -> Machine:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError):
        mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return Machine(
        kernel=platform.release(),
        cpu=model,
        cpus=os.cpu_count() or 1,
        memory_gib=round(mem_kib / 2**20, 1),
        iptables=_version(["iptables-legacy", "--version"]),
        nft=_version(["nft", "--version"]),
        date=time.strftime("%Y-%m-%d"),
    )
