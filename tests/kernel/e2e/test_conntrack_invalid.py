"""Upstream `[sig-network] Conntrack should drop INVALID conntrack entries [Privileged]`
(test/e2e/network/conntrack.go, kubernetes#74839), ported.

Upstream's boom-server answers every data segment of its client with a second, forged
segment whose sequence number is far outside the window. nf_conntrack marks it INVALID and,
without kube-proxy's rule dropping such packets, it reaches the client without its reverse
DNAT: from the pod's address, which no client socket matches, so the client's kernel sends
a RST that kills the server's side of the connection. The client, talking to the Service's
ClusterIP, must see no reset. Here the boom packets go through ebpflb instead: on the
socket-LB path the client's socket is connected to the pod itself; on the per-packet path
the reply translation applies to them as to any segment of the flow; either way the
client's kernel sees an out-of-window segment of its own connection, answers it with an
ACK, and the connection lives on.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from tests.factories import service
from tests.kernel.e2e.harness import E2E, slice_for, wait_programmed

PORT = 9000  # upstream's boom-server port
SECONDS = 3.0  # of client traffic (upstream: the client's lifetime, minutes)

# A TCP echo server on argv[1] and, beside it, the boom: for each data segment it receives,
# a forged ACK carrying 4 bytes at sequence number ack + 1,000,000 (out of any window).
BOOM_SERVER = r"""
import json, socket, sys, threading
from scapy.all import IP, TCP, Raw, send, sniff
port, lifetime = int(sys.argv[1]), float(sys.argv[2])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", port)); srv.listen(); srv.settimeout(lifetime)
def echo():
    conn, _ = srv.accept(); conn.settimeout(lifetime)
    while data := conn.recv(4096):
        conn.sendall(data)
threading.Thread(target=echo, daemon=True).start()
booms = 0
def boom(pkt):
    global booms
    ip, tcp = pkt[IP], pkt[TCP]
    if ip.dst == ip.src or not len(tcp.payload):
        return
    forged = TCP(sport=tcp.dport, dport=tcp.sport, flags="A", seq=tcp.ack + 1000000,
                 ack=tcp.seq + len(tcp.payload))
    send(IP(src=ip.dst, dst=ip.src) / forged / Raw(b"boom"), verbose=False)
    booms += 1
    print(json.dumps({"booms": booms}), flush=True)
print("ready", flush=True)
sniff(iface="eth0", lfilter=lambda p: TCP in p and p[TCP].dport == port, prn=boom,
      timeout=lifetime, store=False)
"""

# Sends a line every 0.1 s for argv[2] seconds and reads its echo; the outcome as JSON.
CLIENT = r"""
import json, socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
sent = echoed = 0
error = None
try:
    s = socket.create_connection((host, int(port)), timeout=5)
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        line = b"ping %d\n" % sent
        s.sendall(line); sent += 1
        got = b""
        while len(got) < len(line):
            chunk = s.recv(len(line) - len(got))
            if not chunk:
                raise ConnectionError("closed by the server")
            got += chunk
        echoed += got == line
        time.sleep(0.1)
except OSError as exc:
    error = repr(exc)
print(json.dumps({"sent": sent, "echoed": echoed, "error": error}), flush=True)
"""


@pytest.mark.pod_clients
@pytest.mark.upstream("[sig-network] Conntrack should drop INVALID conntrack entries [Privileged]")
def test_drop_invalid_conntrack_entries(e2e: E2E) -> None:
    a = e2e.allocate("boom-server")
    e2e.apply(
        service(
            a.name,
            cluster_ip=a.cluster_ip,
            ports=[{"name": "tcp", "protocol": "TCP", "port": PORT, "targetPort": PORT}],
        ),
        slice_for(a.name, ["pod21"], [{"name": "tcp", "protocol": "TCP", "port": PORT}]),
    )
    cluster = e2e.shared.cluster
    server = cluster.spawn(
        e2e.shared.pods["pod21"].netns,
        [sys.executable, "-c", BOOM_SERVER, str(PORT), str(SECONDS + 60)],
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready", _stderr(server)
        target = f"{a.cluster_ip}:{PORT}"
        wait_programmed(e2e, f"{target}/TCP", ["node1"])  # the server takes one connection
        done = _client(e2e, "client1", target)
        assert done["error"] is None, (done, _stderr(server))
        assert done["sent"] >= 10 and done["echoed"] == done["sent"], done
    finally:
        if server.poll() is None:
            server.kill()
        out, _ = server.communicate(timeout=30)
    booms = [json.loads(line)["booms"] for line in out.splitlines() if line.startswith("{")]
    # Every data segment of the client got its forged out-of-window answer.
    assert booms and booms[-1] >= done["sent"], (booms[-3:], done)


def _client(e2e: E2E, pod: str, target: str) -> dict[str, Any]:
    """The client pod's run, in its node's pod cgroup as E2E.from_pod's clients."""
    cgroup = e2e.shared.pod_cgroup("node1")
    done = e2e.shared.cluster.run(
        e2e.shared.pods[pod].netns,
        [sys.executable, "-c", CLIENT, target, str(SECONDS)],
        cgroup,
        timeout=SECONDS + 30,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.splitlines()[-1]))


def _stderr(proc: Any) -> str:
    return proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
