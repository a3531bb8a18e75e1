"""Fixtures for kernel tests: namespaces with servers, a test cgroup, a private bpffs
directory and the real `ebpflb run`. Each removes what it created, also on failure."""

from __future__ import annotations

import collections
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ebpflb.datapath.maps import dump
from ebpflb.datapath.maps.kernel import KernelMapSet
from lab.harness import leftovers
from lab.harness.agentproc import TIMEOUT_SCALE, AgentProcess, cleanup_datapath
from lab.harness.machinelock import machine_lock
from lab.harness.netns import Cgroup, Topology
from tests import REPO
from tests.kernel.twonode import env  # noqa: F401 (the two-node cluster fixture)

PODS = {"pod1": "10.244.1.11", "pod2": "10.244.1.12", "pod3": "10.244.1.13"}
TCP_PORT, UDP_PORT = 8080, 5353
BPFFS_ROOT = Path("/sys/fs/bpf")


@pytest.fixture(scope="session", autouse=True)
def _one_session_per_machine() -> Iterator[None]:
    """One kernel test session (or bench) per machine at a time: see machinelock."""
    with machine_lock("kernel tests"):
        yield


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_behind(_one_session_per_machine: None) -> Iterator[None]:
    if os.geteuid() != 0:
        yield
        return
    before = leftovers.find()
    yield
    left = {
        kind: sorted(set(items) - set(before.get(kind, ())))
        for kind, items in leftovers.find().items()
    }
    left = {kind: items for kind, items in left.items() if items}
    assert not left, f"kernel tests left these behind: {left}"


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    """A node namespace and three pods, each serving TCP 8080 and UDP 5353."""
    topo = Topology.create()
    try:
        for name, ip in PODS.items():
            topo.start_server(topo.add_pod(name, ip), tcp=[TCP_PORT], udp=[UDP_PORT], lifetime=900)
        yield topo
    finally:
        topo.close()


@pytest.fixture
def bpffs() -> Iterator[Path]:
    path = BPFFS_ROOT / f"ebpflb-test-{uuid.uuid4().hex[:8]}"
    try:
        yield path
    finally:
        if path.exists():
            for pin in path.iterdir():
                pin.unlink()
            path.rmdir()


@pytest.fixture
def cgroup(bpffs: Path) -> Iterator[Cgroup]:
    cg = Cgroup.create(f"ebpflb-test-{uuid.uuid4().hex[:8]}")
    try:
        yield cg
    finally:
        cleanup_datapath(bpffs, cg.path)
        cg.close()


AgentFactory = Callable[..., AgentProcess]


@pytest.fixture
def start_agent(bpffs: Path, cgroup: Cgroup, tmp_path: Path) -> Iterator[AgentFactory]:
    """Start `ebpflb run SOURCE-ARGS...` on this test's bpffs directory and cgroup."""
    agents: list[AgentProcess] = []

    def start(*args: str, wait: bool = True) -> AgentProcess:
        agent = AgentProcess(
            [
                *args,
                "--bpffs",
                str(bpffs),
                "--cgroup",
                str(cgroup.path),
                "--min-sync-period",
                "0.1",
            ],
            log_file=tmp_path / f"agent{len(agents)}.log",
        )
        agents.append(agent)
        if wait:
            agent.wait_ready()
        return agent

    try:
        yield start
    finally:
        for agent in agents:
            agent.stop()


def served_by(results: list[dict[str, object]]) -> collections.Counter[str]:
    """Which backend answered each (all successful) request."""
    assert all(r["ok"] for r in results), [r for r in results if not r["ok"]][:3]
    return collections.Counter(str(r["server"]) for r in results)


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    """A directory holding a copy of examples/ (web TCP, dns UDP, pending with no endpoints)."""
    target = tmp_path / "manifests"
    shutil.copytree(REPO / "examples", target)
    return target


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> float:
    """Poll `condition` until it holds; the seconds it took. Fails the test naming `what`."""
    started = time.monotonic()
    deadline = started + timeout * TIMEOUT_SCALE
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not {what} within {timeout * TIMEOUT_SCALE:.0f}s")
        time.sleep(0.02)
    return time.monotonic() - started


def programmed_backends(maps: KernelMapSet) -> dict[str, set[str]]:
    """What the pinned maps hold (the `maps dump --json` document): frontend -> backends."""
    report = dump.collect(maps)
    return {s["frontend"]: {b["address"] for b in s["backends"]} for s in report["services"]}


def wait_backends(
    bpffs: Path, frontend: str, expected: set[str] | None, timeout: float = 10.0
) -> float:
    """Poll the maps pinned under `bpffs` until `frontend` ("VIP:PORT/PROTO") has exactly
    the `expected` backends ("IP:PORT"), or is absent for None; the seconds it took."""
    with KernelMapSet(bpffs) as maps:
        return wait_until(
            lambda: programmed_backends(maps).get(frontend) == expected,
            f"{frontend} -> {sorted(expected) if expected is not None else 'absent'}",
            timeout,
        )


def programs_but_headers(status: dict[str, Any]) -> dict[str, Any]:
    """/status's `programs` without `headers` (which tree compiled them, where recorded:
    tests/kernel/datapath/test_headers.py's subject) and `ids` (the kernel's program ids:
    test_restart_adopt.py and podpath/test_pod_path.py check them against the attached)."""
    return {k: v for k, v in status["programs"].items() if k not in ("headers", "ids")}


def headers_here() -> str:
    """How /status names the header tree this machine compiles with."""
    from ebpflb.datapath.programs.headers import find_headers

    return find_headers().describe()
