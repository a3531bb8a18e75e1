"""The agent's HTTP interfaces on a real agent: /metrics, /status, and kube-proxy's /healthz
turning 503 when a queued change waits longer than the bound (2 x --sync-period), then
200 again once it is applied.

How the sync loop is held: the agent's sync loop is its main thread, so the test stops
that one thread with ptrace (PTRACE_SEIZE + PTRACE_INTERRUPT stop a single thread; the
HTTP servers and the source keep running in theirs) and resumes it with PTRACE_DETACH.
That is a real stuck sync loop as seen from outside, with nothing in the agent built for
the test: no debug endpoint, no test-only flag. (SIGSTOP would stop every thread, the
health server included; a --min-sync-period longer than the bound is refused, since the
bound derives from --sync-period >= --min-sync-period, as in kube-proxy.) The second test
holds a change the other real way: the frontend map is full, so the write fails and is
retried, and the change stays pending.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.harness.agentproc import AgentProcess
from lab.harness.netns import Cgroup, Topology
from tests.kernel.conftest import PODS, AgentFactory, served_by, wait_backends, wait_until

pytestmark = pytest.mark.kernel

WEB = "10.96.0.10:80"
WEB_TCP = "10.96.0.10:80/TCP"
ALL_WEB = {f"{ip}:8080" for ip in PODS.values()}
BOUND = 2.0  # seconds: twice --sync-period 1

PTRACE_CONT = 7
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
WALL = 0x40000000  # waitpid's __WALL: wait for a thread too
FUTEX = {"x86_64": 202, "aarch64": 98}  # syscall numbers


def _ptrace(request: int, tid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(request, tid, None, None) == -1:
        errno = ctypes.get_errno()
        raise OSError(errno, f"ptrace({request:#x}, {tid}): {os.strerror(errno)}")


def _in_futex_wait(tid: int) -> bool:
    """The thread is blocked waiting on a lock or event: it holds no GIL, so stopping it
    there leaves the process's other Python threads running."""
    fields = Path(f"/proc/{tid}/task/{tid}/syscall").read_text().split()
    return bool(fields) and fields[0] == str(FUTEX.get(os.uname().machine, -1))


@contextlib.contextmanager
def thread_held(tid: int) -> Iterator[None]:
    """Stop thread `tid` of a child process (only it) for the block; resume it after."""
    _ptrace(PTRACE_SEIZE, tid)
    try:
        for _ in range(100):
            _ptrace(PTRACE_INTERRUPT, tid)
            os.waitpid(tid, WALL)
            if _in_futex_wait(tid):
                break
            _ptrace(PTRACE_CONT, tid)  # caught running Python: let it reach its wait
            time.sleep(0.01)
        else:
            pytest.fail(f"thread {tid} never seen waiting")
        yield
    finally:
        _ptrace(PTRACE_DETACH, tid)


def healthz(agent: AgentProcess, path: str = "/healthz") -> int:
    return agent.healthz(path)[0]


def test_status_metrics_and_health_over_http(
    topology: Topology, cgroup: Cgroup, manifests: Path, start_agent: AgentFactory
) -> None:
    agent = start_agent("--manifests", str(manifests))
    status = agent.status()
    assert status["ready"] is True
    phases = status["phases"]
    assert set(phases) == {
        "pin_dir_locked",
        "socket_lb_compiled",
        "attached",
        "services_listed",
        "slices_listed",
        "first_sync",
    }  # no --interfaces: no NodePort programs
    assert 0 < phases["socket_lb_compiled"] <= phases["attached"] <= phases["first_sync"]
    assert phases["slices_listed"] <= phases["first_sync"]
    assert 0 < status["compile_seconds"]["socket_lb"] < phases["socket_lb_compiled"]
    assert status["lists"]["Service"]["objects"] == 3
    assert status["lists"]["EndpointSlice"]["objects"] == 2
    first = status["sync"]["first"]
    assert (first["kind"], first["added"], first["failed"], first["errors"]) == ("first", 3, 0, [])
    assert status["frontends"] == 3
    assert status["programs"]["replaced_previous"] == 0
    # New pins: compiled, or loaded from the bytecode store a previous start filled.
    assert status["programs"]["origin"]["socket_lb"] in {"compiled", "loaded"}
    assert status["interfaces"] == {}
    assert time.time() - 600 < status["process_start"] < time.time()

    code, body = agent.healthz()
    assert code == 200 and body["healthy"] is True and body["nodeEligible"] is True
    assert body["lastUpdated"] == body["currentTime"]  # kube-proxy: "now" when healthy
    assert body["status"]["IPv4"]["healthy"] is True
    assert healthz(agent, "/livez") == 200 and agent.get("healthz", "/readyz")[0] == 200

    before = agent.metrics()
    for phase, seconds in phases.items():
        assert before.value("ebpflb_startup_phase_seconds", phase=phase) == seconds
    assert before.value("ebpflb_frontend_changes_total", change="added") == 3
    counts = served_by(topology.requests(topology.node_ns, "tcp", WEB, 40, cgroup))
    assert set(counts) == set(PODS)
    after = agent.metrics()
    event = {"event": "connect_xlated"}
    moved = after.sum("ebpflb_datapath_events_total", **event) - before.sum(
        "ebpflb_datapath_events_total", **event
    )
    assert moved == 40  # one translated connect() per request


