"""Real servers and clients (Debian's nginx, curl, dnsmasq, dig) through a NodePort and a
ClusterIP, across a node-to-node link of a smaller MTU, in tc and in native XDP: what a
real network carries beyond small requests.

Topology: an external client and node1, node2 on the wire (MTU 1500); node1 and node2
also joined by a link of their own, n12/n21, of MTU 1400, over which node1 routes node2's
pods (node1's agent attaches to eth0 and n12: replies to flows SNATed to n12's address
come back there). pod21 on node2 runs nginx, dnsmasq and a UDP echo; pod11 on node1 a UDP
echo; pc11, a pod on node1 in the agent's cgroup, is a ClusterIP client (socket-LB). GRO is
on for every host interface, as on real NICs.

What each test shows:
- nginx through the NodePort: keep-alive and fresh connections, 2 MB each way. The upload
  crosses the 1400-byte link: its segments do not fit, node1 answers fragmentation needed
  (packet too big over IPv6) about the client's own packets to the frontend, the client's
  path MTU discovery shrinks them, the upload completes (TOO_BIG_SENT counted, nothing
  dropped silently). The download: node2's own forwarding answers the pod.
- nginx through a ClusterIP from a pod (socket-LB), a body larger than one packet.
- dnsmasq through the NodePort and the ClusterIP: a 3 KB answer leaves the server in
  fragments (node2 fragments them again for the 1400 link); every fragment of the SNATed
  reply is translated (the later ones with their first fragment's ports).
- a UDP NodePort whose backend port is closed: the backend's port unreachable is
  translated back, and the client's connected socket fails with ECONNREFUSED within a
  second.
- 3,000-byte UDP datagrams both ways, to a remote backend (SNAT: the client's fragments in,
  the backend's reply fragments back in) and to a local one (the reply's fragments leave
  through the egress program).

The overlay (VXLAN between the nodes, strict reverse-path filtering) is
test_overlay.py's; bulk TCP with GRO is test_bulk.py's (both here, in nodeport/).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lab.harness import apps, bulk
from lab.harness.agentproc import AgentProcess, cleanup_datapath
from lab.harness.cluster import Cluster
from lab.harness.netns import Cgroup, Pod, attach_xdp_pass, sh
from tests.kernel.twonode import CLIENT, CLIENT6, DUAL_STACK, NODE1, NODE1_6, NodeAgent

pytestmark = pytest.mark.kernel

LINK_MTU = 1400
LINK, LINK6 = "192.168.12", "fd00:12::"
WEB_PORT, DNS_PORT, ECHO_PORT, CLOSED_PORT = 8080, 5353, 5354, 5399
BIG = 2 * 1024 * 1024
DATAGRAM = 3000

SERVICES = f"""\
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  type: NodePort
  clusterIP: 10.96.3.1
  clusterIPs: [10.96.3.1, "fd00:96::3:1"]
  {DUAL_STACK}
  ports:
    - {{name: http, protocol: TCP, port: 80, targetPort: {WEB_PORT}, nodePort: 30080}}
---
apiVersion: v1
kind: Service
metadata: {{name: dns, namespace: default}}
spec:
  type: NodePort
  clusterIP: 10.96.3.2
  ports:
    - {{name: dns, protocol: UDP, port: 53, targetPort: {DNS_PORT}, nodePort: 30053}}
---
apiVersion: v1
kind: Service
metadata: {{name: echo-remote, namespace: default}}
spec:
  type: NodePort
  clusterIP: 10.96.3.3
  ports:
    - {{name: echo, protocol: UDP, port: 7, targetPort: {ECHO_PORT}, nodePort: 30054}}
---
apiVersion: v1
kind: Service
metadata: {{name: echo-local, namespace: default}}
spec:
  type: NodePort
  clusterIP: 10.96.3.4
  ports:
    - {{name: echo, protocol: UDP, port: 7, targetPort: {ECHO_PORT}, nodePort: 30055}}
---
apiVersion: v1
kind: Service
metadata: {{name: closed, namespace: default}}
spec:
  type: NodePort
  clusterIP: 10.96.3.5
  ports:
    - {{name: nothing, protocol: UDP, port: 9, targetPort: {CLOSED_PORT}, nodePort: 30056}}
