"""The two-node cluster of the kernel tests that need a node's outside: NodePort,
LoadBalancer and external IPs through the tc (or XDP) programs (nodeport/, agent's
test_explain.py: the dual-stack `env` fixture, once with tc and once with native XDP) and
the Service semantics across two nodes (semantics/: `two_node_cluster` with each module's
manifests).

Topology (lab.harness.cluster.Cluster): an external client (and, for NodePort, an
"outsider" outside the LoadBalancer's source ranges) and two nodes on one bridge; pods
pod11, pod12 behind node1 and pod21, pod22 behind node2, on their own /24 (and /64 with
IPv6), routed between the nodes, each serving TCP 8080 and UDP 5353 (NodePort: and 5354).
Each node runs its own agent (own bpffs directory and cgroup, --interfaces eth0,
--node-name) inside its namespace, on a manifests directory of its own.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lab.harness.agentproc import TIMEOUT_SCALE, AgentProcess, cleanup_datapath
from lab.harness.cluster import Cluster
from lab.harness.netns import Cgroup

NODE1, NODE2 = "192.168.100.1", "192.168.100.2"
CLIENT, OUTSIDER = "192.168.100.100", "192.168.100.200"
LB_IP, EXTERNAL_IP = "192.168.100.50", "192.168.100.60"
NODE1_6, NODE2_6 = "fd00:100::1", "fd00:100::2"  # as Cluster numbers them
CLIENT6, OUTSIDER6 = "fd00:100::100", "fd00:100::200"
LB_IP6, EXTERNAL_IP6 = "fd00:100::50", "fd00:100::60"
PODS = {"node1": {"pod11": 11, "pod12": 12}, "node2": {"pod21": 21, "pod22": 22}}
SNAT_RANGE = "61000-61063"  # node1: 64 ports per backend (exhaustion test), above ephemeral
POD_IPS = {
    name: f"10.244.{node[-1]}.{host}" for node, pods in PODS.items() for name, host in pods.items()
}
POD_NODE = {name: node for node, pods in PODS.items() for name in pods}
HTTP = "[{name: http, protocol: TCP, port: 8080}]"
DNS = "[{name: dns, protocol: UDP, port: 5353}]"


def slice_yaml(
    name: str, service: str, ports: str, pods: list[tuple[str, str, str]], family: int = 4
) -> str:
    endpoints = "".join(
        f'  - addresses: ["{ip}"]\n    nodeName: {node}\n    conditions: {{ready: true}}\n'
        for _pod, ip, node in pods
    )
    return (
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
        f"metadata: {{name: {name}, namespace: default, "
        f"labels: {{kubernetes.io/service-name: {service}}}}}\n"
        f"addressType: IPv{family}\nports: {ports}\nendpoints:\n{endpoints or '  []'}"
    )


def pods_slice(service: str, ports: str, pods: Sequence[str], suffix: str = "1") -> str:
    """An EndpointSlice of `service` with these pods (by name), ready, on their nodes."""
    return slice_yaml(
        f"{service}-{suffix}", service, ports, [(p, POD_IPS[p], POD_NODE[p]) for p in pods]
    )


ALL_PODS = [
    ("pod11", "10.244.1.11", "node1"),
    ("pod12", "10.244.1.12", "node1"),
    ("pod21", "10.244.2.21", "node2"),
    ("pod22", "10.244.2.22", "node2"),
]
ALL_PODS6 = [
    (pod, f"fd00:244:{ip.split('.')[2]}::{ip.split('.')[3]}", node) for pod, ip, node in ALL_PODS
]
DUAL_STACK = "ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]"

SERVICES = f"""\
apiVersion: v1
kind: Service
metadata: {{name: np, namespace: default}}
spec:
  type: NodePort
  clusterIP: 10.96.1.1
  clusterIPs: [10.96.1.1, "fd00:96::1:1"]
  {DUAL_STACK}
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
  clusterIPs: [10.96.1.2, "fd00:96::1:2"]
  {DUAL_STACK}
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
  clusterIPs: [10.96.1.3, "fd00:96::1:3"]
  {DUAL_STACK}
  externalIPs: [{EXTERNAL_IP}, "{EXTERNAL_IP6}"]
  loadBalancerSourceRanges: [{CLIENT}/32, "{CLIENT6}/128"]
  ports:
    - {{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30082}}
