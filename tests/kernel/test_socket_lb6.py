"""Socket-LB for IPv6 on the real kernel: the IPv6 twins of test_socket_lb.py, IPv4-mapped
destinations of dual-stack sockets, and one dual-stack Service serving both families at
once. Real programs, real sockets, namespaces with IPv6 addresses (fd00::/8, unique local)
this module creates; the client's (node) namespace has no route out: an address left
untranslated dies there.

Over 400 lines: a twin of every test_socket_lb.py test with an IPv6 meaning, and the
topology and manifests they need."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ebpflb.datapath import loader, probes
from ebpflb.datapath.kernel import KernelMapSet
from ebpflb.datapath.maps import MapName
from ebpflb.testing.agentproc import TIMEOUT_SCALE
from ebpflb.testing.netns import Cgroup, Topology, sh
from tests.kernel.conftest import PODS, TCP_PORT, UDP_PORT, AgentFactory, served_by, wait_backends

NODE6 = "fd00:1::1"
PODS6 = {"pod1": "fd00:244::11", "pod2": "fd00:244::12", "pod3": "fd00:244::13"}
WEB6 = "[fd00:96::10]:80"
DNS6 = "[fd00:96::53]:53"
PENDING6 = "[fd00:96::99]:80"
UDP_PENDING6 = "[fd00:96::98]:53"
# The IPv4 Services of examples/ as a dual-stack socket addresses them.
WEB_MAPPED = "[::ffff:10.96.0.10]:80"
DNS_MAPPED = "[::ffff:10.96.0.53]:53"
PENDING_MAPPED = "[::ffff:10.96.0.99]:80"
DUAL4, DUAL6 = "10.96.0.20:80", "[fd00:96::20]:80"


def _ipv6_on(netns: str, *interfaces: str) -> None:
    """IPv6 on, without duplicate address detection (an address is usable at once)."""
    settings = [
        f"net.ipv6.conf.{name}.{key}={value}"
        for name in ("all", "default", *interfaces)
        for key, value in (("disable_ipv6", 0), ("accept_dad", 0))
    ]
    sh("ip", "netns", "exec", netns, "sysctl", "-qw", *settings)


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    """test_socket_lb's topology with IPv6 too: the node holds NODE6, each pod its PODS6
    address next to its IPv4 one, routes on-link both ways and no route anywhere else;
    every pod serves TCP 8080 and UDP 5353 on both families."""
    topo = Topology.create()
    try:
        _ipv6_on(topo.node_ns)
        for index, (name, ip) in enumerate(PODS.items()):
            pod = topo.add_pod(name, ip)
            host_if = f"v{topo.prefix[-6:]}{index}"[:15]  # as Topology.add_pod names it
            _ipv6_on(topo.node_ns, host_if)
            _ipv6_on(pod.netns, "eth0")
            # The node's address on every pod link, so each pod finds it by neighbour
            # discovery on its own link.
            sh(
                "ip",
                "-n",
                topo.node_ns,
                "-6",
                "addr",
                "add",
                f"{NODE6}/128",
                "dev",
                host_if,
                "nodad",
            )
            sh(
                "ip",
                "-n",
                pod.netns,
                "-6",
                "addr",
                "add",
                f"{PODS6[name]}/128",
                "dev",
                "eth0",
                "nodad",
            )
            sh("ip", "-n", pod.netns, "-6", "route", "add", NODE6, "dev", "eth0")
            sh("ip", "-n", topo.node_ns, "-6", "route", "add", f"{PODS6[name]}/128", "dev", host_if)
            argv = [sys.executable, "-m", "ebpflb.testing.echo", "serve", "--name", name]
            argv += ["--tcp", str(TCP_PORT), "--udp", str(UDP_PORT), "--ipv6", "--lifetime", "900"]
            server = topo.spawn(pod.netns, argv)
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield topo
    finally:
        topo.close()


def _slice(
    name: str, service: str, family: str, port: str, protocol: str, addresses: list[str]
) -> str:
    endpoints = "".join(
        f'  - addresses: ["{a}"]\n    conditions: {{ready: true}}\n    nodeName: node-1\n'
        for a in addresses
    )
    return (
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
        f"metadata: {{name: {name}, labels: {{kubernetes.io/service-name: {service}}}}}\n"
        f"addressType: {family}\n"
        f"ports: [{{name: {port}, protocol: {protocol}, port: "
        f"{TCP_PORT if protocol == 'TCP' else UDP_PORT}}}]\n"
        + (f"endpoints:\n{endpoints}" if endpoints else "endpoints: []\n")
    )


def _service(name: str, ips: list[str], port: int, protocol: str) -> str:
    families = ", ".join("IPv6" if ":" in ip else "IPv4" for ip in ips)
    policy = "RequireDualStack" if len(ips) > 1 else "SingleStack"
    return (
        f"---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\n"
        f"spec: {{clusterIP: '{ips[0]}', clusterIPs: [{', '.join(repr(ip) for ip in ips)}],"
        f" ipFamilies: [{families}], ipFamilyPolicy: {policy},"
        f" ports: [{{name: p, protocol: {protocol}, port: {port}}}]}}\n"
    )


@pytest.fixture
def manifests6(manifests: Path) -> Path:
    """examples/ (IPv4 web, dns, pending) plus IPv6 web6, dns6, pending6, udp-pending6 and
    the dual-stack `dual` (IPv4 endpoints pod1, pod2; IPv6 endpoints pod2, pod3)."""
    pods6 = list(PODS6.values())
    (manifests / "ipv6.yaml").write_text(
        _service("web6", ["fd00:96::10"], 80, "TCP")
        + _slice("web6-a", "web6", "IPv6", "p", "TCP", pods6)
        + _service("dns6", ["fd00:96::53"], 53, "UDP")
        + _slice("dns6-a", "dns6", "IPv6", "p", "UDP", pods6)
        + _service("pending6", ["fd00:96::99"], 80, "TCP")
        + _service("udp-pending6", ["fd00:96::98"], 53, "UDP")
        + _service("dual", ["10.96.0.20", "fd00:96::20"], 80, "TCP")
        + _slice("dual-v4", "dual", "IPv4", "p", "TCP", [PODS["pod1"], PODS["pod2"]])
        + _slice("dual-v6", "dual", "IPv6", "p", "TCP", [PODS6["pod2"], PODS6["pod3"]])
    )
    return manifests


def _host(address: str) -> str:
    """The address of "IP:PORT" or "[IPv6]:PORT"."""
    return address.rpartition(":")[0].removeprefix("[").removesuffix("]")


def test_tcp_spreads_over_all_backends_and_peer_is_the_clusterip(
    topology: Topology, cgroup: Cgroup, manifests6: Path, start_agent: AgentFactory
) -> None:
    agent = start_agent("--manifests", str(manifests6))
    results = topology.requests(topology.node_ns, "tcp", WEB6, 300, cgroup)
    counts = served_by(results)
    assert set(counts) == set(PODS6)
    assert min(counts.values()) >= 60  # uniform would be 100 each; 60 is > 5 sigma away
    assert {r["peer"] for r in results} == {WEB6}  # getpeername6 shows the ClusterIP
    # The backends saw the node's own IPv6 address: no SNAT, no IPv4 anywhere.
    assert {_host(str(r["seen_as"])) for r in results} == {NODE6}
    # Per-frontend metrics name the IPv6 frontend as [address]:port.
    translated = agent.metrics().value(
        "ebpflb_service_socket_translations_total",
        service="default/web6",
        port="p",
        frontend="[fd00:96::10]:80",
        protocol="TCP",
    )
    assert translated == 300


def test_udp_reply_comes_from_the_clusterip(
    topology: Topology, cgroup: Cgroup, manifests6: Path, start_agent: AgentFactory
) -> None:
    start_agent("--manifests", str(manifests6))
    unconnected = topology.requests(topology.node_ns, "udp", DNS6, 90, cgroup)
    assert set(served_by(unconnected)) == set(PODS6)
    assert {r["peer"] for r in unconnected} == {DNS6}  # recvmsg6 source rewritten back
    connected = topology.requests(topology.node_ns, "udp", DNS6, 30, cgroup, "--connected")
    assert len(served_by(connected)) >= 2
    assert {r["peer"] for r in connected} == {DNS6}  # getpeername6 on connected UDP


def test_service_without_endpoints_refuses_tcp_and_udp(
    topology: Topology, cgroup: Cgroup, manifests6: Path, start_agent: AgentFactory
) -> None:
    start_agent("--manifests", str(manifests6))
    expected = "ECONNREFUSED" if loader.probe_features().set_retval else "EPERM"
    started = time.monotonic()
    tcp = topology.requests(topology.node_ns, "tcp", PENDING6, 3, cgroup, timeout=5.0)
    assert [r.get("error") for r in tcp] == [expected] * 3
    udp = topology.requests(topology.node_ns, "udp", UDP_PENDING6, 2, cgroup, timeout=5.0)
    assert [r.get("error") for r in udp] == [expected] * 2
    # Refused at once, not after a timeout (5 requests of 5 s each).
    assert time.monotonic() - started < 5.0 * min(TIMEOUT_SCALE, 2.0)
    # An IPv6 address that is no frontend is left alone: no route out of the namespace.
    (result,) = topology.requests(topology.node_ns, "tcp", "[fd00:96::10]:81", 1, cgroup)
    assert result["error"] == "ENETUNREACH"


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
    assert {_host(str(r["seen_as"])) for r in results} == {topology.node_ip}
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
    assert {_host(str(r["seen_as"])) for r in results[DUAL6]} == {NODE6}
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
    argv = [sys.executable, "-m", "ebpflb.testing.echo", "udp-hold", target]
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
        _service("sticky6", ["fd00:96::30"], 80, "TCP").replace(
            "ipFamilyPolicy: SingleStack,",
            "ipFamilyPolicy: SingleStack, sessionAffinity: ClientIP,",
        )
        + _slice("sticky6-a", "sticky6", "IPv6", "p", "TCP", list(PODS6.values()))
    )
    agent = start_agent("--manifests", str(manifests6))
    results = topology.requests(topology.node_ns, "tcp", "[fd00:96::30]:80", 60, cgroup)
    assert len(served_by(results)) == 1
    assert {r["peer"] for r in results} == {"[fd00:96::30]:80"}
    assert (agent.metrics().value("ebpflb_datapath_events_total", event="affinity_hit") or 0) >= 59


@pytest.mark.parametrize("storage", ["socket-storage", "lru"])
def test_tcp_reverse_entries_live_in_the_socket_or_in_the_lru(
    topology: Topology,
    cgroup: Cgroup,
    manifests6: Path,
    start_agent: AgentFactory,
    bpffs: Path,
    storage: str,
) -> None:
    """test_socket_lb's twin: with socket storage an IPv6 TCP connect() inserts nothing
    into ebpflb_revsk6 (the entry lives in the socket, ebpflb_sockrev6); without it, one
    entry per socket. getpeername6 shows the ClusterIP either way; UDP keeps the LRU."""
    in_socket = storage == "socket-storage"
    if in_socket and not probes.probe().has("sk_storage_sock_addr"):
        pytest.skip("this kernel has no bpf_sk_storage_get in sock_addr programs")
    start_agent("--manifests", str(manifests6), f"--socket-storage={str(in_socket).lower()}")
    with KernelMapSet(bpffs) as maps:
        before = maps.counters()
        results = topology.requests(topology.node_ns, "tcp", WEB6, 40, cgroup)
        assert len(served_by(results)) == 3
        assert {r["peer"] for r in results} == {WEB6}
        after = maps.counters()
        assert after["peer_xlated"] - before["peer_xlated"] >= 40
        assert after["revsk_update_fail"] == before["revsk_update_fail"]
        lingering = maps.count_entries(MapName.REVERSE_SOCK6)
        assert lingering == 0 if in_socket else lingering >= 40
        udp = topology.requests(topology.node_ns, "udp", DNS6, 6, cgroup, "--connected")
        assert {r["peer"] for r in udp} == {DNS6}
        assert maps.count_entries(MapName.REVERSE_SOCK6) >= lingering + 6


def test_ipv6_external_ip_reaches_in_node_clients_through_socket_lb(
    topology: Topology, cgroup: Cgroup, manifests6: Path, start_agent: AgentFactory
) -> None:
    """An IPv6 externalIP (inside --external-ip-cidrs) is translated for in-node clients by
    connect6 (its tc/XDP path is tests/kernel/test_nodeport.py's)."""
    (manifests6 / "ext6.yaml").write_text(
        _service("ext6", ["fd00:96::40"], 80, "TCP").replace(
            "ipFamilyPolicy: SingleStack,",
            "ipFamilyPolicy: SingleStack, externalIPs: ['2001:db8::40'],",
        )
        + _slice("ext6-a", "ext6", "IPv6", "p", "TCP", list(PODS6.values()))
    )
    agent = start_agent("--manifests", str(manifests6), "--external-ip-cidrs", "2001:db8::/32")
    results = topology.requests(topology.node_ns, "tcp", "[2001:db8::40]:80", 30, cgroup)
    assert len(served_by(results)) >= 2
    assert {r["peer"] for r in results} == {"[2001:db8::40]:80"}
    # Nothing of it is left unserved now (tc/XDP programs IPv6 too): no such counter.
    assert agent.metrics().value("ebpflb_ipv6_skipped_total") is None
