"""Upstream `[sig-network] KubeProxy should set TCP CLOSE_WAIT timeout [Privileged]`
(test/e2e/network/kube_proxy.go), ported.

Upstream: a client pod on one node connects to a server pod on another and half-closes the
connection; the client node's nf_conntrack entry for it is in CLOSE_WAIT with kube-proxy's
timeout, 3,600 s (--conntrack-tcp-timeout-close-wait), not the kernel's 60 s. Here the
same on node1 (whose nf_conntrack tracks forwarded traffic once a rule uses it: the test
adds one, as a node's CNI or firewall would), and then what ebpflb adds: its own conntrack
gives a half-closed NodePort flow the same lifetime, and the server's data after the
client's FIN still reaches the client translated; once both sides have closed, the flow
has the short close timeout.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ebpflb.config import Config
from ebpflb.datapath.maps import dump
from ebpflb.datapath.maps.kernel import KernelMapSet
from tests.factories import service
from tests.kernel.e2e.harness import (
    CLIENTS,
    E2E,
    NODE_IPS,
    POD_IPS,
    eventually,
    slice_for,
    wait_programmed,
)

PORT = 9090  # the server's own port: the pods' echo servers keep theirs
CLOSE_WAIT_S, CLOSE_S = 3600, 10  # kube-proxy's, and ebpflb's default close timeout
FULL_RESYNC_S = Config().max_sync_period  # the e2e agents' (the default)
TABLE = "e2e_close_wait"

# Accepts two connections; answers each only after the client's FIN and once the file
# argv[2] exists (the test's go), all bounded by 60 s.
SERVER = r"""
import os, socket, sys, threading, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", int(sys.argv[1]))); srv.listen(); srv.settimeout(60)
print("ready", flush=True)
def serve(conn):
    conn.settimeout(60)
    while conn.recv(4096):
        pass
    print("half-closed", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
        time.sleep(0.05)
    conn.sendall(b"after the client's FIN\n"); conn.close()
threads = []
for _ in range(2):
    conn, _peer = srv.accept()
    threads.append(threading.Thread(target=serve, args=(conn,))); threads[-1].start()
for t in threads: t.join(60)
"""

# Connects, sends, half-closes, then prints what the server sends before its FIN.
CLIENT = r"""
import json, socket, sys
host, port = sys.argv[1].rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=60)
s.sendall(b"hello\n"); s.shutdown(socket.SHUT_WR)
print(json.dumps({"local": s.getsockname()[1]}), flush=True)
data = b""
while chunk := s.recv(4096):
    data += chunk
print(json.dumps({"received": data.decode()}), flush=True)
"""


def _nf_conntrack(e2e: E2E, node: str) -> list[list[str]]:
    """node's nf_conntrack table, one token list per entry."""
    done = e2e.shared.cluster.run(e2e.shared.nodes[node].netns, ["cat", "/proc/net/nf_conntrack"])
    assert done.returncode == 0, done.stderr
    return [line.split() for line in done.stdout.splitlines()]


def _timeout_of(entry: list[str]) -> int:
    return int(entry[4])  # "ipv4 2 tcp 6 <seconds left> <state> src=..."


@pytest.fixture
def tracked(e2e: E2E) -> Iterator[None]:
    """node1's nf_conntrack tracks forwarded flows (a rule using it), removed afterwards."""
    netns = e2e.shared.nodes["node1"].netns
    run = e2e.shared.cluster.run
    chain = "type filter hook forward priority 0; ct state established accept;"
    rules = f"table inet {TABLE} {{ chain tracking {{ {chain} }}; }}"
    done = run(netns, ["nft", rules], timeout=10)
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        run(netns, ["nft", "delete", "table", "inet", TABLE], timeout=10)


def _read_json(proc: Any) -> dict[str, Any]:
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.poll() is not None else "no output"
    return dict(json.loads(line))


