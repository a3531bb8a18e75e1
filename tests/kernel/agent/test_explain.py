"""Per-frontend datapath counters over /metrics, and `ebpflb explain` checked against where
real traffic goes, on twonode.py's two-node cluster (tc, and native XDP).

Traffic is chosen so the counters' deltas are exact: one UDP datagram per request (so one
packet and one flow each, of a known size), one connect() per TCP request.
"""

from __future__ import annotations

import json
import random
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from ebpflb.datapath.programs import loader
from lab.harness.agentproc import AgentProcess, Scrape
from tests.kernel.conftest import wait_until
from tests.kernel.twonode import (
    ALL_PODS,
    CLIENT,
    NODE1,
    NODE2,
    SNAT_RANGE,
    Env,
    NodeAgent,
    slice_yaml,
)

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
# sessionAffinity: ClientIP over every pod, on node1 only (test_nodeport has none).
STICKY_SERVICE = """\
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.1.10
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 3600}}
  ports:
    - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30210}
---
""" + slice_yaml("sticky-1", "sticky", "[{name: http, protocol: TCP, port: 8080}]", ALL_PODS)
# What connect() to a Service without endpoints fails with on this kernel (bpf_set_retval).
REFUSAL = "ECONNREFUSED" if loader.probe_features().set_retval else "EPERM"
# A datagram of the echo client: Ethernet 14 + IPv4 20 + UDP 8 + a 16-byte nonce.
UDP_REQUEST_BYTES = 14 + 20 + 8 + 16


def agent_of(node: NodeAgent) -> AgentProcess:
    assert node.agent is not None
    return node.agent


@pytest.fixture(scope="module", autouse=True)
def empty_service(env: Env) -> None:
    """A NodePort service without endpoints on both nodes (the manifests are watched)."""
    for node in env.nodes.values():
        (node.manifests / "empty.yaml").write_text(EMPTY_SERVICE)
    for node, address in ((env.nodes["node1"], NODE1), (env.nodes["node2"], NODE2)):
        wait_until(programmed(agent_of(node), address), f"default/empty programmed on {node.name}")


@pytest.fixture(scope="module", autouse=True)
def sticky_service(env: Env, empty_service: None) -> None:
    node1 = env.nodes["node1"]
    (node1.manifests / "sticky.yaml").write_text(STICKY_SERVICE)

    def ready() -> bool:
        services = {s["frontend"]: s for s in node1.dump()["services"]}  # type: ignore[union-attr]
        return len(services.get(f"{NODE1}:30210/TCP", {}).get("backends", [])) == 4

    wait_until(ready, "default/sticky programmed on node1")


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


def test_service_counters_move_by_the_traffic_made(env: Env) -> None:
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
    assert [r.get("error") for r in refused] == [REFUSAL] * 3
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


# ---- ebpflb explain against real traffic ---------------------------------------------------

SNAT = ("--snat-port-range", SNAT_RANGE)  # node1's, as its agent was started with

POD_IPS = {pod: ip for pod, ip, _node in ALL_PODS}

# Connects from a fixed source port and prints what the server saw: `explain` must name
# the backend the 5-tuple hashes to, and the SNAT decision the server observes.
FIXED_PORT_CLIENT = """\
import json, socket, sys
for port in map(int, sys.argv[2:]):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.settimeout(3)
    s.bind(("0.0.0.0", port))
    try:
        s.connect((sys.argv[1].split(":")[0], int(sys.argv[1].split(":")[1])))
        name, seen = s.recv(256).decode().split()[:2]
        print(json.dumps({"port": port, "server": name, "seen_as": seen}))
    except OSError as exc:
        print(json.dumps({"port": port, "error": type(exc).__name__}))
    finally:
        s.close()
"""
# Connects from a fixed source port, prints what the server saw and holds the connection
# until the test kills it (at most 300 s: bounded), pinging every 5 s: the echo server
# closes a connection idle for 30 s.
HOLDING_CLIENT = """\
import json, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.settimeout(30)
s.bind(("0.0.0.0", int(sys.argv[2])))
host, port = sys.argv[1].split(":")
s.connect((host, int(port)))
name, seen = s.recv(256).decode().split()[:2]
print(json.dumps({"server": name, "seen_as": seen}), flush=True)
for _ in range(60):
    time.sleep(5)
    s.sendall(b"ping")
    s.recv(64)
"""
# Unconnected UDP sockets: each one's cookie (SO_COOKIE, the value bpf_get_socket_cookie
# returns) and the backend that answered its sendto().
COOKIE_CLIENT = """\
import json, socket, sys
SO_COOKIE = 57
host, port = sys.argv[1].split(":")
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    cookie = int.from_bytes(s.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8), "little")
    s.sendto(b"0123456789abcdef", (host, int(port)))
    name = s.recvfrom(256)[0].decode().split()[0]
    print(json.dumps({"cookie": cookie, "server": name}))
    s.close()
"""


