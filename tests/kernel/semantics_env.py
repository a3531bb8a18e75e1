"""A two-node cluster for the Service-semantics kernel tests (tests/kernel/test_semantics_*).

Topology (lab.harness.netns.Cluster): an external client on the wire with two nodes;
pods pod11, pod12 behind node1 and pod21, pod22 behind node2, each serving TCP 8080 and
UDP 5353. Each node runs its own agent (own bpffs directory and cgroup, --interfaces eth0,
--node-name) on one manifests directory of its own; `write` changes both.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.harness.agentproc import AgentProcess, cleanup_datapath
from lab.harness.cluster import Cluster
from lab.harness.netns import Cgroup

NODE1, NODE2 = "192.168.100.1", "192.168.100.2"
CLIENT = "192.168.100.100"
LB_IP = "192.168.100.50"
PODS = {"node1": {"pod11": 11, "pod12": 12}, "node2": {"pod21": 21, "pod22": 22}}
POD_IPS = {
    name: f"10.244.{node[-1]}.{host}" for node, pods in PODS.items() for name, host in pods.items()
}
POD_NODE = {name: node for node, pods in PODS.items() for name in pods}
HTTP = "[{name: http, protocol: TCP, port: 8080}]"
DNS = "[{name: dns, protocol: UDP, port: 5353}]"


def slice_yaml(service: str, ports: str, pods: Sequence[str], suffix: str = "1") -> str:
    """An EndpointSlice of `service` with these pods, ready, on their nodes."""
    endpoints = "".join(
        f'  - addresses: ["{POD_IPS[pod]}"]\n    nodeName: {POD_NODE[pod]}\n'
        "    conditions: {ready: true}\n"
        for pod in pods
    )
    return (
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
        f"metadata: {{name: {service}-{suffix}, namespace: default, "
        f"labels: {{kubernetes.io/service-name: {service}}}}}\n"
        f"addressType: IPv4\nports: {ports}\nendpoints:\n{endpoints or '  []'}"
    )


@dataclass
class NodeAgent:
    name: str
    netns: str
    ip: str
    bpffs: Path
    cgroup: Cgroup
    manifests: Path
    agent: AgentProcess | None = None

    def dump(self) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "ebpflb", "maps", "dump", "--json", "--bpffs", str(self.bpffs)],
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def counter(self, name: str) -> int:
        return int(self.dump()["counters"][name])


@dataclass
class SemanticsEnv:
    cluster: Cluster
    nodes: dict[str, NodeAgent] = field(default_factory=dict)

    @property
    def client(self) -> str:
        return self.cluster.clients["client"]

    def write(self, documents: dict[str, str]) -> None:
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
def semantics_cluster(
    tmp: Path,
    documents: dict[str, str],
    *extra_args: str,
    node_args: dict[str, list[str]] | None = None,
) -> Iterator[SemanticsEnv]:
    cluster = Cluster.create(clients={"client": CLIENT})
    env = SemanticsEnv(cluster)
    try:
        for node_name, pods in PODS.items():
            for pod_name, host in pods.items():
                pod = cluster.add_pod(node_name, pod_name, host)
                cluster.start_server(pod, tcp=[8080], udp=[5353], lifetime=900)
        cluster.route(env.client, f"{LB_IP}/32", NODE1)
        for node_name, node in cluster.nodes.items():
            tag = uuid.uuid4().hex[:6]
            manifests = tmp / node_name
            manifests.mkdir(parents=True)
            agent = NodeAgent(
                node_name,
                node.netns,
                node.ip,
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
                    *extra_args,
                    *(node_args or {}).get(node_name, []),
                ],
                netns=node.netns,
                log_file=tmp / f"{node_name}-agent.log",
            )
        for agent in env.nodes.values():
            assert agent.agent is not None
            agent.agent.wait_ready()
        yield env
    finally:
        for agent in env.nodes.values():
            if agent.agent is not None:
                agent.agent.stop()
            cleanup_datapath(agent.bpffs, agent.cgroup.path, ["eth0"], agent.netns)
            agent.cgroup.close()
        cluster.close()


def servers(results: list[dict[str, Any]]) -> set[str]:
    """Which backends answered (every request must have succeeded)."""
    failed = [r for r in results if not r["ok"]]
    assert not failed, failed[:3]
    return {str(r["server"]) for r in results}
