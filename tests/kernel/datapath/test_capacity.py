"""Capacity limits on the real agent and kernel: a Service that cannot be programmed fails
alone, and every other Service is programmed, carries traffic and follows later edits.

What the agent did is read from the pinned maps (`ebpflb maps dump --json`), never from
its log. The big Services' extra endpoints are addresses nobody listens on: only the maps
are checked for them, no traffic is sent to them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.harness.netns import Cgroup, Topology
from tests.kernel.conftest import PODS, AgentFactory, served_by

WEB = "10.96.0.10:80"
DNS = "10.96.0.53:53/UDP"
# Below the examples' ClusterIPs, so it is planned (and fails) before them: a failed
# frontend that kept what it took would starve them.
BIG = "10.96.0.5:80/TCP"


def big_service(count: int) -> str:
    """default/big at 10.96.0.5 with `count` ready endpoints 10.244.9.1 on (no pods)."""
    endpoints = "".join(
        f'  - addresses: ["10.244.9.{i}"]\n    conditions: {{ready: true}}\n'
        for i in range(1, count + 1)
    )
    return (
        "apiVersion: v1\nkind: Service\nmetadata: {name: big, namespace: default}\n"
        "spec: {clusterIP: 10.96.0.5, ports: [{name: http, port: 80, targetPort: 8080}]}\n"
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
        "metadata:\n  name: big-1\n  namespace: default\n"
        "  labels: {kubernetes.io/service-name: big}\n"
        "addressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n" + endpoints
    )


def dump(bpffs: Path) -> dict[str, dict[str, Any]]:
    """The programmed frontends, by "address:port/PROTO", as `maps dump --json` shows them."""
    done = subprocess.run(
        [sys.executable, "-m", "ebpflb", "maps", "dump", "--json", "--bpffs", str(bpffs)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return {s["frontend"]: s for s in json.loads(done.stdout)["services"]}


def addresses(service: dict[str, Any]) -> list[str]:
    return sorted(b["address"] for b in service["backends"])


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the maps did not get there in time"
        time.sleep(0.2)


def test_a_service_over_max_backends_fails_alone_and_the_others_carry_traffic(
    topology: Topology, cgroup: Cgroup, manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    """--max-backends 8: the examples need 6 backends, a 10-endpoint Service cannot fit."""
    (manifests / "big.yaml").write_text(big_service(10))
    start_agent("--manifests", str(manifests), "--max-backends", "8")
    frontends = dump(bpffs)
    assert BIG not in frontends
    assert addresses(frontends[f"{WEB}/TCP"]) == sorted(f"{ip}:8080" for ip in PODS.values())
    assert addresses(frontends[DNS]) == sorted(f"{ip}:5353" for ip in PODS.values())
    counts = served_by(topology.requests(topology.node_ns, "tcp", WEB, 30, cgroup))
    assert set(counts) == set(PODS)
    # Still failing at its retries, it never takes the others' room.
    time.sleep(2.5)
    frontends = dump(bpffs)
    assert BIG not in frontends and len(frontends[f"{WEB}/TCP"]["backends"]) == 3


def test_a_service_over_the_table_size_limit_fails_alone_and_edits_still_apply(
    cgroup: Cgroup, manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    """--maglev-max-table-size 101: Maglev needs a slot per backend, 120 cannot fit; 90
    fit, in a table of 101 slots (with a warning: fewer than 100 slots each)."""
    (manifests / "big.yaml").write_text(big_service(120))
    (manifests / "wide.yaml").write_text(
        big_service(90).replace("big", "wide").replace("10.96.0.5", "10.96.0.6")
    )
    start_agent("--manifests", str(manifests), "--maglev-max-table-size", "101")
    frontends = dump(bpffs)
    assert BIG not in frontends
    wide = frontends["10.96.0.6:80/TCP"]
    assert (len(wide["backends"]), wide["maglev"]["table_size"]) == (90, 101)
    assert len(frontends[f"{WEB}/TCP"]["backends"]) == 3 and DNS in frontends
    web = manifests / "web.yaml"
    web.write_text(
        web.read_text().replace(
            '  - addresses: ["10.244.1.13"]\n    conditions: {ready: true}',
            '  - addresses: ["10.244.1.13"]\n    conditions: {ready: false}',
        )
    )
    wait_for(lambda: len(dump(bpffs)[f"{WEB}/TCP"]["backends"]) == 2)
    assert addresses(dump(bpffs)[f"{WEB}/TCP"]) == ["10.244.1.11:8080", "10.244.1.12:8080"]
    # Once it fits, the retry programs it.
    (manifests / "big.yaml").write_text(big_service(100))
    wait_for(lambda: BIG in dump(bpffs))
    assert dump(bpffs)[BIG]["maglev"]["table_size"] == 101
