"""Socket-LB on the real kernel: real programs, real sockets, real namespaces. What holds
for both IP families runs for each (`family`: the addresses, topology and maps of one,
conftest.py); what only IPv4 shows follows, and test_socket_lb6.py has what only IPv6 has
(IPv4-mapped destinations, dual-stack Services, upgrades from IPv4-only pins)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ebpflb.datapath import probes
from ebpflb.datapath.maps import MapName
from ebpflb.datapath.maps.kernel import KernelMapSet
from ebpflb.datapath.programs import loader
from lab.harness.agentproc import TIMEOUT_SCALE, cleanup_datapath
from lab.harness.netns import Cgroup, Topology
from tests.kernel.conftest import (
    PODS,
    AgentFactory,
    programs_but_headers,
    served_by,
    wait_backends,
)
from tests.kernel.socketlb.conftest import FAMILIES, IPV4, Family, host_of

WEB = "10.96.0.10:80"
DNS = "10.96.0.53:53"


def family_setup(request: pytest.FixtureRequest, family: Family) -> tuple[Topology, Path]:
    """The family's topology (module-scoped) and this test's manifests directory."""
    return request.getfixturevalue(family.topology), request.getfixturevalue(family.manifests)


@FAMILIES
def test_tcp_spreads_over_all_backends_and_peer_is_the_clusterip(
    family: Family, request: pytest.FixtureRequest, cgroup: Cgroup, start_agent: AgentFactory
) -> None:
    topology, manifests = family_setup(request, family)
    agent = start_agent("--manifests", str(manifests))
    results = topology.requests(topology.node_ns, "tcp", family.web, 300, cgroup)
    counts = served_by(results)
    assert set(counts) == set(family.pods)
    assert min(counts.values()) >= 60  # uniform would be 100 each; 60 is > 5 sigma away
    assert {r["peer"] for r in results} == {family.web}  # getpeername() shows the ClusterIP
    # The backends saw the node's own address of the family: socket-LB needs no SNAT.
    assert {host_of(str(r["seen_as"])) for r in results} == {family.node_address(topology)}
    # Per-frontend metrics name the frontend (an IPv6 one as [address]:port).
    service, port, frontend = family.metric_frontend
    translated = agent.metrics().value(
        "ebpflb_service_socket_translations_total",
        service=service,
        port=port,
        frontend=frontend,
        protocol="TCP",
    )
    assert translated == 300


@FAMILIES
def test_udp_reply_comes_from_the_clusterip(
    family: Family, request: pytest.FixtureRequest, cgroup: Cgroup, start_agent: AgentFactory
) -> None:
    topology, manifests = family_setup(request, family)
    start_agent("--manifests", str(manifests))
    unconnected = topology.requests(topology.node_ns, "udp", family.dns, 90, cgroup)
    assert set(served_by(unconnected)) == set(family.pods)
    assert {r["peer"] for r in unconnected} == {family.dns}  # recvmsg() source rewritten back
    connected = topology.requests(topology.node_ns, "udp", family.dns, 30, cgroup, "--connected")
    assert len(served_by(connected)) >= 2
    assert {r["peer"] for r in connected} == {family.dns}  # getpeername() on connected UDP


@FAMILIES
def test_service_without_endpoints_refuses_tcp_and_udp(
    family: Family,
    request: pytest.FixtureRequest,
    cgroup: Cgroup,
    start_agent: AgentFactory,
    bpffs: Path,
) -> None:
    topology, manifests = family_setup(request, family)
    start_agent("--manifests", str(manifests))
    features = loader.probe_features()
    expected = "ECONNREFUSED" if features.set_retval else "EPERM"
    if family is IPV4:  # examples/ has no UDP Service without endpoints (manifests6 has)
        (manifests / "udp-pending.yaml").write_text(
            "apiVersion: v1\nkind: Service\nmetadata: {name: udp-pending}\n"
            "spec: {clusterIP: 10.96.0.98, ports: [{name: d, protocol: UDP, port: 53}]}\n"
        )
        wait_backends(bpffs, "10.96.0.98:53/UDP", set())  # programmed, with no backend
    started = time.monotonic()
    tcp = topology.requests(topology.node_ns, "tcp", family.pending, 3, cgroup, timeout=5.0)
    assert [r.get("error") for r in tcp] == [expected] * 3
    udp = topology.requests(topology.node_ns, "udp", family.udp_pending, 2, cgroup, timeout=5.0)
    assert [r.get("error") for r in udp] == [expected] * 2
    # Refused at once, not after a timeout (5 requests of 5 s each; each error above is the
    # refusal, a timeout's would differ). Under emulation (the kernel matrix) the two
    # clients' start-up alone took 6-10 s, under 2 s here.
    assert time.monotonic() - started < 5.0 * min(TIMEOUT_SCALE, 4.0)


@FAMILIES
def test_uncovered_clusterip_is_not_translated(
    family: Family, request: pytest.FixtureRequest, cgroup: Cgroup, start_agent: AgentFactory
) -> None:
    topology, manifests = family_setup(request, family)
    start_agent("--manifests", str(manifests))
    (result,) = topology.requests(topology.node_ns, "tcp", family.uncovered, 1, cgroup)
    assert result["error"] == "ENETUNREACH"  # left alone: dies in the namespace, no route out


@pytest.mark.parametrize("storage", ["socket-storage", "lru"])
@FAMILIES
def test_tcp_reverse_entries_live_in_the_socket_or_in_the_lru(
    family: Family,
    request: pytest.FixtureRequest,
    cgroup: Cgroup,
    start_agent: AgentFactory,
    bpffs: Path,
    storage: str,
) -> None:
    """getpeername() shows the ClusterIP either way; with --socket-storage=true (where the
    kernel allows it) a TCP connect() inserts nothing into the family's LRU (ebpflb_revsk4,
    ebpflb_revsk6: the entry lives in the socket, ebpflb_sockrev4/6), and a closed socket
    leaves nothing behind; without it (the default, and the fallback of kernels without
    bpf_sk_storage_get in sock_addr programs) one entry per socket is there."""
    in_socket = storage == "socket-storage"
    if in_socket and not probes.probe().has("sk_storage_sock_addr"):
        pytest.skip("this kernel has no bpf_sk_storage_get in sock_addr programs")
    topology, manifests = family_setup(request, family)
    start_agent("--manifests", str(manifests), f"--socket-storage={str(in_socket).lower()}")
    with KernelMapSet(bpffs) as maps:
        before = maps.counters()
        results = topology.requests(topology.node_ns, "tcp", family.web, 40, cgroup)
        assert len(served_by(results)) == 3
        assert {r["peer"] for r in results} == {family.web}
        after = maps.counters()
        assert after["peer_xlated"] - before["peer_xlated"] >= 40
        assert after["revsk_update_fail"] == before["revsk_update_fail"]
        lingering = maps.count_entries(family.reverse_sock)
        assert lingering == 0 if in_socket else lingering >= 40
        # UDP keeps the LRU in both modes (one socket may send to many services).
        udp = topology.requests(topology.node_ns, "udp", family.dns, 6, cgroup, "--connected")
        assert {r["peer"] for r in udp} == {family.dns}
        assert maps.count_entries(family.reverse_sock) >= lingering + 6


# ---- IPv4 only ---------------------------------------------------------------------------


def test_manifest_edit_moves_traffic_within_a_second(
    topology: Topology,
    cgroup: Cgroup,
    manifests: Path,
    start_agent: AgentFactory,
    bpffs: Path,
    record_property: Callable[[str, object], None],
) -> None:
    agent = start_agent("--manifests", str(manifests))
    slots_before = agent.metrics().value("ebpflb_maglev_slots_written_total")
    web = manifests / "web.yaml"
    web.write_text(
        web.read_text().replace(
            '  - addresses: ["10.244.1.13"]\n    conditions: {ready: true}',
            '  - addresses: ["10.244.1.13"]\n    conditions: {ready: false}',
        )
    )
    edited = time.monotonic()
    status = agent.wait_status(
        lambda s: s["frontend_changes"]["updated"] == 1, "applying the edit", timeout=5
    )
    record_property("edit_to_applied_seconds", round(time.monotonic() - edited, 3))
    assert time.monotonic() - edited < 1.0
    last = status["sync"]["last"]
    assert (last["kind"], last["updated"], last["added"], last["removed"]) == (
        "incremental",
        1,
        0,
        0,
    )
    wait_backends(bpffs, "10.96.0.10:80/TCP", {"10.244.1.11:8080", "10.244.1.12:8080"})
    # Only the changed slots were written: about a third of the table.
    written = agent.metrics().value("ebpflb_maglev_slots_written_total")
    assert slots_before is not None and written is not None
    assert 0 < written - slots_before < 509 / 2
    counts = served_by(topology.requests(topology.node_ns, "tcp", WEB, 100, cgroup))
    assert set(counts) == {"pod1", "pod2"}


def test_restart_keeps_traffic_flowing_and_rewrites_nothing(
    topology: Topology, cgroup: Cgroup, manifests: Path, start_agent: AgentFactory
) -> None:
    first = start_agent("--manifests", str(manifests))
    first.stop()
    # No agent: the programs and maps stay, so traffic keeps being balanced.
    counts = served_by(topology.requests(topology.node_ns, "tcp", WEB, 60, cgroup))
    assert len(counts) == 3
    second = start_agent("--manifests", str(manifests))
    status = second.status()
    first_sync = status["sync"]["first"]
    # It adopted the pinned state: every frontend found right, nothing rewritten.
    assert (first_sync["added"], first_sync["updated"], first_sync["removed"]) == (0, 0, 0)
    assert first_sync["unchanged"] == 3
    assert second.metrics().value("ebpflb_maglev_slots_written_total") == 0
    # The pinned programs were adopted as they were: still attached, nothing replaced.
    assert programs_but_headers(status) == {
        "replaced_previous": 0,
        "origin": {"socket_lb": "adopted"},
    }
    attached = loader.attached_programs(cgroup.path)
    assert sorted(name for _, name in attached) == [
        "ebpflb_connect4",
        "ebpflb_connect6",
        "ebpflb_getpeer4",
        "ebpflb_getpeer6",
        "ebpflb_recvmsg4",
        "ebpflb_recvmsg6",
        "ebpflb_sendmsg4",
        "ebpflb_sendmsg6",
    ]


def test_bad_input_is_named_and_skipped(
    topology: Topology, cgroup: Cgroup, manifests: Path, start_agent: AgentFactory
) -> None:
    (manifests / "bad.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: broken-ip}\n"
        "spec: {clusterIP: 10.96.0.300, ports: [{port: 80}]}\n"
        "---\nkind: [this is not yaml\n"
        "---\napiVersion: v1\nkind: Service\nmetadata: {name: bad-port}\n"
        "spec: {clusterIP: 10.96.0.77, ports: [{name: x, port: 70000}]}\n"
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
        "metadata: {name: orphan-1, labels: {kubernetes.io/service-name: nobody}}\n"
        "addressType: IPv4\nendpoints: [{addresses: [10.244.1.11]}]\n"
    )
    agent = start_agent("--manifests", str(manifests))
    problems = agent.status()["problems"]
    invalid = {(p["kind"], p["name"]): p["error"] for p in problems["invalid_objects"]}
    assert set(invalid) == {("Service", "default/broken-ip"), ("Service", "default/bad-port")}
    assert invalid["Service", "default/broken-ip"].startswith(
        "Service default/broken-ip: spec.clusterIP '10.96.0.300'"
    )
    assert invalid["Service", "default/bad-port"].startswith(
        "Service default/bad-port: spec.ports[0].port 70000"
    )
    (source_error,) = problems["source_errors"]
    assert source_error.startswith(f"{manifests / 'bad.yaml'} document 2: invalid YAML")
    assert problems["orphan_slices"] == [{"slice": "default/orphan-1", "service": "default/nobody"}]
    assert agent.metrics().sum("ebpflb_invalid_objects_total", kind="Service") == 2
    assert len(served_by(topology.requests(topology.node_ns, "tcp", WEB, 30, cgroup))) >= 2


def test_maps_dump_reads_the_pins_without_an_agent(
    cgroup: Cgroup, manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    start_agent("--manifests", str(manifests)).stop()
    done = subprocess.run(
        [sys.executable, "-m", "ebpflb", "maps", "dump", "--bpffs", str(bpffs), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(done.stdout)
    by_frontend = {s["frontend"]: s for s in report["services"]}
    web = by_frontend["10.96.0.10:80/TCP"]
    assert (web["service"], web["type"]) == ("default/web:http", "ClusterIP")
    assert sorted(b["address"] for b in web["backends"]) == [f"{ip}:8080" for ip in PODS.values()]
    assert sum(b["slots"] for b in web["backends"]) == web["maglev"]["table_size"]
    assert by_frontend["10.96.0.99:80/TCP"]["backends"] == []
    text = subprocess.run(
        [sys.executable, "-m", "ebpflb", "maps", "dump", "--bpffs", str(bpffs)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "10.96.0.53:53/UDP  kube-system/dns:dns" in text


def test_maps_dump_without_pins_fails_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ebpflb", "maps", "dump", "--bpffs", str(tmp_path / "none")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"ebpflb: no ebpflb maps pinned under {tmp_path / 'none'}"
    ]


def attached(cgroup: Path) -> str:
    """What `bpftool cgroup show` lists on the cgroup. Bookworm's bpftool 7.1 sends query
    flags that kernels before 6.0 reject (EINVAL, exit 255): there, ebpflb's own query
    (the BPF_PROG_QUERY syscall, independent of bpftool) stands in."""
    show = subprocess.run(
        ["bpftool", "cgroup", "show", str(cgroup)], capture_output=True, text=True
    )
    if show.returncode == 0:
        return show.stdout.strip()
    assert tuple(map(int, os.uname().release.split(".")[:2])) < (6, 0), show.stderr
    return "\n".join(name for _, name in loader.attached_programs(cgroup))


def test_cleanup_leaves_nothing_attached_or_pinned(
    cgroup: Cgroup, manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    start_agent("--manifests", str(manifests)).stop()
    assert "ebpflb_connect4" in attached(cgroup.path)  # left attached on exit, on purpose
    done = cleanup_datapath(bpffs, cgroup.path)
    assert done.returncode == 0, done.stderr
    assert "detached 8 programs" in done.stdout  # 4 hooks per family
    # The maps, the socket-LB programs pinned next to them, and the layout record.
    assert f"removed {len(MapName) + len(loader.SockHook) + 1} pins" in done.stdout
    assert attached(cgroup.path) == ""
    assert not bpffs.exists()
    assert os.path.isdir(cgroup.path)  # our cgroup itself stays until the fixture removes it


def test_a_removed_backend_is_an_empty_array_element_the_datapath_never_uses(
    topology: Topology, cgroup: Cgroup, manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    """ebpflb_be4 is an array: removing a backend writes an all-zero element, which `maps
    dump` and the programs treat as absent. Even a slot still naming such an id (only a
    control-plane ordering bug could leave one) refuses the connect() and counts slot_miss:
    it never sends a socket to 0.0.0.0:0."""
    agent = start_agent("--manifests", str(manifests))
    web = manifests / "web.yaml"
    web.write_text(
        web.read_text().replace(
            '  - addresses: ["10.244.1.13"]\n    conditions: {ready: true}\n    nodeName: node-1\n',
            "",
        )
    )
    wait_backends(bpffs, "10.96.0.10:80/TCP", {"10.244.1.11:8080", "10.244.1.12:8080"})
    with KernelMapSet(bpffs) as maps:
        ids = {str(e.backend): i for i, e in maps.backends.items()}
        # dns still uses 10.244.1.13 (port 5353); web's 10.244.1.13:8080 is gone.
        assert "10.244.1.13:8080" not in ids and "10.244.1.13:5353" in ids
        assert len(maps.backends) == 5
        agent.stop()  # the programs stay attached; nothing rewrites the maps now
        gone = ids["10.244.1.12:8080"]
        assert maps.backends.delete(gone) and maps.backends.get(gone) is None
        assert not any(bytes(maps.backends4.get_raw(gone)))  # the element is there, zeroed
        before = maps.counters()
        results = topology.requests(topology.node_ns, "tcp", WEB, 60, cgroup, timeout=5.0)
        refused = [r for r in results if not r["ok"]]
        assert {r["server"] for r in results if r["ok"]} == {"pod1"}
        assert refused and {r.get("error") for r in refused} <= {"ECONNREFUSED", "EPERM"}
        assert maps.counters()["slot_miss"] - before["slot_miss"] == len(refused)