def test_healthz_turns_503_while_the_sync_loop_is_held_and_200_after(
    cgroup: Cgroup, manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    agent = start_agent("--manifests", str(manifests), "--sync-period", "1")
    assert agent.status()["sync"]["health_timeout_s"] == BOUND
    web = manifests / "web.yaml"
    with thread_held(agent.proc.pid):  # the main thread runs the sync loop
        assert healthz(agent) == 200  # held, but nothing is pending
        web.write_text(
            web.read_text().replace(
                '  - addresses: ["10.244.1.13"]\n    conditions: {ready: true}',
                '  - addresses: ["10.244.1.13"]\n    conditions: {ready: false}',
            )
        )
        agent.wait_status(lambda s: s["sync"]["oldest_pending_s"] is not None, "queued")
        queued = time.monotonic()
        assert healthz(agent) == 200  # pending, not late yet
        waited = wait_until(lambda: healthz(agent) == 503, "503", timeout=10)
        code, body = agent.healthz()
        assert code == 503 and body["healthy"] is False
        assert body["status"]["IPv4"]["healthy"] is False
        assert body["lastUpdated"] != body["currentTime"]  # the last sync, before the hold
        assert agent.status()["sync"]["oldest_pending_s"] >= BOUND
        assert time.monotonic() - queued + 0.1 >= BOUND and waited < BOUND + 1.5
        assert healthz(agent, "/livez") == 503
        assert agent.get("healthz", "/readyz")[0] == 200  # synced once: still ready
        wait_backends(bpffs, WEB_TCP, ALL_WEB)  # the change is not in the maps
    wait_until(lambda: healthz(agent) == 200, "200 after the hold", timeout=5)
    wait_backends(bpffs, WEB_TCP, ALL_WEB - {"10.244.1.13:8080"})
    assert agent.status()["sync"]["oldest_pending_s"] is None


def test_healthz_turns_503_while_a_change_cannot_be_written(
    manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    # Room for exactly the three frontends of examples/.
    agent = start_agent("--manifests", str(manifests), "--sync-period", "1", "--max-services", "3")
    assert agent.status()["frontends"] == 3 and healthz(agent) == 200
    extra = manifests / "extra.yaml"
    extra.write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: extra}\n"
        "spec: {clusterIP: 10.96.0.77, ports: [{name: x, port: 80}]}\n"
    )
    wait_until(lambda: healthz(agent) == 503, "503", timeout=10)
    last = agent.status()["sync"]["last"]
    assert last["failed"] == 1 and last["ok"] is False
    (error,) = last["errors"]
    assert "default/extra" in error and "ebpflb_svc4 is full (limit 3)" in error
    assert agent.metrics().sum("ebpflb_map_errors_total", map="ebpflb_svc4", reason="full") >= 1
    extra.unlink()  # the change goes away: nothing left that cannot be written
    wait_until(lambda: healthz(agent) == 200, "200 once nothing is pending", timeout=10)
    wait_backends(bpffs, "10.96.0.77:80/TCP", None)