def explain_text(env: Env, node: NodeAgent, *args: str) -> str:
    """`ebpflb explain` as an operator reads it, printed for the test report (-rP)."""
    argv = [sys.executable, "-m", "ebpflb", "explain", "--bpffs", str(node.bpffs), *args]
    done = env.cluster.run(node.netns, argv)
    assert done.returncode == 0, done.stderr
    print(f"$ ebpflb explain {' '.join(args)}\n{done.stdout}")
    return done.stdout


def explain_json(env: Env, node: NodeAgent, *args: str) -> dict[str, Any]:
    """`ebpflb explain --json` inside the node's namespace (its interface names)."""
    argv = [sys.executable, "-m", "ebpflb", "explain", "--json", "--bpffs", str(node.bpffs)]
    done = env.cluster.run(node.netns, [*argv, *args])
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def run_lines(env: Env, netns: str, code: str, *args: str, cgroup: Any = None) -> list[Any]:
    done = env.cluster.run(netns, [sys.executable, "-c", code, *args], cgroup)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def fresh_ports(count: int) -> list[int]:
    """Client ports no earlier flow used (a live conntrack entry would decide instead)."""
    base = random.randrange(20000, 30000 - count)
    return list(range(base, base + count))


def test_explain_names_the_backend_and_snat_of_nodeport_traffic(env: Env) -> None:
    node1 = env.nodes["node1"]
    ports = fresh_ports(8)
    predicted = {
        port: explain_json(
            env, node1, f"{CLIENT}:{port}", f"{NODE1}:30080/TCP", "--ingress", "eth0", *SNAT
        )
        for port in ports
    }
    for ex in predicted.values():
        assert ex["verdict"] == "translated" and ex["selection"]["deterministic"]
        assert ex["frontend"]["service"] == "default/np:http"
        assert len(ex["candidates"]) == 4
    # The text form, for a port whose flow is SNATed when there is one (nearly always).
    sample = next((p for p in ports if predicted[p]["nat"]["snat"]), ports[-1])
    text = explain_text(
        env, node1, f"{CLIENT}:{sample}", f"{NODE1}:30080/TCP", "--ingress", "eth0", *SNAT
    )
    assert "verdict: translated" in text and predicted[sample]["backend"]["backend"] in text
    seen = run_lines(env, env.client, FIXED_PORT_CLIENT, f"{NODE1}:30080", *map(str, ports))
    for result in seen:
        ex = predicted[result["port"]]
        assert "error" not in result, result
        assert f"{POD_IPS[result['server']]}:8080" == ex["backend"]["backend"], (result, ex)
        snat = ex["nat"]["snat"]
        assert snat == result["server"].startswith("pod2")  # pods on node2 are remote
        assert result["seen_as"].split(":")[0] == (NODE1 if snat else CLIENT)
        if snat:
            assert ex["nat"]["source"] == NODE1
            low, high = map(int, SNAT_RANGE.split("-"))  # node1's --snat-port-range
            assert low <= ex["nat"]["first_port"] <= high
    # Different client ports reached different backends, as predicted.
    assert len({r["server"] for r in seen}) >= 2
    # Once a flow exists, explain reads its conntrack entry: a connection held open, since
    # a closed one's entry lasts only EBPFLB_CT_TCP_CLOSE_TIMEOUT (10 s), about what two
    # `ebpflb explain` runs take under emulation (the kernel matrix).
    (port,) = fresh_ports(1)
    holder = env.cluster.spawn(
        env.client, [sys.executable, "-c", HOLDING_CLIENT, f"{NODE1}:30080", str(port)]
    )
    try:
        assert holder.stdout is not None
        held = json.loads(holder.stdout.readline() or "{}")
        assert "server" in held, (held, holder.stderr and holder.stderr.read())
        again = explain_json(env, node1, f"{CLIENT}:{port}", f"{NODE1}:30080/TCP", "--from-outside")
        explain_text(env, node1, f"{CLIENT}:{port}", f"{NODE1}:30080/TCP", "--from-outside")
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert again["selection"]["from_conntrack"]
    assert again["backend"]["backend"] == f"{POD_IPS[held['server']]}:8080"


