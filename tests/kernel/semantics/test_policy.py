"""internalTrafficPolicy and externalTrafficPolicy on two real nodes (issue 13).

kube-proxy's behaviour: internalTrafficPolicy=Local limits in-cluster clients of the
ClusterIP to their node's endpoints; externalTrafficPolicy=Local limits traffic arriving
from outside the node, while pods and host processes reaching the nodePort, the
LoadBalancer IP or an external IP go to every endpoint.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from ebpflb.datapath.programs import loader
from lab.harness.agentproc import TIMEOUT_SCALE
from lab.harness.netns import Pod
from tests.kernel.twonode import (
    CLIENT,
    HTTP,
    LB_IP,
    NODE1,
    NODE2,
    Env,
    pods_slice,
    servers,
    two_node_cluster,
)

PROXY_LB_IP = "192.168.100.51"  # a load balancer in proxy mode: the client namespace
SERVICES = f"""\
apiVersion: v1
kind: Service
metadata: {{name: itp, namespace: default}}
spec:
  clusterIP: 10.96.2.1
  internalTrafficPolicy: Local
  ports: [{{name: http, protocol: TCP, port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: itp-remote, namespace: default}}
spec:
  clusterIP: 10.96.2.2
  internalTrafficPolicy: Local
  ports: [{{name: http, protocol: TCP, port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: etp, namespace: default}}
spec:
  type: LoadBalancer
  clusterIP: 10.96.2.3
  externalTrafficPolicy: Local
  ports: [{{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30100}}]
status:
  loadBalancer:
    ingress: [{{ip: {LB_IP}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: empty, namespace: default}}
spec:
  type: NodePort
  clusterIP: 10.96.2.4
  ports:
    - {{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30110}}
    - {{name: dns, protocol: UDP, port: 53, targetPort: 5353, nodePort: 30111}}
---
apiVersion: v1
kind: Service
metadata: {{name: proxied, namespace: default}}
spec:
  type: LoadBalancer
  clusterIP: 10.96.2.5
  ports: [{{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30120}}]
status:
  loadBalancer:
    ingress: [{{ip: {PROXY_LB_IP}, ipMode: Proxy}}]
"""
SLICES = "---\n".join(
    [
        pods_slice("itp", HTTP, ["pod11", "pod21"]),
        pods_slice("itp-remote", HTTP, ["pod22"]),
        pods_slice("etp", HTTP, ["pod11"]),
        pods_slice("proxied", HTTP, ["pod11"]),
    ]
)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with two_node_cluster(
        tmp_path_factory.mktemp("policy"), {"services.yaml": SERVICES, "slices.yaml": SLICES}
    ) as environment:
        # The proxy-mode load balancer: an address of the client namespace, answering as "lb".
        cluster = environment.cluster
        cluster.run(environment.client, ["ip", "addr", "add", f"{PROXY_LB_IP}/24", "dev", "eth0"])
        cluster.start_server(Pod("lb", environment.client, PROXY_LB_IP), tcp=[80], lifetime=900)
        yield environment


def test_internal_local_reaches_only_this_nodes_endpoints(env: Env) -> None:
    assert servers(env.requests("node1", "tcp", "10.96.2.1:80", 20)) == {"pod11"}
    assert servers(env.requests("node2", "tcp", "10.96.2.1:80", 20)) == {"pod21"}
    # A pod's client (its own network namespace, the node's cgroup) too.
    pod12 = env.cluster.nodes["node1"].pods["pod12"].netns
    assert servers(env.requests("node1", "tcp", "10.96.2.1:80", 10, netns=pod12)) == {"pod11"}


def test_internal_local_without_a_local_endpoint_refuses_at_once(env: Env) -> None:
    expected = "ECONNREFUSED" if loader.probe_features().set_retval else "EPERM"
    started = time.monotonic()
    results = env.requests("node1", "tcp", "10.96.2.2:80", 3)
    assert [r.get("error") for r in results] == [expected] * 3
    assert time.monotonic() - started < 5.0 * TIMEOUT_SCALE  # refused, not timed out
    assert servers(env.requests("node2", "tcp", "10.96.2.2:80", 5)) == {"pod22"}


def test_external_local_from_inside_reaches_every_endpoint(env: Env) -> None:
    """node2 has no endpoint of `etp`: its host processes still reach pod11 through its
    nodePort (on its address and 127.0.0.1) and the LoadBalancer IP."""
    for target in (f"{NODE2}:30100", "127.0.0.1:30100", f"{LB_IP}:80"):
        results = env.requests("node2", "tcp", target, 5)
        assert servers(results) == {"pod11"}, target
        assert {r["peer"] for r in results} == {target}


def test_external_local_from_outside_uses_local_endpoints_only(env: Env) -> None:
    via_node1 = env.cluster.requests(env.client, "tcp", f"{NODE1}:30100", 5, None)
    assert servers(via_node1) == {"pod11"}
    assert {str(r["seen_as"]).split(":")[0] for r in via_node1} == {CLIENT}  # no SNAT
    via_node2 = env.cluster.requests(env.client, "tcp", f"{NODE2}:30100", 2, None, timeout=1.0)
    # Not forwarded to node1's endpoint, and dropped (kube-proxy's DROP for "no local
    # endpoints"): the client times out, so a load balancer's retry goes elsewhere.
    assert [r.get("error") for r in via_node2] == ["TimeoutError"] * 2


def test_no_endpoint_anywhere_is_rejected_at_once(env: Env) -> None:
    """kube-proxy's REJECT: a TCP RST or an ICMP port unreachable, not a drop."""
    before = env.nodes["node1"].counter("np_reject")
    started = time.monotonic()
    results = env.cluster.requests(env.client, "tcp", f"{NODE1}:30110", 3, None, timeout=3.0)
    assert [r.get("error") for r in results] == ["ECONNREFUSED"] * 3
    assert time.monotonic() - started < 3.0 * TIMEOUT_SCALE  # the error shows the reject
    udp = env.cluster.requests(
        env.client, "udp", f"{NODE1}:30111", 3, None, "--connected", timeout=3.0
    )
    assert [r.get("error") for r in udp] == ["ECONNREFUSED"] * 3  # ICMP port unreachable
    assert time.monotonic() - started < 6.0 * TIMEOUT_SCALE
    assert env.nodes["node1"].counter("np_reject") - before == 6


def test_maps_hold_both_scopes(env: Env) -> None:
    services = {s["frontend"]: s for s in env.nodes["node2"].dump()["services"]}
    outside = services[f"{NODE2}:30100/TCP"]
    inside = services[f"{NODE2}:30100/TCP/internal"]
    assert outside["backends"] == [] and "internal_scope" in outside["flags"]
    assert [b["address"] for b in inside["backends"]] == ["10.244.1.11:8080"]
    assert "itp_local" in services["10.96.2.1:80/TCP"]["flags"]


def test_proxy_mode_load_balancer_ip_is_not_short_circuited(env: Env) -> None:
    """ipMode Proxy: in-node clients of the LoadBalancer IP reach the load balancer."""
    results = env.requests("node1", "tcp", f"{PROXY_LB_IP}:80", 3)
    assert servers(results) == {"lb"}
    assert {r["peer"] for r in results} == {f"{PROXY_LB_IP}:80"}
    frontends = {s["frontend"] for s in env.nodes["node1"].dump()["services"]}
    assert f"{PROXY_LB_IP}:80/TCP" not in frontends
    assert f"{LB_IP}:80/TCP" in frontends  # the VIP-mode one is programmed
