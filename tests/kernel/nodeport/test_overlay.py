"""NodePort with SNAT to a backend across a VXLAN overlay, as flannel's vxlan backend
builds one (flannel.1 on every node, MTU 1450, static FDB and neighbour entries, each
node's pod /24 routed via the peer's device address), with strict reverse-path filtering
on every node (rp_filter=1, RHEL's default).

kube-proxy's MASQUERADE takes the address of the interface a packet leaves by: flannel.1's
here. SNAT to the address of the interface the packet came in on (what ebpflb did before)
reaches node2 over flannel.1 from an address whose route back leaves by eth0, and node2's
reverse-path filter drops it: 0 of 3 exchanges answered where iptables answered 3 of 3.
node1's agent attaches to eth0 (the frontend) and flannel.1 (replies to the SNATed flows
come back there); the SNAT source is flannel.1's address, found by the route lookup.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab.harness import apps
from lab.harness.agentproc import AgentProcess, cleanup_datapath
from lab.harness.cluster import Cluster
from lab.harness.netns import Cgroup
from tests.kernel.twonode import CLIENT, NODE1, NodeAgent

pytestmark = pytest.mark.kernel

WEB_PORT = 8080
VTEP1 = "10.244.1.0"  # node1's flannel.1 address

SERVICE = f"""\
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  type: NodePort
  clusterIP: 10.96.4.1
  ports:
    - {{name: http, protocol: TCP, port: 80, targetPort: {WEB_PORT}, nodePort: 30090}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, protocol: TCP, port: {WEB_PORT}}}]
endpoints:
  - addresses: ["10.244.2.21"]
    nodeName: node2
    conditions: {{ready: true}}
"""


@dataclass
class Overlay:
    cluster: Cluster
    agent: NodeAgent
    device: str


def rp_filter_drops(cluster: Cluster, netns: str) -> int:
    """The kernel's count of packets dropped by reverse-path filtering in `netns`."""
    done = cluster.run(netns, ["nstat", "-az", "TcpExtIPReversePathFilter"])
    for line in done.stdout.splitlines():
        if line.startswith("TcpExtIPReversePathFilter"):
            return int(line.split()[1])
    raise AssertionError(f"nstat printed no TcpExtIPReversePathFilter: {done.stdout!r}")


@pytest.fixture(scope="module")
def overlay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Overlay]:
    cluster = Cluster.create(clients={"client": CLIENT}, pod_routes=False)
    agent: NodeAgent | None = None
    try:
        device = cluster.overlay()
        cluster.strict_rp_filter()
        pod = cluster.add_pod("node2", "pod21", 21)
        apps.start_nginx(
            cluster, pod.netns, "pod21", WEB_PORT, tmp_path_factory.mktemp("nginx"), {}
        )
        node1 = cluster.nodes["node1"]
        tag = uuid.uuid4().hex[:6]
        agent = NodeAgent(
            "node1",
            node1.netns,
            Path(f"/sys/fs/bpf/ebpflb-test-{tag}"),
            Cgroup.create(f"ebpflb-test-{tag}"),
            tmp_path_factory.mktemp("node1"),
        )
        (agent.manifests / "web.yaml").write_text(SERVICE)
        agent.agent = AgentProcess(
            [
                "--manifests",
                str(agent.manifests),
                "--bpffs",
                str(agent.bpffs),
                "--cgroup",
                str(agent.cgroup.path),
                "--interfaces",
                f"eth0,{device}",
                "--node-name",
                "node1",
            ],
            netns=node1.netns,
            log_file=agent.manifests / "agent.log",
        )
        agent.agent.wait_ready()
        yield Overlay(cluster, agent, device)
    finally:
        if agent is not None:
            if agent.agent is not None:
                agent.agent.stop()
            cleanup_datapath(agent.bpffs, agent.cgroup.path, ["eth0", "flannel.1"], agent.netns)
            agent.cgroup.close()
        cluster.close()


def test_nodeport_snat_to_a_backend_across_a_vxlan_overlay_with_strict_rp_filter(
    overlay: Overlay,
) -> None:
    node2 = overlay.cluster.nodes["node2"].netns
    drops = rp_filter_drops(overlay.cluster, node2)
    client = overlay.cluster.clients["client"]
    for _ in range(3):  # fresh connections: each a new flow, SNATed anew
        body = apps.http_get_body(overlay.cluster, client, f"http://{NODE1}:30090/name")
        assert body == "pod21\n"
    assert rp_filter_drops(overlay.cluster, node2) == drops
    # The SNAT source is the overlay device's address, as MASQUERADE's.
    flows = [f for f in overlay.agent.dump()["conntrack"] if f["frontend"] == f"{NODE1}:30090"]  # type: ignore[union-attr]
    assert flows and all(str(f["snat"]).startswith(f"{VTEP1}:") for f in flows), flows
    # Across the overlay's smaller MTU (1450), a body larger than one packet both ways.
    upload = Path(overlay.agent.manifests) / "up.bin"
    upload.write_bytes(os.urandom(256 * 1024))
    (up,) = apps.curl(
        overlay.cluster, client, [f"http://{NODE1}:30090/upload/up.bin"], upload=upload
    )
    assert up.code in (201, 204) and up.size_upload == 256 * 1024
