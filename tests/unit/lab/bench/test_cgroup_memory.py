"""The agent's memory cgroup figures (a pod's limit counts them), read from cgroup v1's or
v2's files: here from files written by the test, as the kernel lays them out."""

from __future__ import annotations

from pathlib import Path

from lab.bench.measure.cost import KernelMemoryCgroup
from lab.bench.records.agent import CgroupMemory

MIB = 2**20


def _write(path: Path, files: dict[str, str]) -> KernelMemoryCgroup:
    for name, text in files.items():
        (path / name).write_text(text)
    return KernelMemoryCgroup(path)


def test_v2_reads_memory_peak_and_the_stat_parts(tmp_path: Path) -> None:
    cgroup = _write(
        tmp_path,
        {
            "memory.peak": str(150 * MIB),
            "memory.current": str(120 * MIB),
            "memory.stat": f"anon {60 * MIB}\nfile {10 * MIB}\nkernel {50 * MIB}\n",
        },
    )
    assert cgroup.usage() == CgroupMemory(150.0, 120.0, 60.0, 10.0, 50.0)


def test_v1_reads_max_usage_and_the_kmem_counter(tmp_path: Path) -> None:
    cgroup = _write(
        tmp_path,
        {
            "memory.max_usage_in_bytes": str(200 * MIB),
            "memory.usage_in_bytes": str(180 * MIB),
            "memory.kmem.usage_in_bytes": str(90 * MIB),
            "memory.stat": f"cache {20 * MIB}\nrss {70 * MIB}\ntotal_rss {70 * MIB}\n",
        },
    )
    assert cgroup.usage() == CgroupMemory(200.0, 180.0, 70.0, 20.0, 90.0)


def test_a_kernel_without_a_peak_counter_gives_none(tmp_path: Path) -> None:
    cgroup = _write(tmp_path, {"memory.current": "1", "memory.stat": "anon 1\n"})
    assert cgroup.usage() is None