status:
  loadBalancer:
    ingress: [{{ip: {LB_IP}}}, {{ip: "{LB_IP6}"}}]
---
apiVersion: v1
kind: Service
metadata: {{name: empty6, namespace: default}}
spec:
  type: NodePort
  clusterIP: "fd00:96::1:9"
  clusterIPs: ["fd00:96::1:9"]
  ipFamilies: [IPv6]
  ports:
    - {{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30097}}
    - {{name: dns, protocol: UDP, port: 53, targetPort: 5353, nodePort: 30096}}
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
    "np6": slice_yaml("np-6", "np", NP_PORTS, ALL_PODS6, 6),
    "local6": slice_yaml(
        "local-6", "local", "[{name: http, protocol: TCP, port: 8080}]", ALL_PODS6[:1], 6
    ),
    "lb6": slice_yaml("lb-6", "lb", "[{name: http, protocol: TCP, port: 8080}]", ALL_PODS6, 6),
}


@dataclass
class NodeAgent:
    name: str
    netns: str
    bpffs: Path
    cgroup: Cgroup
    manifests: Path
    agent: AgentProcess | None = None

    def dump(self, *select: str) -> dict[str, Any]:
        """`maps dump --json` of this node, narrowed by `select` (e.g. --frontend ...)."""
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "ebpflb",
                "maps",
                "dump",
                "--json",
                "--bpffs",
                str(self.bpffs),
                *select,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def counter(self, name: str) -> int:
        return int(self.dump()["counters"][name])


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

    def write(self, documents: Mapping[str, str]) -> None:
        """Replace the manifests of every node: file name -> YAML text."""
        for node in self.nodes.values():
            for name, text in documents.items():
                (node.manifests / name).write_text(text)

    def requests(
        self, node: str, mode: str, target: str, count: int, *extra: str, netns: str = ""
    ) -> list[dict[str, Any]]:
        """`count` requests from an in-node client of `node` (its cgroup; the node's network
        namespace unless `netns` names a pod's)."""
        agent = self.nodes[node]
        return self.cluster.requests(
            netns or agent.netns, mode, target, count, agent.cgroup, *extra
        )