def test_explain_cluster_ip_connect_and_sendmsg(env: Env) -> None:
    node1 = env.nodes["node1"]
    ex = explain_json(env, node1, "10.244.1.11", "10.96.1.1:80/TCP")
    assert ex["verdict"] == "translated" and not ex["selection"]["deterministic"]
    assert "not reproducible" in explain_text(env, node1, "10.244.1.11", "10.96.1.1:80/TCP")
    assert "prandom" in ex["selection"]["hash_inputs"] and ex["nat"]["snat"] is False
    possible = {c["backend"] for c in ex["candidates"]}
    assert possible == {f"{ip}:8080" for ip in POD_IPS.values()}
    served = env.cluster.requests(node1.netns, "tcp", "10.96.1.1:80", 20, node1.cgroup)
    assert {f"{POD_IPS[r['server']]}:8080" for r in served} <= possible
    # Unconnected UDP: the slot is a hash of the socket cookie, so with the cookie it is exact.
    sockets = run_lines(env, node1.netns, COOKIE_CLIENT, "10.96.1.1:53", "6", cgroup=node1.cgroup)
    for result in sockets:
        ex = explain_json(
            env,
            node1,
            "10.244.1.11",
            "10.96.1.1:53/UDP",
            "--sendmsg",
            "--socket-cookie",
            str(result["cookie"]),
        )
        assert ex["selection"]["deterministic"]
        assert ex["backend"]["backend"] == f"{POD_IPS[result['server']]}:5353", (result, ex)
    assert len({r["server"] for r in sockets}) >= 2


def test_explain_external_traffic_policy_local(env: Env) -> None:
    node1, node2 = env.nodes["node1"], env.nodes["node2"]
    port = fresh_ports(1)[0]
    ex = explain_json(env, node1, f"{CLIENT}:{port}", f"{NODE1}:30081/TCP", "--ingress", "eth0")
    assert ex["verdict"] == "translated" and "etp_local" in ex["frontend"]["flags"]
    assert ex["backend"]["backend"] == "10.244.1.11:8080" and ex["nat"]["snat"] is False
    (result,) = run_lines(env, env.client, FIXED_PORT_CLIENT, f"{NODE1}:30081", str(port))
    assert (result["server"], result["seen_as"].split(":")[0]) == ("pod11", CLIENT)
    ex = explain_json(env, node2, f"{CLIENT}:{port}", f"{NODE2}:30081/TCP", "--ingress", "eth0")
    assert ex["verdict"] == "dropped" and "this node" in ex["reason"]
    assert "verdict: dropped" in explain_text(
        env, node2, f"{CLIENT}:{port}", f"{NODE2}:30081/TCP", "--ingress", "eth0"
    )
    failed = env.cluster.requests(env.client, "tcp", f"{NODE2}:30081", 1, None, timeout=1.0)
    assert not failed[0]["ok"]


def test_explain_no_endpoints(env: Env) -> None:
    node1 = env.nodes["node1"]
    ex = explain_json(env, node1, "10.244.1.11", "10.96.1.9:80/TCP")
    assert ex["verdict"] == "refused" and ex["frontend"]["table_size"] == 0
    assert "ECONNREFUSED" in explain_text(env, node1, "10.244.1.11", "10.96.1.9:80/TCP")
    refused = env.cluster.requests(node1.netns, "tcp", "10.96.1.9:80", 1, node1.cgroup)
    assert refused[0].get("error") == REFUSAL
    ex = explain_json(env, node1, f"{CLIENT}:5000", f"{NODE1}:30099/UDP", "--from-outside")
    assert ex["verdict"] == "rejected" and "ICMP port unreachable" in ex["reason"]
    ex = explain_json(env, node1, f"{CLIENT}:5000", "10.96.1.1:80/TCP", "--from-outside")
    assert ex["verdict"] == "not translated"  # a ClusterIP is never served from outside


