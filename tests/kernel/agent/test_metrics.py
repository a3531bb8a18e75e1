"""kube-proxy's metrics and the map fill levels on a real agent, scraped over HTTP:
network programming latency from a slice's trigger-time annotation set a known time ago,
the reverse-socket map's entries moving with real connections, and `ebpflb status` with
the agent up and, after it stopped, from the pins."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ebpflb.config import Config
from ebpflb.datapath.contract import MapName
from ebpflb.observe.fill import has_fill_level
from lab.harness.agentproc import AgentProcess
from lab.harness.netns import Cgroup, Topology
from tests.kernel.conftest import PODS, AgentFactory, served_by, wait_backends, wait_until

pytestmark = pytest.mark.kernel

WEB = "10.96.0.10:80"
DNS = "10.96.0.53:53"
IPV4 = {"ip_family": "IPv4"}
PROGRAMMING = "kubeproxy_network_programming_duration_seconds"
# Every pinned map has a fill level but arrays of counters (fixed indexes).
ALL_MAPS = {name.value for name in MapName if has_fill_level(name)}
AGO = 3.0  # seconds: how old the trigger time is when the slice is written


def entries(agent: AgentProcess, map_name: str) -> float | None:
    return agent.metrics().value("ebpflb_map_entries", map=map_name)


def test_fill_levels_and_kube_proxy_sync_metrics(
    topology: Topology, cgroup: Cgroup, manifests: Path, start_agent: AgentFactory
) -> None:
    agent = start_agent("--manifests", str(manifests))
    scrape = agent.metrics()
    defaults = Config()
    assert scrape.value("ebpflb_map_entries", map="ebpflb_svc4") == 3
    assert scrape.value("ebpflb_map_capacity", map="ebpflb_svc4") == defaults.max_services
    # web (TCP 8080) and dns (UDP 5353) on the same three pods: six backends.
    assert scrape.value("ebpflb_map_entries", map="ebpflb_be4") == 2 * len(PODS)
    # The slot pool starts at its initial size (it grows up to slot_pool_size).
    assert scrape.value("ebpflb_map_capacity", map="ebpflb_slots") == defaults.slot_pool_initial
    ct = scrape.value("ebpflb_map_capacity", map="ebpflb_ct4")
    assert ct == defaults.ct_initial and scrape.value("ebpflb_map_entries", map="ebpflb_ct4") == 0
    # The first sync was a full one, and succeeded.
    assert scrape.value("kubeproxy_sync_full_proxy_rules_duration_seconds_count", **IPV4) == 1
    synced = scrape.value("kubeproxy_sync_proxy_rules_last_timestamp_seconds", **IPV4)
    assert synced is not None and time.time() - 60 < synced <= time.time()

    before = entries(agent, "ebpflb_revsk4")
    assert before is not None
    udp = topology.requests(topology.node_ns, "udp", DNS, 40, cgroup, "--connected")
    assert set(served_by(udp)) == set(PODS)
    # One reverse-translation entry per connected UDP socket (getpeername shows the VIP;
    # TCP sockets keep theirs in socket storage where the kernel allows it); a kernel count
    # is reused for up to 10 s (observe.fill.COUNT_MAX_AGE).
    wait_until(lambda: entries(agent, "ebpflb_revsk4") == before + 40, "40 more", timeout=15)
    ratio = agent.metrics().value("ebpflb_map_fill_ratio", map="ebpflb_revsk4")
    capacity = agent.metrics().value("ebpflb_map_capacity", map="ebpflb_revsk4")
    assert capacity and ratio == pytest.approx((before + 40) / capacity)


def rfc3339(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z")


def test_network_programming_duration_from_the_trigger_time(
    manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    agent = start_agent("--manifests", str(manifests))
    status = agent.status()
    # Trigger times from before the agent started are not observed (kube-proxy's rule):
    # make sure `AGO` seconds back is after it (it started before compiling).
    started = status["process_start"] + status["phases"]["socket_lb_compiled"]
    while time.time() - AGO <= started:
        time.sleep(0.1)
    scrape = agent.metrics()
    count = scrape.value(f"{PROGRAMMING}_count", **IPV4)
    total = scrape.value(f"{PROGRAMMING}_sum", **IPV4)
    changes = scrape.value("kubeproxy_sync_proxy_rules_endpoint_changes_total")
    partial = scrape.value("kubeproxy_sync_partial_proxy_rules_duration_seconds_count", **IPV4)
    assert count == 0 and total == 0 and changes is not None and partial is not None

    web = manifests / "web.yaml"
    text = web.read_text()
    trigger = time.time() - AGO
    annotated = text.replace(
        "  name: web-abc12\n",
        "  name: web-abc12\n  annotations:\n"
        f'    endpoints.kubernetes.io/last-change-trigger-time: "{rfc3339(trigger)}"\n',
    ).replace(
        '  - addresses: ["10.244.1.13"]\n    conditions: {ready: true}',
        '  - addresses: ["10.244.1.13"]\n    conditions: {ready: false}',
    )
    assert annotated.count("last-change-trigger-time") == 1 and "ready: false" in annotated
    web.write_text(annotated)
    wait_backends(bpffs, "10.96.0.10:80/TCP", {"10.244.1.11:8080", "10.244.1.12:8080"})

    def observed() -> bool:
        return agent.metrics().value(f"{PROGRAMMING}_count", **IPV4) == 1

    wait_until(observed, "the programming latency observed", timeout=10)
    latest = time.time() - trigger  # the most the latency can be
    scrape = agent.metrics()
    latency = scrape.value(f"{PROGRAMMING}_sum", **IPV4)
    assert latency is not None and AGO < latency <= latest
    assert scrape.value("kubeproxy_sync_proxy_rules_endpoint_changes_total") == changes + 1
    moved = scrape.value("kubeproxy_sync_partial_proxy_rules_duration_seconds_count", **IPV4)
    assert moved is not None and moved >= partial + 1
    assert scrape.value("kubeproxy_sync_proxy_rules_endpoint_changes_pending") == 0
    queued = scrape.value("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", **IPV4)
    assert queued is not None and trigger < queued < time.time()


def ebpflb_status(agent: AgentProcess, bpffs: Path, *extra: str) -> tuple[int, str]:
    assert agent.metrics_address is not None
    done = subprocess.run(
        [sys.executable, "-m", "ebpflb", "status", "--metrics-bind-address",
         agent.metrics_address, "--bpffs", str(bpffs), *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.returncode, done.stdout


def test_status_from_the_agent_and_from_the_pins_once_it_is_gone(
    topology: Topology, cgroup: Cgroup, manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    agent = start_agent("--manifests", str(manifests))
    served_by(topology.requests(topology.node_ns, "tcp", WEB, 10, cgroup))
    # Connected UDP sockets' reverse entries are in the LRU (TCP's in socket storage).
    served_by(topology.requests(topology.node_ns, "udp", DNS, 10, cgroup, "--connected"))
    code, text = ebpflb_status(agent, bpffs)
    print(f"$ ebpflb status\n{text}")  # shown with -s: the README's example
    assert code == 0, text
    assert f"answering on {agent.metrics_address}: ready, healthy" in text
    assert "frontends   3 programmed" in text
    code, out = ebpflb_status(agent, bpffs, "--json")
    document = json.loads(out)
    assert code == 0 and document["agent"]["answering"] and document["maps_from"] == "agent"
    assert document["status"]["frontends"] == 3
    assert document["datapath"]["connect_xlated"] >= 10
    assert document["maps"]["ebpflb_svc4"]["entries"] == 3
    assert set(document["maps"]) == ALL_MAPS

    assert agent.stop() == 0  # the datapath stays: programs attached, maps pinned
    code, text = ebpflb_status(agent, bpffs)
    print(f"$ ebpflb status   # the agent stopped\n{text}")
    assert code == 1, text
    assert f"NOT answering on {agent.metrics_address}: Connection refused" in text
    assert f"what the maps pinned under {bpffs} hold" in text
    assert "frontends   3 of 3 services, 1 refusing (no usable endpoint)" in text
    code, out = ebpflb_status(agent, bpffs, "--json")
    document = json.loads(out)
    assert code == 1 and document["maps_from"] == "pins" and document["status"] is None
    pins = document["pins"]
    assert (pins["frontends"], pins["services"], pins["backends"]) == (3, 3, 6)
    assert pins["counters"]["connect_xlated"] >= 10
    maps = document["maps"]
    assert set(maps) == ALL_MAPS
    assert maps["ebpflb_svc4"]["entries"] == 3 and maps["ebpflb_be4"]["entries"] == 6
    assert maps["ebpflb_svcmeta"]["entries"] == 3
    assert maps["ebpflb_revsk4"]["entries"] >= 10  # counted in the kernel
    assert maps["ebpflb_slots"]["entries"] == pins["slots_used"] > 0