@pytest.mark.upstream("[sig-network] KubeProxy should set TCP CLOSE_WAIT timeout [Privileged]")
def test_set_tcp_close_wait_timeout(e2e: E2E, tracked: None, tmp_path: Path) -> None:
    cluster = e2e.shared.cluster

    def set_on(node: str) -> bool:
        done = cluster.run(
            e2e.shared.nodes[node].netns,
            ["cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait"],
        )
        return done.stdout.strip() == str(CLOSE_WAIT_S)

    # The agents set it, as kube-proxy: at start where nf_conntrack was loaded then, else
    # at their next full resync after the rule above loaded it (a fresh guest kernel).
    for node in e2e.shared.nodes:
        eventually(functools.partial(set_on, node), f"{node}'s close_wait set", FULL_RESYNC_S + 10)
    a = e2e.allocate("svc-close-wait")
    node_port = a.node_ports[0]
    port = {"name": "tcp", "protocol": "TCP", "port": PORT, "targetPort": PORT}
    e2e.apply(
        service(
            a.name,
            cluster_ip=a.cluster_ip,
            type="NodePort",
            ports=[{**port, "nodePort": node_port}],
        ),
        slice_for(a.name, ["pod21"], [{"name": "tcp", "protocol": "TCP", "port": PORT}]),
    )
    go = tmp_path / "go"
    server = cluster.spawn(
        e2e.shared.pods["pod21"].netns, [sys.executable, "-c", SERVER, str(PORT), str(go)]
    )
    clients: list[Any] = []
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        # Upstream's connection: client pod on node1 to the server pod on node2, directly.
        client_pod = CLIENTS["node1"][0]
        clients.append(
            cluster.spawn(
                e2e.shared.pods[client_pod].netns,
                [sys.executable, "-c", CLIENT, f"{POD_IPS['pod21']}:{PORT}"],
            )
        )
        direct = _read_json(clients[-1])["local"]
        # ebpflb's part: the external client through node1's NodePort (SNAT to node2).
        frontend = f"{NODE_IPS['node1']}:{node_port}"
        wait_programmed(e2e, f"{frontend}/TCP", ["node1"])
        clients.append(
            cluster.spawn(cluster.clients["client"], [sys.executable, "-c", CLIENT, frontend])
        )
        via_nodeport = _read_json(clients[-1])["local"]
        for _ in range(2):
            assert server.stdout.readline().strip() == "half-closed"

        def close_wait() -> list[list[str]]:
            return [
                e
                for e in _nf_conntrack(e2e, "node1")
                if "CLOSE_WAIT" in e and f"sport={direct}" in e and f"dport={PORT}" in e
            ]

        eventually(lambda: bool(close_wait()), "node1's nf_conntrack entry in CLOSE_WAIT", 10)
        (entry,) = close_wait()
        assert CLOSE_WAIT_S - 15 <= _timeout_of(entry) <= CLOSE_WAIT_S, entry

        flow = _flow(e2e, frontend, via_nodeport)
        assert "fin_client" in flow["flags"] and "closing" not in flow["flags"], flow
        assert CLOSE_WAIT_S - 15 <= flow["expires_in"] <= CLOSE_WAIT_S, flow

        go.touch()  # the server answers, then closes its side
        for client in clients:
            out, err = client.communicate(timeout=30)
            assert json.loads(out.splitlines()[-1]) == {"received": "after the client's FIN\n"}, err
        flow = _flow(e2e, frontend, via_nodeport)
        assert {"fin_client", "fin_backend", "closing"} <= set(flow["flags"]), flow
        assert flow["expires_in"] <= CLOSE_S, flow
    finally:
        for proc in (*clients, server):
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)


def _flow(e2e: E2E, frontend: str, client_port: int) -> dict[str, Any]:
    """node1's ebpflb conntrack entry of the external client's flow (maps dump's row)."""
    with KernelMapSet(e2e.shared.nodes["node1"].bpffs) as maps:
        rows = [
            f
            for f in dump.collect(maps)["conntrack"]
            if f["frontend"] == frontend and f["client"].endswith(f":{client_port}")
        ]
    assert len(rows) == 1, rows
    return rows[0]
