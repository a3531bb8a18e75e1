"""NodePort, LoadBalancer and external IPs through the tc programs, between namespaces.

Topology (ebpflb.testing.netns.Cluster): an external client (and an "outsider" outside
the LoadBalancer's source ranges) and two nodes on one bridge; pods behind each node on
their own /24, routed between the nodes. Each node runs its own agent (own bpffs
directory and cgroup) inside its namespace, attached to its eth0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ebpflb.testing.agentproc import AgentProcess, cleanup_datapath
from ebpflb.testing.netns import Cgroup, Cluster
from tests.kernel.conftest import served_by, wait_backends

NODE1, NODE2 = "192.168.100.1", "192.168.100.2"
CLIENT, OUTSIDER = "192.168.100.100", "192.168.100.200"
LB_IP, EXTERNAL_IP = "192.168.100.50", "192.168.100.60"
PODS = {"node1": {"pod11": 11, "pod12": 12}, "node2": {"pod21": 21, "pod22": 22}}
SNAT_RANGE = "61000-61063"  # node1: 64 ports per backend (exhaustion test), above ephemeral


def slice_yaml(name: str, service: str, ports: str, pods: list[tuple[str, str, str]]) -> str:
    endpoints = "".join(
        f'  - addresses: ["{ip}"]\n    nodeName: {node}\n    conditions: {{ready: true}}\n'
        for _pod, ip, node in pods
    )
    return (
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
        f"metadata: {{name: {name}, namespace: default, "
        f"labels: {{kubernetes.io/service-name: {service}}}}}\n"
        f"addressType: IPv4\nports: {ports}\nendpoints:\n{endpoints}"
    )


ALL_PODS = [
    ("pod11", "10.244.1.11", "node1"),
    ("pod12", "10.244.1.12", "node1"),
    ("pod21", "10.244.2.21", "node2"),
    ("pod22", "10.244.2.22", "node2"),
]

SERVICES = f"""\
apiVersion: v1
kind: Service
metadata: {{name: np, namespace: default}}
spec:
  type: NodePort
  clusterIP: 10.96.1.1
  ports:
    - {{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30080}}
    - {{name: dns, protocol: UDP, port: 53, targetPort: 5353, nodePort: 30053}}
---
apiVersion: v1
kind: Service
metadata: {{name: local, namespace: default}}
spec:
  type: LoadBalancer
  clusterIP: 10.96.1.2
  externalTrafficPolicy: Local
  healthCheckNodePort: 32100
  ports:
    - {{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30081}}
---
apiVersion: v1
kind: Service
metadata: {{name: lb, namespace: default}}
spec:
  type: LoadBalancer
  clusterIP: 10.96.1.3
  externalIPs: [{EXTERNAL_IP}]
  loadBalancerSourceRanges: [{CLIENT}/32]
  ports:
    - {{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30082}}