def test_explain_rejects_tcp_without_endpoints_with_a_rst(env: Env) -> None:
    node1 = env.nodes["node1"]
    port = fresh_ports(1)[0]
    args = (f"{CLIENT}:{port}", f"{NODE1}:30098/TCP", "--ingress", "eth0")
    ex = explain_json(env, node1, *args)
    assert ex["verdict"] == "rejected" and "TCP RST" in ex["reason"]
    assert "reject" in ex["frontend"]["flags"] and ex["steps"][-1]["name"] == "reject"
    assert "verdict: rejected" in explain_text(env, node1, *args)
    before = node1.counter("np_reject")
    started = time.monotonic()
    (result,) = run_lines(env, env.client, FIXED_PORT_CLIENT, f"{NODE1}:30098", str(port))
    assert result.get("error") == "ConnectionRefusedError", result
    assert time.monotonic() - started < 2.5  # answered, not timed out (the client waits 3 s)
    assert node1.counter("np_reject") - before == 1


def test_explain_external_policy_local_from_inside_the_node(env: Env) -> None:
    """node2 has no endpoint of default/local (eTP Local, pod11 only): from outside its
    nodePort drops (test_explain_external_traffic_policy_local), while node2's own
    clients use the internal scope and reach pod11 on node1."""
    node2 = env.nodes["node2"]
    ex = explain_json(env, node2, NODE2, f"{NODE2}:30081/TCP")
    assert ex["verdict"] == "translated" and ex["frontend"]["scope"] == "internal"
    assert ex["frontend"]["frontend"] == f"{NODE2}:30081/TCP/internal"
    assert [s["name"] for s in ex["steps"]][:2] == ["frontend", "internal scope"]
    assert [c["backend"] for c in ex["candidates"]] == ["10.244.1.11:8080"]
    assert "internal scope" in explain_text(env, node2, NODE2, f"{NODE2}:30081/TCP")
    served = env.cluster.requests(node2.netns, "tcp", f"{NODE2}:30081", 5, node2.cgroup)
    assert {r.get("server") for r in served} == {"pod11"}, served


NETNS_COOKIE_CLIENT = """\
import socket
SO_NETNS_COOKIE = 71
s = socket.socket()
print(int.from_bytes(s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little"))
"""


def netns_cookie(env: Env, node: NodeAgent, address: str) -> int:
    """The node namespace's cookie: SO_NETNS_COOKIE (5.14+); before it, the only socket-LB
    affinity entry of the sticky service, which explain lists (one client made it)."""
    if has_so_netns_cookie():
        (cookie,) = run_lines(env, node.netns, NETNS_COOKIE_CLIENT)
        return int(cookie)
    entries = explain_json(env, node, address, "10.96.1.10:80/TCP")["affinity"]["entries"]
    (client,) = [e["client"] for e in entries if e["client"].startswith("netns cookie ")]
    return int(client.removeprefix("netns cookie "))


def has_so_netns_cookie() -> bool:
    with socket.socket() as s:
        try:
            s.getsockopt(socket.SOL_SOCKET, 71, 8)  # SO_NETNS_COOKIE
        except OSError:
            return False
    return True


