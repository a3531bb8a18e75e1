"""The per-packet ClusterIP path (--pod-interfaces; ebpflb/datapath/programs/podlb.py) on
one node: pods behind the node namespace, each with a default route through it as a CNI
gives them, and clients in a pod that is NOT in the agent's cgroup, so no socket hook sees
their connections and every packet to a ClusterIP leaves the pod untranslated. The agent
runs in the node namespace with --pod-interfaces naming the pods' host-side veths.

The node namespace has no route out of the test: a packet the path failed to translate
dies there (ENETUNREACH or a timeout), never leaves the test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab.harness.agentproc import AgentProcess, cleanup_datapath
from lab.harness.netns import Cgroup, Pod, Topology, sh
from tests import REPO
from tests.kernel.conftest import PODS, TCP_PORT, UDP_PORT, served_by, wait_until

pytestmark = pytest.mark.kernel

CLIENT_IP = "10.244.1.20"
HAIRPIN_VIP = "10.96.0.20"
WEB, DNS, PENDING = "10.96.0.10:80", "10.96.0.53:53", "10.96.0.99:80"
HAIRPIN = f"{HAIRPIN_VIP}:80"

# The client pod is the only endpoint of this Service: reaching it is reaching itself.
HAIRPIN_YAML = f"""\
apiVersion: v1
kind: Service
metadata: {{name: self, namespace: default}}
spec:
  clusterIP: {HAIRPIN_VIP}
  ports: [{{name: http, protocol: TCP, port: 80, targetPort: {TCP_PORT}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: self-1
  namespace: default
  labels: {{kubernetes.io/service-name: self}}
addressType: IPv4
ports: [{{name: http, protocol: TCP, port: {TCP_PORT}}}]
endpoints: [{{addresses: ["{CLIENT_IP}"], conditions: {{ready: true}}}}]
"""


@dataclass
class Node:
    topology: Topology
    agent: AgentProcess
    client: Pod
    cgroup: Cgroup
    bpffs: Path
    manifests: Path

    def requests(self, mode: str, target: str, count: int, *extra: str) -> list[dict[str, Any]]:
        """From the client pod, outside the agent's cgroup."""
        return self.topology.requests(self.client.netns, mode, target, count, None, *extra)

    def flows(self, frontend: str) -> list[dict[str, Any]]:
        """The conntrack rows `maps dump` shows for `frontend` ("VIP:PORT/PROTO")."""
        argv = [sys.executable, "-m", "ebpflb", "maps", "dump", "--json"]
        argv += ["--bpffs", str(self.bpffs), "--frontend", frontend]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
        rows: list[dict[str, Any]] = json.loads(done.stdout)["conntrack"]
        return rows

    def pod_link_names(self) -> list[str]:
        return [f"v{self.topology.prefix[-6:]}{i}" for i in range(len(self.topology.pods))]


def default_route_through_the_node(topology: Topology, pod: Pod) -> None:
    sh("ip", "-n", pod.netns, "route", "add", "default", "via", topology.node_ip, "dev", "eth0")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("podpath")
    manifests = tmp / "manifests"
    shutil.copytree(REPO / "examples", manifests)
    (manifests / "self.yaml").write_text(HAIRPIN_YAML)
    topology = Topology.create()
    cgroup = Cgroup.create(f"ebpflb-test-{uuid.uuid4().hex[:8]}")
    bpffs = Path(f"/sys/fs/bpf/ebpflb-test-{uuid.uuid4().hex[:8]}")
    agent: AgentProcess | None = None
    try:
        sh("ip", "netns", "exec", topology.node_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for name, ip in PODS.items():
            pod = topology.add_pod(name, ip)
            default_route_through_the_node(topology, pod)
            topology.start_server(pod, tcp=[TCP_PORT], udp=[UDP_PORT], lifetime=900)
        client = topology.add_pod("client", CLIENT_IP)
        default_route_through_the_node(topology, client)
        topology.start_server(client, tcp=[TCP_PORT], lifetime=900)
        agent = AgentProcess(
            [
                "--manifests", str(manifests),
                "--bpffs", str(bpffs),
                "--cgroup", str(cgroup.path),
                "--interfaces=",
                f"--pod-interfaces=v{topology.prefix[-6:]}*",
                "--min-sync-period", "0.1",
            ],
            netns=topology.node_ns,
            log_file=tmp / "agent.log",
        )  # fmt: skip
        agent.wait_ready()
        yield Node(topology, agent, client, cgroup, bpffs, manifests)
    finally:
        if agent is not None:
            agent.stop()
        cleanup_datapath(bpffs, cgroup.path, netns=topology.node_ns)
        cgroup.close()
        topology.close()


def test_a_client_no_socket_hook_sees_reaches_a_clusterip_per_packet(node: Node) -> None:
    results = node.requests("tcp", WEB, 30)
    assert set(served_by(results)) == set(PODS)
    assert {r["peer"] for r in results} == {WEB}  # the client talks to the ClusterIP
    assert {r["seen_as"].rpartition(":")[0] for r in results} == {CLIENT_IP}  # no SNAT
    flows = node.flows(f"{WEB}/TCP")
    assert flows and {f["client"].rpartition(":")[0] for f in flows} == {CLIENT_IP}


def test_udp_replies_come_from_the_clusterip(node: Node) -> None:
    for extra in ((), ("--connected",)):
        results = node.requests("udp", DNS, 20, *extra)
        assert set(served_by(results)) <= set(PODS) and len(served_by(results)) > 1
        assert {r["peer"] for r in results} == {DNS}, extra


def test_a_pod_reaches_itself_through_its_service_with_snat(node: Node) -> None:
    """Hairpin: without SNAT the pod would answer itself from its own address; as with
    kube-proxy, it sees the node's address as the source and its reply comes back from
    the ClusterIP."""
    results = node.requests("tcp", HAIRPIN, 5)
    assert served_by(results) == {"client": 5}
    assert {r["peer"] for r in results} == {HAIRPIN}
    assert {r["seen_as"].rpartition(":")[0] for r in results} == {node.topology.node_ip}


def test_a_service_without_endpoints_is_rejected(node: Node) -> None:
    results = node.requests("tcp", PENDING, 3)
    assert [r.get("error") for r in results] == ["ECONNREFUSED"] * 3


def test_a_client_in_the_agents_cgroup_still_goes_through_socket_lb(node: Node) -> None:
    """Its connection carries the backend's address from connect() on: the per-packet
    path sees no ClusterIP and adds no conntrack flow."""
    before = len(node.flows(f"{WEB}/TCP"))
    results = node.topology.requests(node.client.netns, "tcp", WEB, 10, node.cgroup)
    assert set(served_by(results)) <= set(PODS) and {r["peer"] for r in results} == {WEB}
    assert len(node.flows(f"{WEB}/TCP")) == before


def test_a_pod_that_appears_later_is_followed(node: Node) -> None:
    late = node.topology.add_pod("late", "10.244.1.30")
    default_route_through_the_node(node.topology, late)
    link = node.pod_link_names()[-1]

    def attached() -> bool:
        status = node.agent.status()["pod_interfaces"]
        return status is not None and link in status["attached"]

    wait_until(attached, f"the per-packet path attached to {link}")
    results = node.topology.requests(late.netns, "tcp", WEB, 10, None)
    assert set(served_by(results)) <= set(PODS) and {r["peer"] for r in results} == {WEB}


def test_status_names_the_pod_interfaces_and_tc_holds_both_programs(node: Node) -> None:
    status = node.agent.status()
    assert status["pod_interfaces"]["patterns"] == [f"v{node.topology.prefix[-6:]}*"]
    assert set(node.pod_link_names()) <= set(status["pod_interfaces"]["attached"])
    assert status["programs"]["origin"]["pod"] in ("adopted", "loaded", "compiled")
    link = node.pod_link_names()[0]
    shown = subprocess.run(
        ["ip", "netns", "exec", node.topology.node_ns, "tc", "filter", "show", "dev", link,
         "ingress"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    assert "ebpflb_pod_in" in shown
    # /status names every loaded program's id, as bpftool and tc show them.
    ids = status["programs"]["ids"]
    assert f"id {ids['ebpflb_pod_in']} " in shown
    assert {"ebpflb_connect4", "ebpflb_pod_out"} <= set(ids)