"""


def _slice(name: str, service: str, port: str, pod: Pod, node: str, family: int = 4) -> str:
    address = pod.ip if family == 4 else pod.ip6
    return (
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
        f"metadata: {{name: {name}, namespace: default, "
        f"labels: {{kubernetes.io/service-name: {service}}}}}\n"
        f"addressType: IPv{family}\nports: [{port}]\nendpoints:\n"
        f'  - addresses: ["{address}"]\n    nodeName: {node}\n    conditions: {{ready: true}}\n'
    )


@dataclass
class Net:
    cluster: Cluster
    xdp: bool
    pod21: Pod
    pod11: Pod
    client_pod: Pod
    web: apps.Nginx
    files: Path  # the client's upload and the served download
    node1: NodeAgent
    agents: list[NodeAgent] = field(default_factory=list)

    @property
    def client(self) -> str:
        return self.cluster.clients["client"]

    def counters(self) -> dict[str, int]:
        return self.node1.dump()["counters"]  # type: ignore[return-value]


def _route_over_link(cluster: Cluster) -> None:
    """node1 reaches node2's pods over n12 (MTU 1400), node2 node1's over n21."""
    node1, node2 = cluster.nodes["node1"], cluster.nodes["node2"]
    sh("ip", "-n", node1.netns, "route", "add", "10.244.2.0/24", "via", f"{LINK}.2")
    sh("ip", "-n", node2.netns, "route", "add", "10.244.1.0/24", "via", f"{LINK}.1")
    sh("ip", "-n", node1.netns, "route", "add", "fd00:244:2::/64", "via", f"{LINK6}2")
    sh("ip", "-n", node2.netns, "route", "add", "fd00:244:1::/64", "via", f"{LINK6}1")


@pytest.fixture(scope="module", params=["tc", "xdp-native"])
def net(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    for tool in ("nginx", "dnsmasq", "curl", "dig"):
        if not os.access(f"/usr/sbin/{tool}", os.X_OK) and not os.access(
            f"/usr/bin/{tool}", os.X_OK
        ):
            pytest.fail(f"{tool} is not installed (make setup installs it)")
    xdp = request.param == "xdp-native"
    cluster = Cluster.create(
        clients={"client": CLIENT}, ipv6=True, clients6={"client": CLIENT6}, pod_routes=False
    )
    agents: list[NodeAgent] = []
    try:
        if_12, if_21 = cluster.link_nodes("node1", "node2", LINK, mtu=LINK_MTU, subnet6=LINK6)
        _route_over_link(cluster)
        pod21 = cluster.add_pod("node2", "pod21", 21)
        pod11 = cluster.add_pod("node1", "pod11", 11)
        client_pod = cluster.add_pod("node1", "pc11", 50)
        files = tmp_path_factory.mktemp("files")
        (files / "upload.bin").write_bytes(os.urandom(BIG))
        web = apps.start_nginx(
            cluster,
            pod21.netns,
            "pod21",
            WEB_PORT,
            tmp_path_factory.mktemp("nginx"),
            {"big.bin": os.urandom(BIG)},
        )
        apps.start_dnsmasq(cluster, pod21.netns, pod21.ip, DNS_PORT)
        for pod in (pod21, pod11):
            cluster.start_server(pod, udp=[ECHO_PORT], lifetime=900)
        node1, node2 = cluster.nodes["node1"], cluster.nodes["node2"]
        if xdp:
            cluster.wire_like()
            for netns, ifname in ((node1.netns, if_12), (node2.netns, if_21)):
                cluster.offload(netns, ifname, False)
            attach_xdp_pass(cluster, node2.netns, [if_21])  # XDP_TX/redirect into n21
        bulk.gro_on(cluster, bulk.host_links(cluster, cluster.wire_ns))
        tag = uuid.uuid4().hex[:6]
        agent = NodeAgent(
            "node1",
            node1.netns,
            Path(f"/sys/fs/bpf/ebpflb-test-{tag}"),
            Cgroup.create(f"ebpflb-test-{tag}"),
            tmp_path_factory.mktemp("node1"),
        )
        agents.append(agent)
        (agent.manifests / "services.yaml").write_text(SERVICES)
        slices = [
            _slice(
                "web-4", "web", f"{{name: http, protocol: TCP, port: {WEB_PORT}}}", pod21, "node2"
            ),
            _slice(
                "web-6",
                "web",
                f"{{name: http, protocol: TCP, port: {WEB_PORT}}}",
                pod21,
                "node2",
                6,
            ),
            _slice(
                "dns-4", "dns", f"{{name: dns, protocol: UDP, port: {DNS_PORT}}}", pod21, "node2"
            ),
            _slice(
                "echo-r",
                "echo-remote",
                f"{{name: echo, protocol: UDP, port: {ECHO_PORT}}}",
                pod21,
                "node2",
            ),
            _slice(
                "echo-l",
                "echo-local",
                f"{{name: echo, protocol: UDP, port: {ECHO_PORT}}}",
                pod11,
                "node1",
            ),
            _slice(
                "closed-4",
                "closed",
                f"{{name: nothing, protocol: UDP, port: {CLOSED_PORT}}}",
                pod21,
                "node2",
            ),
        ]
        (agent.manifests / "slices.yaml").write_text("---\n".join(slices))
        agent.agent = AgentProcess(
            [
                "--manifests",
                str(agent.manifests),
                "--bpffs",
                str(agent.bpffs),
                "--cgroup",
                str(agent.cgroup.path),
                "--interfaces",
                f"eth0,{if_12}",
                "--node-name",
                "node1",
                *(["--xdp", "native"] if xdp else []),
            ],
            netns=node1.netns,
            log_file=agent.manifests / "agent.log",
        )
        agent.agent.wait_ready()
        yield Net(cluster, xdp, pod21, pod11, client_pod, web, files, agent, agents)
    finally:
        for agent in agents:
            if agent.agent is not None:
                agent.agent.stop()
            cleanup_datapath(agent.bpffs, agent.cgroup.path, ["eth0", "n12"], agent.netns)
            agent.cgroup.close()
        cluster.close()


def test_nginx_through_a_nodeport_keep_alive_fresh_and_large_bodies_with_pmtud(net: Net) -> None:
    before = net.counters()
    url = f"http://{NODE1}:30080"
    # Keep-alive: 20 requests on one connection.
    kept = apps.curl(net.cluster, net.client, [f"{url}/name"] * 20)
    assert [r.code for r in kept] == [200] * 20
    assert kept[0].num_connects == 1 and all(r.num_connects == 0 for r in kept[1:])
    # Fresh connections.
    for _ in range(5):
        assert apps.http_get_body(net.cluster, net.client, f"{url}/name") == "pod21\n"
    # 2 MB up first: once the pod has learnt the link's MTU (from node2, for a download),
    # it announces a smaller MSS and the client's segments fit from the start.
    upload = net.files / "upload.bin"
    (up,) = apps.curl(net.cluster, net.client, [f"{url}/upload/up.bin"], upload=upload)
    assert up.code in (201, 204) and up.size_upload == BIG
    assert net.web.stored("upload/up.bin") == upload.read_bytes()
    after = net.counters()
    # 2 MB down: node2's own forwarding answers the pod for the 1400-byte link.
    (down,) = apps.curl(net.cluster, net.client, [f"{url}/big.bin"])
    assert (down.code, down.size_download) == (200, BIG)
    # The upload's packets did not fit n12: node1 answered, nothing was dropped unanswered.
    assert after["too_big_sent"] > before["too_big_sent"]
    assert after["mtu_exceeded"] == before["mtu_exceeded"]


def test_pmtud_through_an_ipv6_nodeport(net: Net) -> None:
    before = net.counters()
    upload = net.files / "upload.bin"
    url = f"http://[{NODE1_6}]:30080/upload/up6.bin"
    (up,) = apps.curl(net.cluster, net.client, [url], upload=upload)
    assert up.code in (201, 204) and up.size_upload == BIG
    assert net.web.stored("upload/up6.bin") == upload.read_bytes()
    after = net.counters()
    assert after["too_big_sent"] > before["too_big_sent"]  # packet too big, answered


def test_nginx_through_a_clusterip_from_a_pod(net: Net) -> None:
    cgroup = net.node1.cgroup
    body = apps.http_get_body(net.cluster, net.client_pod.netns, "http://10.96.3.1/name", cgroup)
    assert body == "pod21\n"
    (down,) = apps.curl(
        net.cluster, net.client_pod.netns, ["http://10.96.3.1/big.bin"], cgroup=cgroup
    )
    assert (down.code, down.size_download) == (200, BIG)


def test_dns_answers_large_enough_to_fragment(net: Net) -> None:
    before = net.counters()
    small = apps.dig(net.cluster, net.client, NODE1, 30053, "small.test", "A")
    assert (small.status, small.records) == ("NOERROR", ("192.0.2.1",))
    big = apps.dig(net.cluster, net.client, NODE1, 30053, "big.test", "TXT")
    assert big.status == "NOERROR" and len(big.records) == apps.BIG_TXT_RECORDS
    assert big.size > 1500  # it came in fragments
    assert net.counters()["fragment"] > before["fragment"]  # translated, each of them
    # Through the ClusterIP (socket-LB) from a pod.
    via = apps.dig(
        net.cluster, net.client_pod.netns, "10.96.3.2", 53, "big.test", "TXT", net.node1.cgroup
    )
    assert via.status == "NOERROR" and len(via.records) == apps.BIG_TXT_RECORDS


def test_udp_to_a_closed_backend_port_is_refused_within_a_second(net: Net) -> None:
    before = net.counters()
    results = net.cluster.echo(
        net.client, "udp", f"{NODE1}:30056", "--connected", "--timeout", "1", "--count", "3"
    )
    assert [r.get("error") for r in results] == ["ECONNREFUSED"] * 3
    assert net.counters()["icmp_xlated"] >= before["icmp_xlated"] + 3


@pytest.mark.parametrize("port", [30054, 30055], ids=["remote-backend", "local-backend"])
def test_3000_byte_udp_both_ways(net: Net, port: int) -> None:
    results = net.cluster.echo(
        net.client, "udp", f"{NODE1}:{port}", "--size", str(DATAGRAM), "--count", "5"
    )
    assert all(r["ok"] for r in results), results
    assert {r["echoed"] for r in results} == {DATAGRAM}
    assert {r["peer"] for r in results} == {f"{NODE1}:{port}"}
    assert {r["server"] for r in results} == {"pod21" if port == 30054 else "pod11"}
