"""NodePort, LoadBalancer and external IPs through the tc programs, between namespaces,
on twonode.py's dual-stack two-node cluster (once in tc, once in native XDP): each IPv4
test, and its IPv6 twin where IPv6 gives it a meaning; a dual-stack Service serving both
families at once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from lab.harness.agentproc import TIMEOUT_SCALE, AgentProcess, cleanup_datapath
from lab.harness.cluster import Cluster
from lab.harness.netns import Cgroup
from tests.kernel.conftest import served_by, wait_backends
from tests.kernel.twonode import (
    ALL_PODS,
    CLIENT,
    CLIENT6,
    EXTERNAL_IP,
    EXTERNAL_IP6,
    LB_IP,
    LB_IP6,
    NODE1,
    NODE1_6,
    NODE2,
    NODE2_6,
    NP_PORTS,
    SLICES,
    SNAT_RANGE,
    Env,
    http_get,
    seen_ip,
    slice_yaml,
    write_manifests,
    xdp_tx_packets,
)


def test_nodeport_reaches_pods_on_both_nodes_with_snat_for_remote_ones(env: Env) -> None:
    xdp_before = xdp_tx_packets(env)
    tcp = env.cluster.requests(env.client, "tcp", f"{NODE1}:30080", 60, None)
    assert set(served_by(tcp)) == {"pod11", "pod12", "pod21", "pod22"}
    assert {r["peer"] for r in tcp} == {f"{NODE1}:30080"}  # replies come from node1:nodePort
    for r in tcp:
        # A pod on node2 sees node1's address (SNAT); a pod on node1 sees the client.
        assert seen_ip(r) == (NODE1 if str(r["server"]).startswith("pod2") else CLIENT), r
    udp = env.cluster.requests(env.client, "udp", f"{NODE1}:30053", 60, None)
    assert set(served_by(udp)) == {"pod11", "pod12", "pod21", "pod22"}
    assert {r["peer"] for r in udp} == {f"{NODE1}:30053"}
    for r in udp:
        assert seen_ip(r) == (NODE1 if str(r["server"]).startswith("pod2") else CLIENT), r
    # Under native XDP the SNATed flows' packets were forwarded by XDP itself (XDP_TX).
    assert (xdp_tx_packets(env) - xdp_before > 50) == env.xdp


def held_connection(
    env: Env, frontend: str, wanted: Callable[[str], bool], attempts: int = 20
) -> subprocess.Popen[str]:
    """A TCP connection from the client to `frontend`, held open (pinged every 0.5 s for
    up to 60 s, scaled), whose backend pod `wanted` accepts: new connections until one
    lands there (Maglev picks by the client's port), the others closed at once."""
    pings = ["--pings", str(int(120 * TIMEOUT_SCALE)), "--interval", "0.5"]
    argv = [sys.executable, "-m", "lab.harness.echo", "tcp-hold", frontend, *pings]
    for _ in range(attempts):
        proc = env.cluster.spawn(env.client, argv)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line and wanted(json.loads(line)["connected"]):
            return proc
        proc.kill()
        proc.communicate(timeout=30)
    raise AssertionError(f"no connection to {frontend} reached the wanted pod in {attempts}")


def test_ipv6_nodeport_reaches_pods_on_both_nodes_with_snat_for_remote_ones(env: Env) -> None:
    xdp_before = xdp_tx_packets(env)
    for proto, port in (("tcp", 30080), ("udp", 30053)):
        frontend = f"[{NODE1_6}]:{port}"
        results = env.cluster.requests(env.client, proto, frontend, 60, None)
        assert set(served_by(results)) == {"pod11", "pod12", "pod21", "pod22"}, proto
        assert {r["peer"] for r in results} == {frontend}  # replies come from the frontend
        for r in results:
            # node2's pods see node1's IPv6 address (SNAT), node1's the client's.
            remote = str(r["server"]).startswith("pod2")
            assert seen_ip(r) == (NODE1_6 if remote else CLIENT6), r
    assert (xdp_tx_packets(env) - xdp_before > 50) == env.xdp
    # The flows and their reply translations, as `maps dump` shows them, while a SNATed
    # connection is open: the agent deletes a closed connection's reply translation 10 s
    # after its close (EBPFLB_CT_TCP_CLOSE_TIMEOUT), sooner than an emulated 5.10 guest
    # gets from the requests above to the dump.
    held = held_connection(env, f"[{NODE1_6}]:30080", lambda pod: pod.startswith("pod2"))
    try:
        report = env.nodes["node1"].dump("--frontend", f"[{NODE1_6}]:30080/TCP")
    finally:
        held.kill()
        held.communicate(timeout=30)
    flows = [f for f in report["conntrack"] if f["frontend"] == f"[{NODE1_6}]:30080"]  # type: ignore[union-attr,index]
    assert flows and all(f["client"].startswith(f"[{CLIENT6}]:") for f in flows)
    snat = [f for f in flows if f["snat"]]
    assert snat and all(f["snat"].startswith(f"[{NODE1_6}]:") for f in snat)
    assert all(f["backend"].startswith("[fd00:244:2::") for f in snat)
    nat = report["nat"]
    assert any(n["snat"] and n["frontend"] == f"[{NODE1_6}]:30080" for n in nat)  # type: ignore[union-attr,index]


def test_ipv6_no_endpoint_anywhere_is_rejected_at_once(env: Env) -> None:
    """kube-proxy's REJECT over IPv6: an ICMPv6 port unreachable answers TCP and UDP alike,
    and the client fails at once (ECONNREFUSED) instead of timing out."""
    before = env.nodes["node1"].counter("np_reject")
    started = time.monotonic()
    tcp = env.cluster.requests(env.client, "tcp", f"[{NODE1_6}]:30097", 3, None, timeout=3.0)
    udp = env.cluster.requests(
        env.client, "udp", f"[{NODE1_6}]:30096", 3, None, "--connected", timeout=3.0
    )
    # ECONNREFUSED is the reject (a dropped packet times out); on the host the six requests
    # take well under their 3 s timeouts, under emulation the two clients' start-up alone
    # takes seconds.
    assert [r.get("error") for r in tcp + udp] == ["ECONNREFUSED"] * 6
    assert time.monotonic() - started < 6.0 * TIMEOUT_SCALE
    assert env.nodes["node1"].counter("np_reject") >= before + 6


def test_local_policy_keeps_client_address_and_only_nodes_with_endpoints_serve(env: Env) -> None:
    via_node1 = env.cluster.requests(env.client, "tcp", f"{NODE1}:30081", 10, None)
    assert served_by(via_node1) == {"pod11": 10}
    assert {seen_ip(r) for r in via_node1} == {CLIENT}  # no SNAT: the source is preserved
    via_node2 = env.cluster.requests(env.client, "tcp", f"{NODE2}:30081", 2, None, timeout=1.0)
    assert [r["ok"] for r in via_node2] == [False, False]  # node2 has no local pod: no forward
    assert env.nodes["node2"].counter("np_no_backend") >= 2
    status, body = http_get(env, f"http://{NODE1}:32100/")
    assert (status, body["localEndpoints"]) == (200, 1)
    assert body["service"] == {"namespace": "default", "name": "local"}
    status, body = http_get(env, f"http://{NODE2}:32100/")
    assert (status, body["localEndpoints"]) == (503, 0)


def test_ipv6_local_policy_keeps_client_address_and_only_nodes_with_endpoints_serve(
    env: Env,
) -> None:
    via_node1 = env.cluster.requests(env.client, "tcp", f"[{NODE1_6}]:30081", 10, None)
    assert served_by(via_node1) == {"pod11": 10}
    assert {seen_ip(r) for r in via_node1} == {CLIENT6}
    before = env.nodes["node2"].counter("np_no_backend")
    via_node2 = env.cluster.requests(env.client, "tcp", f"[{NODE2_6}]:30081", 2, None, timeout=1.0)
    assert [r["ok"] for r in via_node2] == [False, False]
    assert env.nodes["node2"].counter("np_no_backend") >= before + 2


def test_loadbalancer_and_external_ip_with_source_ranges(env: Env) -> None:
    lb = env.cluster.requests(env.client, "tcp", f"{LB_IP}:80", 20, None)
    assert len(served_by(lb)) >= 3 and {r["peer"] for r in lb} == {f"{LB_IP}:80"}
    ext = env.cluster.requests(env.outsider, "tcp", f"{EXTERNAL_IP}:80", 20, None)
    assert len(served_by(ext)) >= 3 and {r["peer"] for r in ext} == {f"{EXTERNAL_IP}:80"}
    before = env.nodes["node1"].counter("src_range_drop")
    blocked = env.cluster.requests(env.outsider, "tcp", f"{LB_IP}:80", 2, None, timeout=1.0)
    assert [r["ok"] for r in blocked] == [False, False]
    assert env.nodes["node1"].counter("src_range_drop") >= before + 2


def test_ipv6_loadbalancer_and_external_ip_with_source_ranges(env: Env) -> None:
    lb = env.cluster.requests(env.client, "tcp", f"[{LB_IP6}]:80", 20, None)
    assert len(served_by(lb)) >= 3 and {r["peer"] for r in lb} == {f"[{LB_IP6}]:80"}
    ext = env.cluster.requests(env.outsider, "tcp", f"[{EXTERNAL_IP6}]:80", 20, None)
    assert len(served_by(ext)) >= 3 and {r["peer"] for r in ext} == {f"[{EXTERNAL_IP6}]:80"}
    before = env.nodes["node1"].counter("src_range_drop")
    blocked = env.cluster.requests(env.outsider, "tcp", f"[{LB_IP6}]:80", 2, None, timeout=1.0)
    assert [r["ok"] for r in blocked] == [False, False]
    assert env.nodes["node1"].counter("src_range_drop") >= before + 2


def test_dual_stack_nodeport_serves_both_families_at_once(env: Env) -> None:
    """One Service, its IPv4 and IPv6 nodePort frontends loaded together: each family's
    clients reach every pod through their own family's addresses."""
    frontends = {4: f"{NODE1}:30080", 6: f"[{NODE1_6}]:30080"}
    clients = {4: CLIENT, 6: CLIENT6}
    echo = [sys.executable, "-m", "lab.harness.echo", "tcp"]
    procs = {
        family: env.cluster.spawn(env.client, [*echo, frontend, "--count", "80", "--timeout", "1"])
        for family, frontend in frontends.items()
    }
    for family, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results = [json.loads(line) for line in out.splitlines() if line.strip()]
        assert set(served_by(results)) == {"pod11", "pod12", "pod21", "pod22"}, family
        assert {r["peer"] for r in results} == {frontends[family]}
        local = [r for r in results if str(r["server"]).startswith("pod1")]
        assert {seen_ip(r) for r in local} == {clients[family]}


def test_long_connection_keeps_its_backend_while_backends_change(env: Env) -> None:
    node1 = env.nodes["node1"]
    assert node1.agent is not None
    proc = env.cluster.spawn(
        env.client,
        [
            sys.executable,
            "-m",
            "lab.harness.echo",
            "tcp-hold",
            f"{NODE1}:30080",
            "--pings",
            "25",
            "--interval",
            "0.15",
        ],
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())["connected"]
        # Remove the connection's own backend and two others, then bring them back.
        remaining = [p for p in ALL_PODS if p[0] not in {first, "pod12", "pod22"}] or ALL_PODS[3:]
        write_manifests(
            node1.manifests,
            {**SLICES, "np": slice_yaml("np-1", "np", NP_PORTS, remaining)},
        )
        frontend = f"{NODE1}:30080/TCP"
        wait_backends(node1.bpffs, frontend, {f"{ip}:8080" for _, ip, _ in remaining})
        time.sleep(1.0)
        write_manifests(node1.manifests)
        wait_backends(node1.bpffs, frontend, {f"{ip}:8080" for _, ip, _ in ALL_PODS})
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    result = json.loads(out.splitlines()[-1])
    assert result["ok"], result
    assert set(result["answers"]) == {first} and len(result["answers"]) == 26


@pytest.mark.parametrize("offload", [True, False], ids=["csum-offload", "no-offload"])
def test_checksums_with_and_without_offload(env: Env, offload: bool) -> None:
    """Partial (offloaded) and complete checksums from the client and on the node's own
    transmissions, over IPv4 and IPv6. Under native XDP the senders model a wire (complete
    checksums, see Cluster.wire_like), so only the node's side is switched."""
    switched = [env.cluster.nodes["node1"].netns] + ([] if env.xdp else [env.client])
    for netns in switched:
        env.cluster.offload(netns, "eth0", offload)
    try:
        for node in (NODE1, f"[{NODE1_6}]"):
            tcp = env.cluster.requests(env.client, "tcp", f"{node}:30080", 20, None)
            udp = env.cluster.requests(env.client, "udp", f"{node}:30053", 20, None)
            assert len(served_by(tcp)) >= 3 and len(served_by(udp)) >= 3, node
    finally:
        for netns in switched:
            env.cluster.offload(netns, "eth0", True)


def test_host_processes_reach_nodeport_and_lb_ip_through_socket_lb(env: Env) -> None:
    node1 = env.nodes["node1"]
    targets = (f"{NODE1}:30080", "127.0.0.1:30080", f"{LB_IP}:80", f"{EXTERNAL_IP}:80")
    targets6 = (f"[{NODE1_6}]:30080", f"[{LB_IP6}]:80", f"[{EXTERNAL_IP6}]:80")  # no [::1]
    for target in targets + targets6:
        results = env.cluster.requests(node1.netns, "tcp", target, 10, node1.cgroup)
        assert len(served_by(results)) >= 2, target
        assert {r["peer"] for r in results} == {target}


def test_snat_exhaustion_is_counted_and_never_mistranslates(
    env: Env, record_property: Callable[[str, object], None]
) -> None:
    node1 = env.nodes["node1"]
    before = node1.counter("snat_exhausted")
    (burst,) = env.cluster.echo(
        env.client, "udp-burst", f"{NODE1}:30090", "--count", "2000", "--timeout", "2"
    )
    record_property("burst", json.dumps(burst))
    assert burst["sent"] == 2000
    assert burst["mismatched"] == 0
    # 64 ports per backend, two backends (both on node2, so every flow needs SNAT).
    assert 0 < burst["answered"] <= 128
    assert set(burst["servers"]) <= {"pod21", "pod22"}
    assert node1.counter("snat_exhausted") - before >= 2000 - 128
    assert node1.agent is not None and node1.agent.proc.poll() is None  # still running
    # Established flows are unaffected by the exhaustion of another backend port.
    assert len(served_by(env.cluster.requests(env.client, "tcp", f"{NODE1}:30080", 10, None))) >= 2


def test_maps_dump_shows_conntrack_and_nat(env: Env) -> None:
    env.cluster.requests(env.client, "tcp", f"{NODE1}:30080", 20, None)
    report = env.nodes["node1"].dump()
    flows = [f for f in report["conntrack"] if f["frontend"] == f"{NODE1}:30080"]  # type: ignore[union-attr,index]
    assert flows and all(f["client"].startswith(f"{CLIENT}:") for f in flows)
    snat = [f for f in flows if f["snat"]]
    assert snat and all(f["backend"].startswith("10.244.2.") for f in snat)
    for f in snat:  # the node's address, a port inside the configured SNAT range
        address, port = f["snat"].split(":")
        low, high = map(int, SNAT_RANGE.split("-"))
        assert address == NODE1 and low <= int(port) <= high
    nat = report["nat"]
    assert any(n["snat"] and n["frontend"] == f"{NODE1}:30080" for n in nat)  # type: ignore[union-attr,index]
    assert any(not n["snat"] and n["reply_to"].startswith(CLIENT) for n in nat)  # type: ignore[union-attr,index]
    np_http = next(
        s
        for s in report["services"]  # type: ignore[union-attr]
        if s["frontend"] == f"{NODE1}:30080/TCP"
    )
    assert np_http["type"] == "NodePort" and len(np_http["backends"]) == 4
    text = subprocess.run(
        [sys.executable, "-m", "ebpflb", "maps", "dump", "--bpffs", str(env.nodes["node1"].bpffs)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "CONNTRACK" in text and "=> 10.244.2." in text


def test_cleanup_removes_tc_filters_and_xdp(tmp_path: Path) -> None:
    cluster = Cluster.create(nodes=1, clients={})
    tag = uuid.uuid4().hex[:6]
    cgroup = Cgroup.create(f"ebpflb-test-{tag}")
    bpffs = Path(f"/sys/fs/bpf/ebpflb-test-{tag}")
    node = cluster.nodes["node1"]
    try:
        write_manifests(tmp_path)
        agent = AgentProcess(
            [
                "--manifests",
                str(tmp_path),
                "--bpffs",
                str(bpffs),
                "--cgroup",
                str(cgroup.path),
                "--interfaces",
                "eth0",
                "--xdp",
                "generic",
                "--node-name",
                "node1",
            ],
            netns=node.netns,
        )
        agent.wait_ready()
        agent.stop()

        def attached() -> tuple[str, str]:
            tc = "".join(
                cluster.run(node.netns, ["tc", "filter", "show", "dev", "eth0", d]).stdout
                for d in ("ingress", "egress")
            )
            return tc, cluster.run(node.netns, ["ip", "link", "show", "eth0"]).stdout

        tc, link = attached()
        assert "ebpflb_np_in" in tc and "ebpflb_np_out" in tc  # left in place on exit
        assert "ebpflb_np_xdp" in link
        done = cleanup_datapath(bpffs, cgroup.path, ["eth0"], node.netns)
        assert done.returncode == 0, done.stderr
        assert "detached 11 programs" in done.stdout  # 8 socket hooks, tc in/out, xdp
        tc, link = attached()
        assert "ebpflb" not in tc and "xdp" not in link
        assert (
            "clsact" not in cluster.run(node.netns, ["tc", "qdisc", "show", "dev", "eth0"]).stdout
        )
    finally:
        cleanup_datapath(bpffs, cgroup.path, ["eth0"], node.netns)
        cgroup.close()
        cluster.close()