def test_explain_session_affinity(env: Env) -> None:
    """At the nodePort the client's first connection goes where its 5-tuple hashes (explain
    says so, with no entry yet) and the next ones, from other ports, follow the entry it
    left (explain names that backend from it). In socket-LB the client is its network
    namespace: with --netns-cookie explain names the backend too."""
    node1 = env.nodes["node1"]
    first, *rest = fresh_ports(8)
    target = f"{NODE1}:30210/TCP"
    ex = explain_json(env, node1, f"{CLIENT}:{first}", target, "--ingress", "eth0", *SNAT)
    assert ex["affinity"]["outcome"] == "miss" and ex["selection"]["deterministic"]
    predicted = ex["backend"]["backend"]
    seen = run_lines(env, env.client, FIXED_PORT_CLIENT, f"{NODE1}:30210", str(first))
    assert [f"{POD_IPS[r['server']]}:8080" for r in seen] == [predicted], seen
    for args in ((f"{CLIENT}:{rest[0]}", "--ingress", "eth0", *SNAT), (CLIENT, "--from-outside")):
        ex = explain_json(env, node1, args[0], target, *args[1:])
        assert ex["affinity"]["outcome"] == "hit" and ex["selection"]["from_affinity"]
        assert ex["affinity"]["client"] == CLIENT and ex["affinity"]["timeout_s"] == 3600
        assert ex["backend"]["backend"] == predicted
    explain_text(env, node1, f"{CLIENT}:{rest[0]}", target, "--ingress", "eth0", *SNAT)
    seen = run_lines(env, env.client, FIXED_PORT_CLIENT, f"{NODE1}:30210", *map(str, rest))
    assert {f"{POD_IPS[r['server']]}:8080" for r in seen} == {predicted}, seen
    # Socket-LB: node1's host network namespace is one client.
    served = env.cluster.requests(node1.netns, "tcp", "10.96.1.10:80", 10, node1.cgroup)
    (server,) = {r["server"] for r in served}
    cookie = netns_cookie(env, node1, NODE1)
    ex = explain_json(env, node1, NODE1, "10.96.1.10:80/TCP", "--netns-cookie", str(cookie))
    assert ex["affinity"]["outcome"] == "hit" and ex["affinity"]["keyed_by"] == "network namespace"
    assert ex["backend"]["backend"] == f"{POD_IPS[server]}:8080"
    explain_text(env, node1, NODE1, "10.96.1.10:80/TCP", "--netns-cookie", str(cookie))
    ex = explain_json(env, node1, NODE1, "10.96.1.10:80/TCP")
    assert ex["affinity"]["outcome"] == "unknown" and ex["backend"] is None
    entries = {e["client"]: e for e in ex["affinity"]["entries"]}
    assert entries[f"netns cookie {cookie}"]["followed"]
    assert entries[f"netns cookie {cookie}"]["backend"] == f"{POD_IPS[server]}:8080"


def test_a_reused_service_id_counts_from_zero(env: Env) -> None:
    """After test_explain_no_endpoints (which needs default/empty on node1): default/empty
    goes and another service takes its ids in the same sync; its counters start at 0."""
    node1 = env.nodes["node1"]
    agent = agent_of(node1)
    env.cluster.requests(node1.netns, "tcp", "10.96.1.9:80", 2, node1.cgroup)  # refused
    old = {s["frontend"]: s["svc_id"] for s in node1.dump()["services"]}  # type: ignore[union-attr]
    old_ids = {
        i for f, i in old.items() if f.startswith(("10.96.1.9:", f"{NODE1}:3009", "127.0.0.1:3009"))
    }
    before = agent.metrics()
    empty_http = {"service": "default/empty", "port": "http", "protocol": "TCP"}
    assert (
        before.value("ebpflb_service_refused_total", frontend="10.96.1.9:80", **empty_http) or 0
    ) >= 2
    reused = EMPTY_SERVICE.replace("name: empty", "name: reused").replace("10.96.1.9", "10.96.1.8")
    (node1.manifests / "empty.yaml").write_text(reused)
    labels = {"service": "default/reused", "port": "http", "protocol": "TCP"}
    wait_until(
        lambda: (
            agent.metrics().value("ebpflb_service_refused_total", frontend="10.96.1.8:80", **labels)
            is not None
        ),
        "default/reused programmed",
    )
    new = {s["frontend"]: s["svc_id"] for s in node1.dump()["services"]}  # type: ignore[union-attr]
    new_ids = {
        i for f, i in new.items() if f.startswith(("10.96.1.8:", f"{NODE1}:3009", "127.0.0.1:3009"))
    }
    assert new_ids == old_ids  # lowest free ids first: the same ones
    after = agent.metrics()
    for metric in ("refused", "socket_translations", "nodeport_packets"):
        assert after.value(f"ebpflb_service_{metric}_total", frontend="10.96.1.8:80", **labels) == 0


def test_explain_works_with_the_agent_down(env: Env) -> None:
    """Last in the module: node2's agent stops; its pins and programs stay."""
    node2 = env.nodes["node2"]
    agent_of(node2).stop()
    port = fresh_ports(1)[0]
    ex = explain_json(env, node2, f"{CLIENT}:{port}", f"{NODE2}:30080/TCP", "--ingress", "eth0")
    assert ex["verdict"] == "translated" and ex["selection"]["deterministic"]
    (result,) = run_lines(env, env.client, FIXED_PORT_CLIENT, f"{NODE2}:30080", str(port))
    assert f"{POD_IPS[result['server']]}:8080" == ex["backend"]["backend"], (result, ex)
