"""Per-frontend datapath counters over /metrics, and `ebpflb explain` checked against where
real traffic goes, on test_nodeport.py's two-node cluster (tc, and native XDP).

Traffic is chosen so the counters' deltas are exact: one UDP datagram per request (so one
packet and one flow each, of a known size), one connect() per TCP request.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ebpflb.testing.agentproc import AgentProcess, Scrape
from tests.kernel.conftest import wait_until
from tests.kernel.test_nodeport import CLIENT, NODE1, NODE2, Env, NodeAgent, env  # noqa: F401

EMPTY_SERVICE = """\
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.1.9
  ports:
    - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30098}
    - {name: dns, protocol: UDP, port: 53, targetPort: 5353, nodePort: 30099}
"""
# A datagram of the echo client: Ethernet 14 + IPv4 20 + UDP 8 + a 16-byte nonce.
UDP_REQUEST_BYTES = 14 + 20 + 8 + 16


def agent_of(node: NodeAgent) -> AgentProcess:
    assert node.agent is not None
    return node.agent


@pytest.fixture(scope="module", autouse=True)
def empty_service(env: Env) -> None:  # noqa: F811
    """A NodePort service without endpoints on both nodes (the manifests are watched)."""
    for node in env.nodes.values():
        (node.manifests / "empty.yaml").write_text(EMPTY_SERVICE)
    for node, address in ((env.nodes["node1"], NODE1), (env.nodes["node2"], NODE2)):
        wait_until(programmed(agent_of(node), address), f"default/empty programmed on {node.name}")


def programmed(agent: AgentProcess, address: str) -> Callable[[], bool]:
    def check() -> bool:
        sample = agent.metrics().value(
            "ebpflb_service_refused_total",
            service="default/empty",
            port="dns",
            frontend=f"{address}:30099",
            protocol="UDP",
        )
        return sample is not None

    return check


def delta(before: Scrape, after: Scrape, metric: str, **labels: str) -> float:
    new = after.value(f"ebpflb_service_{metric}_total", **labels)
    assert new is not None, (metric, labels)
    return new - (before.value(f"ebpflb_service_{metric}_total", **labels) or 0)


def test_service_counters_move_by_the_traffic_made(env: Env) -> None:  # noqa: F811
    node1 = env.nodes["node1"]
    agent = agent_of(node1)
    before = agent.metrics()
    cluster = env.cluster
    sock = cluster.requests(node1.netns, "tcp", "10.96.1.1:80", 7, node1.cgroup)
    assert all(r["ok"] for r in sock)
    udp = cluster.requests(env.client, "udp", f"{NODE1}:30053", 9, None)
    assert all(r["ok"] for r in udp)
    tcp = cluster.requests(env.client, "tcp", f"{NODE1}:30080", 5, None)
    assert all(r["ok"] for r in tcp)
    refused = cluster.requests(node1.netns, "tcp", "10.96.1.9:80", 3, node1.cgroup)
    assert [r.get("error") for r in refused] == ["ECONNREFUSED"] * 3
    dropped = cluster.requests(env.client, "udp", f"{NODE1}:30099", 4, None, timeout=0.3)
    assert not any(r["ok"] for r in dropped)
    after = agent.metrics()

    np_http = {"service": "default/np", "port": "http", "protocol": "TCP"}
    np_dns = {"service": "default/np", "port": "dns", "protocol": "UDP"}
    empty_http = {"service": "default/empty", "port": "http", "protocol": "TCP"}
    empty_dns = {"service": "default/empty", "port": "dns", "protocol": "UDP"}
    cluster_ip = {"frontend": "10.96.1.1:80", **np_http}
    assert delta(before, after, "socket_translations", **cluster_ip) == 7
    assert delta(before, after, "nodeport_flows", **cluster_ip) == 0
    udp_np = {"frontend": f"{NODE1}:30053", **np_dns}
    assert delta(before, after, "nodeport_flows", **udp_np) == 9
    assert delta(before, after, "nodeport_packets", **udp_np) == 9
    assert delta(before, after, "nodeport_bytes", **udp_np) == 9 * UDP_REQUEST_BYTES
    assert delta(before, after, "socket_translations", **udp_np) == 0
    tcp_np = {"frontend": f"{NODE1}:30080", **np_http}
    assert delta(before, after, "nodeport_flows", **tcp_np) == 5
    # SYN, ACK, FIN (or RST) at least, per connection; the exact count is TCP's business.
    assert delta(before, after, "nodeport_packets", **tcp_np) >= 15
    assert delta(before, after, "nodeport_bytes", **tcp_np) >= 15 * (14 + 20 + 20)
    assert delta(before, after, "refused", **{"frontend": "10.96.1.9:80", **empty_http}) == 3
    assert delta(before, after, "refused", **{"frontend": f"{NODE1}:30099", **empty_dns}) == 4
    assert delta(before, after, "refused", **tcp_np) == 0
