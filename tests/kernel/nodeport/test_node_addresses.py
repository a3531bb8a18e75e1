"""Node addresses that change while the agent runs (ebpflb.datapath.addrwatch): NodePorts
answer on an address added to the node's interface within seconds and stop when it is
removed; the masquerade (SNAT) source follows the interface's addresses. IPv6 too: a
global address added to eth0 gets the IPv6 Service's nodePort and becomes eth0's entry in
ebpflb_ifaddr6, a tentative one (DAD running) neither, link-local ones never (the IPv6
packet path itself is tests/kernel/nodeport/test_nodeport.py's).

Topology (lab.harness.netns.Cluster, one node): a client on the wire, the node on
192.168.100.1/24 (eth0, the agent attached), one pod behind it serving the NodePort.
The SNAT source is read from ebpflb_ifaddr4 (a local backend is not masqueraded, and a
masqueraded reply from a pod on this node would not pass eth0 to be translated back).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path
from typing import Any

import pytest

from ebpflb.datapath.maps.kernel import KernelMapSet
from lab.harness.agentproc import TIMEOUT_SCALE, AgentProcess, cleanup_datapath
from lab.harness.cluster import Cluster
from lab.harness.netns import Cgroup, sh

NODE, EXTRA, CLIENT = "192.168.100.1", "192.168.100.11", "192.168.100.100"
NODEPORT, NODEPORT6 = 30500, 30501
NODE6, TENTATIVE6 = "2001:db8:100::1", "2001:db8:100::2"
MANIFESTS = f"""\
apiVersion: v1
kind: Service
metadata: {{name: np, namespace: default}}
spec:
  type: NodePort
  clusterIP: 10.96.7.1
  ports: [{{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {NODEPORT}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: np-1
  namespace: default
  labels: {{kubernetes.io/service-name: np}}
addressType: IPv4
ports: [{{name: http, protocol: TCP, port: 8080}}]
endpoints:
  - addresses: ["10.244.1.11"]
    nodeName: node1
    conditions: {{ready: true}}
---
apiVersion: v1
kind: Service
metadata: {{name: np6, namespace: default}}
spec:
  type: NodePort
  clusterIP: fd00:96::71
  ipFamilies: [IPv6]
  ports: [{{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {NODEPORT6}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: np6-1
  namespace: default
  labels: {{kubernetes.io/service-name: np6}}
addressType: IPv6
ports: [{{name: http, protocol: TCP, port: 8080}}]
endpoints:
  - addresses: ["fd00:244:1::11"]
    nodeName: node1
    conditions: {{ready: true}}
"""


@dataclass
class Env:
    cluster: Cluster
    node_ns: str
    bpffs: Path
    agent: AgentProcess

    @property
    def client(self) -> str:
        return self.cluster.clients["client"]

    def ip(self, *argv: str) -> None:
        sh("ip", "-n", self.node_ns, *argv)

    def nodeport(self, address: str, count: int = 3) -> list[dict[str, Any]]:
        return self.cluster.requests(
            self.client, "tcp", f"{address}:{NODEPORT}", count, None, timeout=1.0
        )

    def frontends(self) -> set[str]:
        done = subprocess.run(
            [sys.executable, "-m", "ebpflb", "maps", "dump", "--json", "--bpffs", str(self.bpffs)],
            capture_output=True,
            text=True,
            check=True,
        )
        return {s["frontend"] for s in json.loads(done.stdout)["services"]}

    def snat_source(self) -> set[IPv4Address]:
        with KernelMapSet(self.bpffs) as maps:
            return set(maps.interface_addresses().v4.values())

    def snat_source6(self) -> set[IPv6Address]:
        with KernelMapSet(self.bpffs) as maps:
            return set(maps.interface_addresses().v6.values())

    def changes(self, change: str) -> float:
        value = self.agent.metrics().value("ebpflb_node_address_changes_total", change=change)
        return value or 0.0


def wait_for(check: Callable[[], bool], what: str, timeout: float = 10.0) -> float:
    """Seconds until `check` holds; fails after `timeout` (scaled under emulation)."""
    timeout *= TIMEOUT_SCALE
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.1)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    cluster = Cluster.create(nodes=1, clients={"client": CLIENT})
    tag = uuid.uuid4().hex[:6]
    bpffs, cgroup = Path(f"/sys/fs/bpf/ebpflb-test-{tag}"), Cgroup.create(f"ebpflb-test-{tag}")
    node_ns = cluster.nodes["node1"].netns
    agent = None
    try:
        pod = cluster.add_pod("node1", "pod11", 11)
        cluster.start_server(pod, tcp=[8080], lifetime=300)
        # Removing the first address of a subnet keeps the others (they are promoted).
        sh(
            "ip",
            "netns",
            "exec",
            node_ns,
            "sysctl",
            "-qw",
            "net.ipv4.conf.eth0.promote_secondaries=1",
        )
        manifests = tmp_path_factory.mktemp("nodeaddr")
        (manifests / "np.yaml").write_text(MANIFESTS)
        argv = ["--manifests", str(manifests), "--bpffs", str(bpffs), "--cgroup", str(cgroup.path)]
        argv += ["--interfaces", "eth0", "--node-name", "node1", "--min-sync-period", "0.1"]
        agent = AgentProcess(argv, netns=node_ns, log_file=manifests / "agent.log")
        agent.wait_ready()
        yield Env(cluster, node_ns, bpffs, agent)
    finally:
        if agent is not None:
            agent.stop()
        cleanup_datapath(bpffs, cgroup.path, ["eth0"], node_ns)
        cgroup.close()
        cluster.close()


def answered(results: list[dict[str, Any]]) -> bool:
    """Every request answered (by the pod)."""
    failed = [r for r in results if not r["ok"]]
    assert not failed, failed[:3]
    return {str(r["server"]) for r in results} == {"pod11"}


def test_nodeports_follow_an_address_added_and_removed(env: Env) -> None:
    assert answered(env.nodeport(NODE))
    added_before = env.changes("added")
    env.ip("addr", "add", f"{EXTRA}/24", "dev", "eth0")
    try:
        took = wait_for(lambda: f"{EXTRA}:{NODEPORT}/TCP" in env.frontends(), "frontend added")
        assert took < 5.0 * TIMEOUT_SCALE
        # A second address: the interface's SNAT source stays what it was.
        assert answered(env.nodeport(EXTRA))
        assert env.snat_source() == {IPv4Address(NODE)}
        assert env.changes("added") == added_before + 1
    finally:
        env.ip("addr", "del", f"{EXTRA}/24", "dev", "eth0")
    wait_for(lambda: f"{EXTRA}:{NODEPORT}/TCP" not in env.frontends(), "frontend removed")
    gone = env.nodeport(EXTRA, count=2)
    assert not any(r["ok"] for r in gone), gone  # nobody holds that address now
    assert answered(env.nodeport(NODE))


def test_removing_the_snat_source_moves_it_to_the_interfaces_other_address(env: Env) -> None:
    env.ip("addr", "add", f"{EXTRA}/24", "dev", "eth0")
    try:
        wait_for(lambda: f"{EXTRA}:{NODEPORT}/TCP" in env.frontends(), "frontend added")
        env.ip("addr", "del", f"{NODE}/24", "dev", "eth0")
        try:
            wait_for(lambda: env.snat_source() == {IPv4Address(EXTRA)}, "SNAT source moved")
            assert f"{NODE}:{NODEPORT}/TCP" not in env.frontends()
            assert answered(env.nodeport(EXTRA))
        finally:
            env.ip("addr", "add", f"{NODE}/24", "dev", "eth0")
        wait_for(lambda: f"{NODE}:{NODEPORT}/TCP" in env.frontends(), "frontend back")
        assert env.snat_source() == {IPv4Address(EXTRA)}  # held still: it stays
    finally:
        env.ip("addr", "del", f"{EXTRA}/24", "dev", "eth0")
    wait_for(lambda: env.snat_source() == {IPv4Address(NODE)}, "SNAT source back")
    assert answered(env.nodeport(NODE))


def test_ipv6_nodeports_and_snat_source_follow_global_addresses_past_dad(env: Env) -> None:
    frontend = f"[{NODE6}]:{NODEPORT6}/TCP"
    # eth0 has link-local addresses only: no IPv6 nodePort, no IPv6 SNAT source.
    assert not any(f.endswith(f":{NODEPORT6}/TCP") for f in env.frontends())
    assert env.snat_source6() == set()
    env.ip("addr", "add", f"{NODE6}/64", "dev", "eth0", "nodad")
    try:
        wait_for(lambda: frontend in env.frontends(), "IPv6 frontend added")
        wait_for(lambda: env.snat_source6() == {IPv6Address(NODE6)}, "IPv6 SNAT source")
        assert env.snat_source() == {IPv4Address(NODE)}  # the IPv4 one unchanged
        assert not any("[fe80:" in f for f in env.frontends())
        # DAD running for a long while: tentative, so neither a frontend nor a source.
        sh("ip", "netns", "exec", env.node_ns, "sysctl", "-qw", "net.ipv6.conf.eth0.accept_dad=1")
        sh(
            "ip", "netns", "exec", env.node_ns, "sysctl", "-qw",
            "net.ipv6.conf.eth0.dad_transmits=60",
        )  # fmt: skip
        env.ip("addr", "add", f"{TENTATIVE6}/64", "dev", "eth0")
        try:
            time.sleep(3.0 * TIMEOUT_SCALE)  # the agent dumps within a second of the event
            assert f"[{TENTATIVE6}]:{NODEPORT6}/TCP" not in env.frontends()
        finally:
            env.ip("addr", "del", f"{TENTATIVE6}/64", "dev", "eth0")
    finally:
        env.ip("addr", "del", f"{NODE6}/64", "dev", "eth0")
    wait_for(lambda: frontend not in env.frontends(), "IPv6 frontend removed")
    wait_for(lambda: env.snat_source6() == set(), "IPv6 SNAT source removed")
