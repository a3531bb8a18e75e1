"""--socket-lb all|hostns-only|off on one node (pods behind the node namespace, the agent in
it with --pod-interfaces on the pods' links), and a service mesh's sidecar in a pod: the
pod's iptables REDIRECT sends its outbound TCP to a proxy (lab.harness.sidecar, its own uid
excluded), which reads the destination the application asked for (SO_ORIGINAL_DST).

- hostns-only: the node namespace's sockets are translated at connect(); a pod's are left
  alone (their packets are translated on the pod's interface), so the sidecar sees the
  ClusterIP, and its own connection to it reaches a backend per packet.
- all: the pod's connect() is translated before its iptables see it: the sidecar sees a
  backend's address (what breaks a mesh's routing by Service; documented).
- off: no socket program on the cgroup; the node namespace's connect() is not translated.

Every client runs in the agent's cgroup, so the socket programs see all of them.

hostns-only needs the kernel to tell the agent its namespace's cookie (SO_NETNS_COOKIE,
Linux 5.14): on an older kernel (the 5.10 guest) its tests check the refusal instead: the
agent exits non-zero before attaching anything, the cgroup left without programs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ebpflb.datapath.programs import loader
from lab.harness.agentproc import AgentProcess, cleanup_datapath
from lab.harness.netns import Cgroup, Pod, Topology, sh
from tests import REPO
from tests.kernel.conftest import PODS, TCP_PORT, UDP_PORT, served_by

pytestmark = pytest.mark.kernel

WEB, VIP = "10.96.0.10:80", "10.96.0.10"
HOSTNS_ONLY = loader.netns_cookie_available()
PROXY_UID, PROXY_PORT = 1337, 15001
APP = (
    "import socket, sys\n"
    "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
    "print(s.recv(256).decode().strip())\n"
)


@dataclass
class Node:
    topology: Topology
    cgroup: Cgroup
    bpffs: Path
    manifests: Path
    logs: Path
    meshed: Pod
    agents: list[AgentProcess] = field(default_factory=list)

    def start(self, scope: str, *, ready: bool = True) -> AgentProcess:
        for agent in self.agents:
            agent.stop()
        agent = AgentProcess(
            [
                "--manifests", str(self.manifests),
                "--bpffs", str(self.bpffs),
                "--cgroup", str(self.cgroup.path),
                "--interfaces=",
                f"--pod-interfaces=v{self.topology.prefix[-6:]}*",
                f"--socket-lb={scope}",
                "--min-sync-period", "0.1",
            ],
            netns=self.topology.node_ns,
            log_file=self.logs / f"agent-{scope}-{len(self.agents)}.log",
        )  # fmt: skip
        self.agents = [agent]
        if ready:
            agent.wait_ready()
        return agent

    def refused(self, scope: str) -> bool:
        """Whether an agent started with `scope` exits non-zero without attaching a socket
        program (a previous agent's stopped and detached first: --socket-lb=off)."""
        self.start("off")
        agent = self.start(scope, ready=False)
        try:
            code = agent.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            return False
        return code != 0 and self.cgroup_programs() == []

    def cgroup_programs(self) -> list[str]:
        """ebpflb's programs on the test cgroup, by the BPF_PROG_QUERY syscall (Bookworm's
        bpftool sends query flags kernels before 6.0 reject)."""
        return sorted(name for _hook, name in loader.attached_programs(self.cgroup.path))

    def conntrack_clients(self) -> set[str]:
        argv = [sys.executable, "-m", "ebpflb", "maps", "dump", "--json", "--bpffs"]
        done = subprocess.run(
            [*argv, str(self.bpffs), "--frontend", f"{WEB}/TCP"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return {f["client"].rpartition(":")[0] for f in json.loads(done.stdout)["conntrack"]}

    def through_the_sidecar(self) -> str:
        """The meshed pod's application connecting to the ClusterIP: what it was told."""
        proxy = self.topology.spawn(
            self.meshed.netns,
            ["setpriv", f"--reuid={PROXY_UID}", f"--regid={PROXY_UID}", "--clear-groups",
             sys.executable, "-m", "lab.harness.sidecar", "--port", str(PROXY_PORT),
             "--count", "1", "--lifetime", "30"],
            self.cgroup,
        )  # fmt: skip
        try:
            assert proxy.stdout is not None and proxy.stdout.readline().strip() == "ready"
            app = self.topology.run(
                self.meshed.netns, [sys.executable, "-c", APP, VIP, "80"], self.cgroup
            )
            assert app.returncode == 0, app.stderr
            return app.stdout.strip()
        finally:
            proxy.kill()
            proxy.communicate(timeout=30)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    if shutil.which("setpriv") is None or shutil.which("iptables") is None:
        pytest.fail("the sidecar needs setpriv (util-linux) and iptables")
    tmp = tmp_path_factory.mktemp("scope")
    manifests = tmp / "manifests"
    shutil.copytree(REPO / "examples", manifests)
    topology = Topology.create()
    cgroup = Cgroup.create(f"ebpflb-test-{uuid.uuid4().hex[:8]}")
    bpffs = Path(f"/sys/fs/bpf/ebpflb-test-{uuid.uuid4().hex[:8]}")
    node_: Node | None = None
    try:
        sh("ip", "netns", "exec", topology.node_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for name, ip in PODS.items():
            pod = topology.add_pod(name, ip)
            sh("ip", "-n", pod.netns, "route", "add", "default", "via", topology.node_ip)
            topology.start_server(pod, tcp=[TCP_PORT], udp=[UDP_PORT], lifetime=900)
        meshed = topology.add_pod("meshed", "10.244.1.40")
        sh("ip", "-n", meshed.netns, "route", "add", "default", "via", topology.node_ip)
        sh("ip", "-n", meshed.netns, "link", "set", "lo", "up")
        # Istio's outbound capture, reduced: every TCP connection but the proxy's own and
        # loopback ones goes to the proxy.
        sh("ip", "netns", "exec", meshed.netns, "iptables", "-t", "nat", "-A", "OUTPUT",
           "-p", "tcp", "!", "-d", "127.0.0.0/8", "-m", "owner", "!", "--uid-owner",
           str(PROXY_UID), "-j", "REDIRECT", "--to-ports", str(PROXY_PORT))  # fmt: skip
        node_ = Node(topology, cgroup, bpffs, manifests, tmp, meshed)
        yield node_
    finally:
        if node_ is not None:
            for agent in node_.agents:
                agent.stop()
        cleanup_datapath(bpffs, cgroup.path, netns=topology.node_ns)
        cgroup.close()
        topology.close()


def test_hostns_only_translates_the_nodes_sockets_and_leaves_pods_to_the_pod_path(
    node: Node,
) -> None:
    if not HOSTNS_ONLY:
        assert node.refused("hostns-only")
        return
    agent = node.start("hostns-only")
    status = agent.status()["socket_lb"]
    assert status["scope"] == "hostns-only" and status["netns_cookie"] > 0
    assert status["udp_socket_destroy"].startswith("sock_diag SOCK_DESTROY"), status
    before = node.conntrack_clients()
    on_node = node.topology.requests(node.topology.node_ns, "tcp", WEB, 10, node.cgroup)
    assert set(served_by(on_node)) <= set(PODS) and {r["peer"] for r in on_node} == {WEB}
    assert node.topology.node_ip not in node.conntrack_clients() - before  # socket-LB's
    pod = next(iter(node.topology.pods.values()))
    in_pod = node.topology.requests(pod.netns, "tcp", WEB, 10, node.cgroup)
    assert set(served_by(in_pod)) <= set(PODS) and {r["peer"] for r in in_pod} == {WEB}
    assert pod.ip in node.conntrack_clients()  # translated per packet, on its interface


def test_under_hostns_only_a_sidecar_sees_the_clusterip(node: Node) -> None:
    if not HOSTNS_ONLY:
        assert node.refused("hostns-only")
        return
    node.start("hostns-only")
    server, seen_as, via, destination = node.through_the_sidecar().split()
    assert server in PODS and via == "via" and destination == WEB
    # The proxy's own connection went out to the ClusterIP and was translated per packet.
    assert seen_as.rpartition(":")[0] == node.meshed.ip


def test_under_all_a_sidecar_sees_a_backend(node: Node) -> None:
    """socket-LB translates the application's connect() before the pod's iptables see it:
    the mesh's proxy is handed a pod address instead of the Service (why hostns-only
    exists)."""
    node.start("all")
    assert node.agents[0].status()["socket_lb"]["scope"] == "all"
    server, _seen_as, _via, destination = node.through_the_sidecar().split()
    assert destination == f"{PODS[server]}:{TCP_PORT}"


def test_off_attaches_no_socket_program_and_all_brings_them_back(node: Node) -> None:
    node.start("off")
    assert node.cgroup_programs() == []
    (result,) = node.topology.requests(node.topology.node_ns, "tcp", WEB, 1, node.cgroup)
    assert result["error"] == "ENETUNREACH"  # untranslated: the node has no route for it
    node.start("all")
    assert len(node.cgroup_programs()) == 8 and all(
        name.startswith("ebpflb_") for name in node.cgroup_programs()
    )
