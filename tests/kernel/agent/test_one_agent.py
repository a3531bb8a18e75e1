"""One agent per pin directory, on the real kernel: a second `ebpflb run` on the same
pins waits for the first to exit (saying so in /status, not ready), then takes over,
while a client's new connections keep being served; it gives up after --lock-timeout;
`ebpflb cleanup` refuses while an agent runs.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ebpflb.datapath.maps import MapName
from lab.harness.agentproc import AgentProcess, cleanup_datapath
from lab.harness.connload import Load
from lab.harness.netns import Cgroup, Topology
from tests.kernel.conftest import PODS, AgentFactory, programs_but_headers, wait_backends

WEB = "10.96.0.10:80"


def waiting_for(document: dict[str, Any]) -> dict[str, Any] | None:
    wait: dict[str, Any] | None = document["problems"]["waiting_for_pin_dir"]
    return wait


def wait_waiting(agent: AgentProcess, timeout: float = 30.0) -> dict[str, Any]:
    """Until the agent's /status says it waits for the pin directory (its servers start
    a moment after the process): that document."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert agent.proc.poll() is None, f"agent exited:\n{agent.output()}"
        try:
            document = agent.status()
        except OSError:  # not listening yet
            document = None
        if document is not None and waiting_for(document) is not None:
            return document
        time.sleep(0.05)
    raise AssertionError(f"agent not waiting for the pins within {timeout}s")


def test_a_second_agent_waits_then_takes_over_and_traffic_keeps_flowing(
    topology: Topology,
    cgroup: Cgroup,
    manifests: Path,
    start_agent: AgentFactory,
    bpffs: Path,
    record_property: Any,
) -> None:
    first = start_agent("--manifests", str(manifests))
    second = start_agent("--manifests", str(manifests), wait=False)
    waiting = wait_waiting(second)
    assert waiting_for(waiting) == {
        "pin_dir": str(bpffs),
        "holder_pid": first.proc.pid,
        "since": waiting_for(waiting)["since"],  # type: ignore[index]
    }
    assert "pin_dir_locked" not in waiting["phases"]
    assert second.get("healthz", "/readyz")[0] == 503
    # It waits: nothing compiled, nothing attached, nothing written.
    time.sleep(1.0)
    still = second.status()
    assert waiting_for(still) is not None and not still["ready"]
    assert "attached" not in still["phases"]

    load = Load(topology, topology.node_ns, cgroup, WEB, seconds=6, rate=300)
    time.sleep(1.5)
    stopped = time.monotonic()
    assert first.stop() == 0
    second.wait_ready(timeout=30)
    handover = time.monotonic() - stopped
    result = load.result()

    status = second.status()
    assert waiting_for(status) is None
    assert "pin_dir_locked" in status["phases"]
    # The first agent's programs, pinned, are adopted: still attached, nothing replaced.
    assert programs_but_headers(status) == {
        "replaced_previous": 0,
        "origin": {"socket_lb": "adopted"},
    }
    # The pinned state was adopted as it was: nothing rewritten.
    first_sync = status["sync"]["first"]
    assert (first_sync["added"], first_sync["updated"], first_sync["removed"]) == (0, 0, 0)
    print(f"handover in {handover:.2f}s; client: {result}")
    record_property("handover_seconds", round(handover, 2))
    record_property("handover_connections", result["attempted"])
    record_property("handover_failed", result["failed"])
    assert result["failed"] == 0, result["failures"]
    assert result["ok"] == result["attempted"] > 1000
    assert set(result["servers"]) == set(PODS)

    # The new agent is the one applying edits now.
    web = manifests / "web.yaml"
    web.write_text(web.read_text().replace('["10.244.1.13"]', '["10.244.1.14"]'))
    wait_backends(bpffs, f"{WEB}/TCP", {"10.244.1.11:8080", "10.244.1.12:8080", "10.244.1.14:8080"})


def test_a_second_agent_gives_up_after_the_lock_timeout_naming_the_holder(
    manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    first = start_agent("--manifests", str(manifests))
    second = start_agent("--manifests", str(manifests), "--lock-timeout", "1", wait=False)
    assert second.proc.wait(timeout=30) == 1
    second.stop()
    # The CLI's one-line error (its last line), not a log line.
    error = second.output().splitlines()[-1]
    assert error == (
        f"ebpflb: pin directory {bpffs} is still locked by another ebpflb agent"
        f" (pid {first.proc.pid}) after waiting 1s: stop that agent, or wait longer with"
        " --lock-timeout"
    )
    # The first agent was not disturbed.
    assert first.proc.poll() is None
    assert first.get("healthz", "/readyz")[0] == 200


def test_cleanup_refuses_while_an_agent_runs(
    cgroup: Cgroup, manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    agent = start_agent("--manifests", str(manifests))
    refused = cleanup_datapath(bpffs, cgroup.path)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"ebpflb: pin directory {bpffs} is in use by an ebpflb agent (pid {agent.proc.pid}):"
        " stop it first (`ebpflb cleanup` does not remove the pins of a running agent)"
    )
    assert (bpffs / MapName.SERVICES.value).exists()
    assert agent.get("healthz", "/readyz")[0] == 200
    # Read-only commands do not need the lock.
    dump = subprocess.run(
        [sys.executable, "-m", "ebpflb", "maps", "dump", "--json", "--bpffs", str(bpffs)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dump.returncode == 0
    agent.stop()
    done = cleanup_datapath(bpffs, cgroup.path)
    assert done.returncode == 0, done.stderr
    assert not bpffs.exists()


def test_a_second_agent_on_the_same_ports_waits_then_serves_on_them(
    manifests: Path, start_agent: AgentFactory
) -> None:
    """Two agents on one host network with the default ports: the second cannot serve
    /status while the first holds the ports; it waits all the same and takes both over."""
    first = start_agent("--manifests", str(manifests))
    second = start_agent(
        "--manifests",
        str(manifests),
        f"--healthz-bind-address={first.healthz_address}",
        f"--metrics-bind-address={first.metrics_address}",
        wait=False,
    )
    time.sleep(2.0)
    assert second.proc.poll() is None  # waiting, not failed on the taken ports
    assert first.status()["programs"]["replaced_previous"] == 0  # nobody touched its programs
    first_start = first.status()["process_start"]
    assert first.stop() == 0
    second.wait_ready(timeout=30)
    status = second.status()
    assert status["process_start"] > first_start  # answered by the second agent
    assert "pin_dir_locked" in status["phases"]
    assert programs_but_headers(status) == {
        "replaced_previous": 0,
        "origin": {"socket_lb": "adopted"},
    }
