"""Socket-LB for IPv6 on the real kernel, where it has no IPv4 twin (test_socket_lb.py
runs the twins for both families): IPv4-mapped destinations of dual-stack sockets, one
dual-stack Service serving both families at once, IPv6 entries adopted on restart and
added to IPv4-only pins, connected UDP recovering, affinity and externalIPs over IPv6.
Real programs, real sockets, namespaces with IPv6 addresses (fd00::/8, unique local)
conftest.py creates; the client's (node) namespace has no route out: an address left
untranslated dies there."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ebpflb.datapath.programs import loader
from lab.harness.netns import Cgroup, Topology
from tests.kernel.conftest import PODS, AgentFactory, served_by, wait_backends
from tests.kernel.socketlb.conftest import (
    DNS6,
    DNS_MAPPED,
    DUAL4,
    DUAL6,
    NODE6,
    PENDING_MAPPED,
    PODS6,
    WEB6,
    WEB_MAPPED,
    host_of,
    service_yaml,
    slice_yaml,
)


@pytest.fixture(scope="module")
def topology(topology6: Topology) -> Topology:
    """Every test here runs on the topology with IPv6 (conftest.py's topology6)."""
    return topology6


def test_v4_mapped_clusterip_is_translated_like_the_ipv4_one(
    topology: Topology, cgroup: Cgroup, manifests6: Path, start_agent: AgentFactory
) -> None:
    """A dual-stack (AF_INET6) socket addressing ::ffff:<IPv4 ClusterIP> reaches the IPv4
    backends (as ::ffff:<backend>), and sees the mapped ClusterIP as its peer."""
    start_agent("--manifests", str(manifests6))
    results = topology.requests(topology.node_ns, "tcp", WEB_MAPPED, 150, cgroup)
    assert set(served_by(results)) == set(PODS)
    assert {r["peer"] for r in results} == {WEB_MAPPED}
    # The backends saw IPv4: the connection went out over IPv4 to an IPv4 backend.
    assert {host_of(str(r["seen_as"])) for r in results} == {topology.node_ip}
    connected = topology.requests(topology.node_ns, "udp", DNS_MAPPED, 30, cgroup, "--connected")
    assert len(served_by(connected)) >= 2
    assert {r["peer"] for r in connected} == {DNS_MAPPED}
    # Unconnected: the kernel hands the datagram to sendmsg4; the reply is read by
    # recvmsg6, which finds the IPv4 entry and shows the mapped ClusterIP.
    unconnected = topology.requests(topology.node_ns, "udp", DNS_MAPPED, 30, cgroup)
    assert len(served_by(unconnected)) >= 2
    assert {r["peer"] for r in unconnected} == {DNS_MAPPED}
    expected = "ECONNREFUSED" if loader.probe_features().set_retval else "EPERM"
    refused = topology.requests(topology.node_ns, "tcp", PENDING_MAPPED, 2, cgroup, timeout=5.0)
    assert [r.get("error") for r in refused] == [expected] * 2


def test_dual_stack_service_serves_both_families_at_once(
    topology: Topology,
    cgroup: Cgroup,
    manifests6: Path,
    start_agent: AgentFactory,
    bpffs: Path,
) -> None:
    """One Service, ipFamilies [IPv4, IPv6]: each family's ClusterIP reaches that family's
    endpoints only (pod1+pod2 over IPv4, pod2+pod3 over IPv6), clients of both running at
    the same time."""
    start_agent("--manifests", str(manifests6))
    wait_backends(bpffs, "10.96.0.20:80/TCP", {"10.244.1.11:8080", "10.244.1.12:8080"})
    wait_backends(bpffs, "[fd00:96::20]:80/TCP", {"[fd00:244::12]:8080", "[fd00:244::13]:8080"})
    results: dict[str, list[dict[str, Any]]] = {}

    def run(target: str) -> None:
        results[target] = topology.requests(topology.node_ns, "tcp", target, 150, cgroup)

    clients = [threading.Thread(target=run, args=(t,)) for t in (DUAL4, DUAL6)]
    for client in clients:
        client.start()
    for client in clients:
        client.join(timeout=300)
    assert set(served_by(results[DUAL4])) == {"pod1", "pod2"}
    assert set(served_by(results[DUAL6])) == {"pod2", "pod3"}
    assert {r["peer"] for r in results[DUAL4]} == {DUAL4}
    assert {r["peer"] for r in results[DUAL6]} == {DUAL6}
    assert {host_of(str(r["seen_as"])) for r in results[DUAL6]} == {NODE6}
    # `ebpflb explain` reads the same pinned IPv6 maps: the IPv6 frontend's candidates.
    argv = [sys.executable, "-m", "ebpflb", "explain", "--json", "--bpffs", str(bpffs)]
    done = subprocess.run([*argv, NODE6, DUAL6], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    explained = json.loads(done.stdout)
    assert explained["verdict"] == "translated"
    assert {c["backend"] for c in explained["candidates"]} == {
        "[fd00:244::12]:8080",
        "[fd00:244::13]:8080",
    }


def test_restart_adopts_the_ipv6_entries_and_rewrites_nothing(
    topology: Topology, cgroup: Cgroup, manifests6: Path, start_agent: AgentFactory
) -> None:
    """The IPv6 entries read back from the pinned maps are what was written: a restarted
    agent finds every frontend of both families as it wants it."""
    first = start_agent("--manifests", str(manifests6))
    frontends = first.status()["frontends"]
    first.stop()
    counts = served_by(topology.requests(topology.node_ns, "tcp", WEB6, 30, cgroup))
    assert len(counts) >= 2  # no agent: the programs and maps keep balancing
    second = start_agent("--manifests", str(manifests6))
    first_sync = second.status()["sync"]["first"]
    assert (first_sync["added"], first_sync["updated"], first_sync["removed"]) == (0, 0, 0)
    assert first_sync["unchanged"] == frontends
    assert second.metrics().value("ebpflb_maglev_slots_written_total") == 0


@pytest.mark.parametrize(
    ("target", "frontend", "slice_file"),
    [
        (DNS6, "[fd00:96::53]:53/UDP", "ipv6"),
        (DNS_MAPPED, "10.96.0.53:53/UDP", "dns"),
    ],
    ids=["ipv6", "ipv4-mapped"],
)
def test_connected_udp_socket_recovers_when_its_backend_leaves(
    topology: Topology,
    cgroup: Cgroup,
    manifests6: Path,
    start_agent: AgentFactory,
    bpffs: Path,
    target: str,
    frontend: str,
    slice_file: str,
) -> None:
    """test_semantics_udp's in-node twin for IPv6 sockets: connect() was translated once;
    when that backend leaves, the agent aborts the socket (SOCK_DESTROY finds IPv6 sockets
    too) and the client's new socket reaches a live backend."""
    start_agent("--manifests", str(manifests6))
    argv = [sys.executable, "-m", "lab.harness.echo", "udp-hold", target]
    argv += ["--pings", "40", "--interval", "0.1", "--timeout", "0.5"]
    proc = topology.spawn(topology.node_ns, argv, cgroup)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())["connected"]
        others = [pod for pod in PODS if pod != first]
        manifest = manifests6 / f"{slice_file}.yaml"
        text = manifest.read_text()
        gone = PODS6[first] if slice_file == "ipv6" else PODS[first]
        # The first pod's endpoint leaves the slice (in ipv6.yaml: dns6's slice only).
        head, sep, tail = text.partition(
            "name: dns6-a" if slice_file == "ipv6" else "kind: EndpointSlice"
        )
        endpoint = re.compile(rf'  - addresses: \["{re.escape(gone)}"\]\n(    .*\n)*')
        tail = endpoint.sub("", tail, count=1)
        manifest.write_text(head + sep + tail)
        left = {PODS6[p] if slice_file == "ipv6" else PODS[p] for p in others}
        wait_backends(bpffs, frontend, {f"[{a}]:5353" if ":" in a else f"{a}:5353" for a in left})
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    result = json.loads(out.splitlines()[-1])
    answers = result["answers"]
    assert result["sockets"] == 2, answers  # one abort, one new socket
    switched = next(i for i, a in enumerate(answers) if a in others)
    assert set(answers[:switched]) <= {first, "ECONNABORTED", "EDESTADDRREQ"}
    assert set(answers[switched:]) <= set(others), answers
    assert len(answers[switched:]) >= 5


def test_upgrade_from_ipv4_only_pins_keeps_ipv4_and_adds_ipv6(
    topology: Topology, cgroup: Cgroup, manifests6: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    """Pins of an ebpflb without IPv6 (no ebpflb_svc6, ebpflb_be6, ebpflb_revsk6): the
    IPv4 maps are adopted as they are (nothing rewritten) and the IPv6 maps are created."""
    first = start_agent("--manifests", str(manifests6))
    frontends = first.status()["frontends"]
    first.stop()
    for name in ("ebpflb_svc6", "ebpflb_be6", "ebpflb_revsk6"):
        (bpffs / name).unlink()
    second = start_agent("--manifests", str(manifests6))
    first_sync = second.status()["sync"]["first"]
    ipv6_frontends = first_sync["added"]
    assert 0 < ipv6_frontends < frontends  # the IPv6 ones, written again
    assert (first_sync["updated"], first_sync["removed"]) == (0, 0)
    assert first_sync["unchanged"] == frontends - ipv6_frontends  # every IPv4 one adopted
    assert set(served_by(topology.requests(topology.node_ns, "tcp", WEB6, 30, cgroup)))
    assert set(served_by(topology.requests(topology.node_ns, "tcp", "10.96.0.10:80", 30, cgroup)))


def test_session_affinity_holds_over_ipv6(
    topology: Topology, cgroup: Cgroup, manifests6: Path, start_agent: AgentFactory
) -> None:
    """sessionAffinity ClientIP on an IPv6 ClusterIP: every connection of the client (the
    node's network namespace) reaches one backend (the affinity maps are shared by both
    families, keyed by service id)."""
    (manifests6 / "sticky6.yaml").write_text(
        service_yaml("sticky6", ["fd00:96::30"], 80, "TCP").replace(
            "ipFamilyPolicy: SingleStack,",
            "ipFamilyPolicy: SingleStack, sessionAffinity: ClientIP,",
        )
        + slice_yaml("sticky6-a", "sticky6", "IPv6", "p", "TCP", list(PODS6.values()))
    )
    agent = start_agent("--manifests", str(manifests6))
    results = topology.requests(topology.node_ns, "tcp", "[fd00:96::30]:80", 60, cgroup)
    assert len(served_by(results)) == 1
    assert {r["peer"] for r in results} == {"[fd00:96::30]:80"}
    assert (agent.metrics().value("ebpflb_datapath_events_total", event="affinity_hit") or 0) >= 59


def test_ipv6_external_ip_reaches_in_node_clients_through_socket_lb(
    topology: Topology, cgroup: Cgroup, manifests6: Path, start_agent: AgentFactory
) -> None:
    """An IPv6 externalIP (inside --external-ip-cidrs) is translated for in-node clients by
    connect6 (its tc/XDP path is tests/kernel/nodeport/test_nodeport.py's)."""
    (manifests6 / "ext6.yaml").write_text(
        service_yaml("ext6", ["fd00:96::40"], 80, "TCP").replace(
            "ipFamilyPolicy: SingleStack,",
            "ipFamilyPolicy: SingleStack, externalIPs: ['2001:db8::40'],",
        )
        + slice_yaml("ext6-a", "ext6", "IPv6", "p", "TCP", list(PODS6.values()))
    )
    agent = start_agent("--manifests", str(manifests6), "--external-ip-cidrs", "2001:db8::/32")
    results = topology.requests(topology.node_ns, "tcp", "[2001:db8::40]:80", 30, cgroup)
    assert len(served_by(results)) >= 2
    assert {r["peer"] for r in results} == {"[2001:db8::40]:80"}
    # Nothing of it is left unserved now (tc/XDP programs IPv6 too): no such counter.
    assert agent.metrics().value("ebpflb_ipv6_skipped_total") is None