@contextlib.contextmanager
def two_node_cluster(
    tmp: Path,
    documents: Mapping[str, str],
    *agent_args: str,
    node_args: Mapping[str, Sequence[str]] | None = None,
    xdp: bool = False,
    ipv6: bool = False,
    outsider: bool = False,
    udp: Sequence[int] = (5353,),
    routes: Sequence[tuple[str, str]] = ((f"{LB_IP}/32", NODE1),),
) -> Iterator[Env]:
    """The cluster with every node's agent running on `documents` (file name -> YAML)
    with `agent_args` (and `node_args[node]`); removed again on exit, also on failure.
    `xdp`: the ingress path in native XDP (the wire made veth-native for it); `ipv6`:
    both families everywhere; `outsider`: a second client; `routes`: (prefix, via) the
    upstream router sends from every client to a node."""
    clients = {"client": CLIENT, **({"outsider": OUTSIDER} if outsider else {})}
    clients6 = {"client": CLIENT6, **({"outsider": OUTSIDER6} if outsider else {})}
    cluster = Cluster.create(
        clients=clients, **({"ipv6": True, "clients6": clients6} if ipv6 else {})
    )
    env = Env(cluster, xdp)
    try:
        for node_name, pods in PODS.items():
            for pod_name, host in pods.items():
                pod = cluster.add_pod(node_name, pod_name, host)
                # The servers outlive the module's tests: 15 minutes on the host; under
                # emulation the cold compile alone can take 10 (EBPFLB_TEST_TIMEOUT_SCALE).
                cluster.start_server(
                    pod,
                    tcp=[8080],
                    udp=list(udp),
                    lifetime=900 * TIMEOUT_SCALE,
                    **({"ipv6": True} if ipv6 else {}),
                )
        if xdp:
            cluster.wire_like()
        for client in cluster.clients.values():
            for prefix, via in routes:
                cluster.route(client, prefix, via)
        for node_name, node in cluster.nodes.items():
            tag = uuid.uuid4().hex[:6]
            manifests = tmp / node_name
            manifests.mkdir(parents=True)
            agent = NodeAgent(
                node_name,
                node.netns,
                Path(f"/sys/fs/bpf/ebpflb-test-{tag}"),
                Cgroup.create(f"ebpflb-test-{tag}"),
                manifests,
            )
            env.nodes[node_name] = agent
            for name, text in documents.items():
                (manifests / name).write_text(text)
            agent.agent = AgentProcess(
                [
                    "--manifests",
                    str(manifests),
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
                    *(["--xdp", "native"] if xdp else []),
                    *agent_args,
                    *(node_args or {}).get(node_name, []),
                ],
                netns=node.netns,
                log_file=tmp / f"{node_name}-agent.log",
            )
        for agent in env.nodes.values():
            assert agent.agent is not None
            agent.agent.wait_ready()
            interfaces = agent.agent.status()["interfaces"]
            assert interfaces == {"eth0": {"xdp": "native" if xdp else "off"}}
        yield env
    finally:
        for agent in env.nodes.values():
            if agent.agent is not None:
                agent.agent.stop()
            cleanup_datapath(agent.bpffs, agent.cgroup.path, ["eth0"], agent.netns)
            agent.cgroup.close()
        cluster.close()


def write_manifests(path: Path, slices: dict[str, str] | None = None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "services.yaml").write_text(SERVICES)
    (path / "slices.yaml").write_text("---\n".join((slices or SLICES).values()))


@pytest.fixture(scope="module", params=["tc", "xdp-native"])
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """The NodePort cluster, once with the ingress path in tc and once in native XDP:
    dual stack, the outsider, SNAT ports of their own on node1, the external IPs allowed."""
    with two_node_cluster(
        tmp_path_factory.mktemp("nodeport"),
        {"services.yaml": SERVICES, "slices.yaml": "---\n".join(SLICES.values())},
        # none by default
        "--external-ip-cidrs",
        f"{EXTERNAL_IP}/32,{EXTERNAL_IP6}/128",
        node_args={"node1": ["--snat-port-range", SNAT_RANGE]},
        xdp=request.param == "xdp-native",
        ipv6=True,
        outsider=True,
        udp=(5353, 5354),
        routes=(  # the upstream router's choice
            (f"{LB_IP}/32", NODE1),
            (f"{EXTERNAL_IP}/32", NODE1),
            (f"{LB_IP6}/128", NODE1_6),
            (f"{EXTERNAL_IP6}/128", NODE1_6),
        ),
    ) as environment:
        yield environment


def servers(results: list[dict[str, Any]]) -> set[str]:
    """Which backends answered (every request must have succeeded)."""
    failed = [r for r in results if not r["ok"]]
    assert not failed, failed[:3]
    return {str(r["server"]) for r in results}


def seen_ip(result: dict[str, object]) -> str:
    """The client address the backend saw (IPv4 or IPv6)."""
    return str(result["seen_as"]).rsplit(":", 1)[0].strip("[]")


def xdp_tx_packets(env: Env) -> int:
    """Frames node1's native XDP program sent back out of eth0 (veth driver statistics)."""
    done = env.cluster.run(env.cluster.nodes["node1"].netns, ["ethtool", "-S", "eth0"])
    stats = dict(line.strip().split(": ") for line in done.stdout.splitlines() if ": " in line)
    return int(stats.get("rx_queue_0_xdp_tx", 0))


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
