"""Control-plane costs: wall and CPU time of a loader run, a process's CPU and memory, and
the kernel memory rules or maps take (memory-cgroup accounting, bpftool's map figure)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ebpflb.datapath.syscall.mounts import cgroup2_root
from ebpflb.errors import EbpflbError
from lab.bench.records.agent import CgroupMemory, ProcessMemory
from lab.harness.netns import remove_cgroup_dir


@dataclass(frozen=True)
class Timed:
    seconds: float
    cpu_seconds: float


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_timed(
    argv: Sequence[str],
    netns: str,
    *,
    stdin: str | None = None,
    preexec_fn: Callable[[], None] | None = None,
    timeout: float = 1800,
) -> Timed:
    """One command in `netns`: wall time and CPU time (user + system, which includes the
    kernel's work on the rules: iptables-restore and nft commit in their own context)."""
    cpu_before = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(
        ["nsenter", f"--net=/run/netns/{netns}", *argv],
        input=stdin,
        text=True,
        capture_output=True,
        timeout=timeout,
        preexec_fn=preexec_fn,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise EbpflbError(f"{' '.join(argv[:3])} failed ({done.returncode}): {done.stderr[:800]}")
    return Timed(elapsed, _children_cpu() - cpu_before)


# ---- a process ----------------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def live_threads_cpu_seconds(pid: int) -> float:
    """CPU time of a process's live threads in ns resolution (/proc/PID/task/*/schedstat):
    /proc/PID/stat's 10 ms ticks are too coarse for one endpoint change."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def process_memory(pid: int) -> ProcessMemory:
    """VmRSS, VmHWM, RssAnon and RssFile from /proc/PID/status."""
    wanted = {"VmRSS", "VmHWM", "RssAnon", "RssFile"}
    mib = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            mib[key] = int(value.split()[0]) / 1024
    return ProcessMemory(mib["VmRSS"], mib["VmHWM"], mib["RssAnon"], mib["RssFile"])


# Shared libraries that would mean a compiler in the process: BCC and its LLVM/clang, and
# llvmlite (a JIT's LLVM: numba's, which built large Maglev tables until issue 22).
COMPILER_LIBRARIES = ("libbcc", "libLLVM", "libclang", "llvmlite")


def mapped_libraries(pid: int, names: Sequence[str] = COMPILER_LIBRARIES) -> tuple[str, ...]:
    """File names of the shared objects mapped into process `pid` whose name contains one
    of `names`."""
    found = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        base = path.rsplit("/", 1)[-1]
        if any(name in base for name in names):
            found.add(base)
    return tuple(sorted(found))


# ---- kernel memory ------------------------------------------------------------------------


@dataclass
class KernelMemoryCgroup:
    """A memory cgroup that accounts the kernel memory its processes allocate.

    x_tables blobs, nf_tables objects and BPF maps are all allocated with __GFP_ACCOUNT,
    i.e. charged to the allocating task's memory cgroup, so running iptables-restore, nft
    or the agent in a fresh cgroup measures what the rules (or maps) cost the kernel,
    without the noise of machine-wide counters. Uses cgroup v1's memory.kmem counter
    where the memory controller is on v1 (hybrid hierarchy), else v2's memory.stat
    "kernel" field.
    """

    path: Path

    @classmethod
    def create(cls, name: str) -> KernelMemoryCgroup | None:
        """None when this kernel offers neither counter (the figure is then not reported)."""
        v1 = Path("/sys/fs/cgroup/memory")
        if (v1 / "memory.kmem.usage_in_bytes").exists():
            path = v1 / name
        else:
            root = cgroup2_root()
            if "memory" not in (root / "cgroup.controllers").read_text().split():
                return None
            path = root / name
        path.mkdir()
        cgroup = cls(path)
        if cgroup.kernel_bytes() is None:
            cgroup.close()
            return None
        return cgroup

    def enter(self) -> None:
        """Move the calling process in (a preexec_fn: children inherit the cgroup)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def kernel_bytes(self) -> int | None:
        kmem = self.path / "memory.kmem.usage_in_bytes"
        if kmem.exists():
            return int(kmem.read_text())
        stat = self.path / "memory.stat"
        for line in stat.read_text().splitlines() if stat.exists() else ():
            key, _, value = line.partition(" ")
            if key == "kernel":
                return int(value)
        return None

    def usage(self) -> CgroupMemory | None:
        """The cgroup's peak and current charge with its parts: v2's memory.peak (5.19+)
        and memory.stat, or v1's max_usage_in_bytes, memory.stat and kmem counter (kernel
        memory counts in v1's usage too). None where neither is there."""
        stat = dict(
            (key, int(value))
            for key, _, value in (
                line.partition(" ") for line in (self.path / "memory.stat").read_text().splitlines()
            )
        )
        v1_peak = self.path / "memory.max_usage_in_bytes"
        if v1_peak.exists():
            peak, current = v1_peak, self.path / "memory.usage_in_bytes"
            anon, file = stat.get("rss", 0), stat.get("cache", 0)
            kernel = self.kernel_bytes() or 0
        else:
            peak, current = self.path / "memory.peak", self.path / "memory.current"
            if not peak.exists() or not current.exists():
                return None
            anon, file, kernel = stat.get("anon", 0), stat.get("file", 0), stat.get("kernel", 0)
        mib = 2**20
        return CgroupMemory(
            peak_mib=int(peak.read_text()) / mib,
            current_mib=int(current.read_text()) / mib,
            anon_mib=anon / mib,
            file_mib=file / mib,
            kernel_mib=kernel / mib,
        )

    def close(self) -> None:
        # Charges left by exited processes move to the parent when the cgroup goes.
        with contextlib.suppress(OSError):
            remove_cgroup_dir(self.path)


@contextlib.contextmanager
def memory_cgroup(name: str) -> Iterator[KernelMemoryCgroup | None]:
    """A fresh KernelMemoryCgroup for the block (None where the kernel cannot account)."""
    cgroup = KernelMemoryCgroup.create(name)
    try:
        yield cgroup
    finally:
        if cgroup is not None:
            cgroup.close()


def bpf_map_bytes(bpffs: Path) -> int | None:
    """bpftool's memory figure summed over the maps pinned under bpffs."""
    done = subprocess.run(
        ["bpftool", "-j", "-f", "map", "show"], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        return None
    return sum(
        int(entry.get("bytes_memlock", 0))
        for entry in json.loads(done.stdout)
        if any(str(path).startswith(f"{bpffs}/") for path in entry.get("pinned", []))
    )