status:
  loadBalancer:
    ingress: [{{ip: {LB_IP}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: snat, namespace: default}}
spec:
  type: NodePort
  clusterIP: 10.96.1.4
  ports:
    - {{name: dns, protocol: UDP, port: 53, targetPort: 5354, nodePort: 30090}}
"""

NP_PORTS = "[{name: http, protocol: TCP, port: 8080}, {name: dns, protocol: UDP, port: 5353}]"
SLICES = {
    "np": slice_yaml(
        "np-1",
        "np",
        NP_PORTS,
        ALL_PODS,
    ),
    "local": slice_yaml(
        "local-1", "local", "[{name: http, protocol: TCP, port: 8080}]", ALL_PODS[:1]
    ),
    "lb": slice_yaml("lb-1", "lb", "[{name: http, protocol: TCP, port: 8080}]", ALL_PODS),
    "snat": slice_yaml("snat-1", "snat", "[{name: dns, protocol: UDP, port: 5354}]", ALL_PODS[2:]),
}


@dataclass
class NodeAgent:
    name: str
    netns: str
    bpffs: Path
    cgroup: Cgroup
    manifests: Path
    agent: AgentProcess | None = None

    def dump(self) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, "-m", "ebpflb", "maps", "dump", "--json", "--bpffs", str(self.bpffs)],
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def counter(self, name: str) -> int:
        return int(self.dump()["counters"][name])  # type: ignore[index]


@dataclass
class Env:
    cluster: Cluster
    xdp: bool
    nodes: dict[str, NodeAgent] = field(default_factory=dict)

    @property
    def client(self) -> str:
        return self.cluster.clients["client"]

    @property
    def outsider(self) -> str:
        return self.cluster.clients["outsider"]


def write_manifests(path: Path, slices: dict[str, str] | None = None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "services.yaml").write_text(SERVICES)
    (path / "slices.yaml").write_text("---\n".join((slices or SLICES).values()))


@pytest.fixture(scope="module", params=["tc", "xdp-native"])
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """The whole cluster, once with the ingress path in tc and once in native XDP."""
    xdp = ["--xdp", "native"] if request.param == "xdp-native" else []
    cluster = Cluster.create(clients={"client": CLIENT, "outsider": OUTSIDER})
    environment = Env(cluster, bool(xdp))
    try:
        for node_name, pods in PODS.items():
            for pod_name, host in pods.items():
                pod = cluster.add_pod(node_name, pod_name, host)
                cluster.start_server(pod, tcp=[8080], udp=[5353, 5354], lifetime=900)
        if xdp:
            cluster.wire_like()
        for client in cluster.clients.values():
            cluster.route(client, f"{LB_IP}/32", NODE1)  # the upstream router's choice
            cluster.route(client, f"{EXTERNAL_IP}/32", NODE1)
        for node_name, node in cluster.nodes.items():
            tag = uuid.uuid4().hex[:6]
            agent = NodeAgent(
                node_name,
                node.netns,
                Path(f"/sys/fs/bpf/ebpflb-test-{tag}"),
                Cgroup.create(f"ebpflb-test-{tag}"),
                tmp_path_factory.mktemp(node_name),
            )
            environment.nodes[node_name] = agent
            write_manifests(agent.manifests)
            extra = ["--snat-port-range", SNAT_RANGE] if node_name == "node1" else []
            extra += ["--external-ip-cidrs", f"{EXTERNAL_IP}/32"]  # none by default
            agent.agent = AgentProcess(
                [
                    "--manifests",
                    str(agent.manifests),
                    "--bpffs",
                    str(agent.bpffs),
                    "--cgroup",
                    str(agent.cgroup.path),
                    "--interfaces",
                    "eth0",
                    "--node-name",
                    node_name,
                    "--min-sync-period",
                    "0.1",
                    *xdp,
                    *extra,
                ],
                netns=node.netns,
                log_file=agent.manifests / "agent.log",
            )
        for agent in environment.nodes.values():
            assert agent.agent is not None
            agent.agent.wait_ready()
            interfaces = agent.agent.status()["interfaces"]
            assert interfaces == {"eth0": {"xdp": "native" if xdp else "off"}}
        yield environment
    finally:
        for agent in environment.nodes.values():
            if agent.agent is not None:
                agent.agent.stop()
            cleanup_datapath(agent.bpffs, agent.cgroup.path, ["eth0"], agent.netns)
            agent.cgroup.close()
        cluster.close()


def seen_ip(result: dict[str, object]) -> str:
    return str(result["seen_as"]).split(":")[0]


def xdp_tx_packets(env: Env) -> int:
    """Frames node1's native XDP program sent back out of eth0 (veth driver statistics)."""
    done = env.cluster.run(env.cluster.nodes["node1"].netns, ["ethtool", "-S", "eth0"])
    stats = dict(line.strip().split(": ") for line in done.stdout.splitlines() if ": " in line)
    return int(stats.get("rx_queue_0_xdp_tx", 0))


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


def http_get(env: Env, url: str) -> tuple[int, dict[str, object]]:
    """GET from the client namespace (the health check of a cloud load balancer)."""
    code = (
        "import urllib.request, urllib.error\n"
        "try:\n"
        f"    r = urllib.request.urlopen({url!r}, timeout=3)\n"
        "    print(r.status); print(r.read().decode())\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code); print(e.read().decode())\n"
    )
    done = env.cluster.run(env.client, [sys.executable, "-c", code], timeout=30)
    status, body = done.stdout.split("\n", 1)
    return int(status), json.loads(body)


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


def test_loadbalancer_and_external_ip_with_source_ranges(env: Env) -> None:
    lb = env.cluster.requests(env.client, "tcp", f"{LB_IP}:80", 20, None)
    assert len(served_by(lb)) >= 3 and {r["peer"] for r in lb} == {f"{LB_IP}:80"}
    ext = env.cluster.requests(env.outsider, "tcp", f"{EXTERNAL_IP}:80", 20, None)
    assert len(served_by(ext)) >= 3 and {r["peer"] for r in ext} == {f"{EXTERNAL_IP}:80"}
    before = env.nodes["node1"].counter("src_range_drop")
    blocked = env.cluster.requests(env.outsider, "tcp", f"{LB_IP}:80", 2, None, timeout=1.0)
    assert [r["ok"] for r in blocked] == [False, False]
    assert env.nodes["node1"].counter("src_range_drop") >= before + 2


def test_long_connection_keeps_its_backend_while_backends_change(env: Env) -> None:
    node1 = env.nodes["node1"]
    assert node1.agent is not None
    proc = env.cluster.spawn(
        env.client,
        [
            sys.executable,
            "-m",
            "ebpflb.testing.echo",
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
    transmissions. Under native XDP the senders model a wire (complete checksums, see
    Cluster.wire_like), so only the node's side is switched."""
    switched = [env.cluster.nodes["node1"].netns] + ([] if env.xdp else [env.client])
    for netns in switched:
        env.cluster.offload(netns, "eth0", offload)
    try:
        tcp = env.cluster.requests(env.client, "tcp", f"{NODE1}:30080", 20, None)
        udp = env.cluster.requests(env.client, "udp", f"{NODE1}:30053", 20, None)
        assert len(served_by(tcp)) >= 3 and len(served_by(udp)) >= 3
    finally:
        for netns in switched:
            env.cluster.offload(netns, "eth0", True)


def test_host_processes_reach_nodeport_and_lb_ip_through_socket_lb(env: Env) -> None:
    node1 = env.nodes["node1"]
    for target in (f"{NODE1}:30080", "127.0.0.1:30080", f"{LB_IP}:80", f"{EXTERNAL_IP}:80"):
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
