"""kube-proxy's rulesets from ebpflb.bench.kubeproxy, loaded into real netfilter: they work.

Per mode (iptables-legacy, iptables-nft, nftables) a topology of our own namespaces:

    external 192.168.50.2 --- 192.168.50.1 node 192.168.51.1 --- 192.168.51.2 backends

The backends namespace accepts all of 10.128.0.0/11 (an AnyIP local route) on 0.0.0.0:8080
and answers "<address it was reached at> <peer address>", so a client learns which
endpoint the rules picked and which source the endpoint saw. The node routes the service
and endpoint ranges to it; the backends route the external link back through the node (an
externalTrafficPolicy Local endpoint answers the client's own address). Nothing here has a
route out of these namespaces, and every connection is made from inside them.

The bench's --mix services (scenario.Mix) run here too: the backends are "local" or not
only by their EndpointSlice's nodeName, which is what kube-proxy's rules go by.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ebpflb.bench.kubeproxy import iptables, naming, nftables
from ebpflb.bench.kubeproxy.naming import ServicePort
from ebpflb.bench.scenario import (
    ENDPOINT_CIDR,
    NODE_PORT,
    SERVICE_CIDR,
    BenchService,
    Mix,
    bench_services,
)
from ebpflb.testing.netns import Namespaces, sh

pytestmark = pytest.mark.kernel

NODE_EXT, EXTERNAL = "192.168.50.1", "192.168.50.2"
NODE_INT, BACKENDS = "192.168.51.1", "192.168.51.2"
SERVICES = bench_services(3, 3)  # the last one is the NodePort service
# 0: ClientIP affinity, 1: internalTrafficPolicy Local, 2: NodePort NODE_PORT + 1 with
# externalTrafficPolicy Local, 3: the plain NodePort service. Local endpoints: the first two.
MIXED = bench_services(4, 3, mix=(Mix.AFFINITY, Mix.LOCAL))
MODES = ("iptables-legacy", "iptables-nft", "nftables")

SERVER = r"""
import socket, sys, time
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("0.0.0.0", 8080))
listener.listen(128)
listener.settimeout(1)
print("ready", flush=True)
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    try:
        conn, peer = listener.accept()
    except TimeoutError:
        continue
    with conn:
        conn.sendall(f"{conn.getsockname()[0]} {peer[0]}\n".encode())
"""

CLIENT = r"""
import json, socket, sys
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
answers = []
for _ in range(count):
    try:
        with socket.create_connection((host, port), timeout=2) as s:
            s.settimeout(2)
            answers.append(s.recv(128).decode().split())
    except OSError as exc:
        answers.append(["error", type(exc).__name__])
print(json.dumps(answers))
"""


@dataclass
class Lab:
    ns: Namespaces
    node: str
    external: str
    mode: str

    def run(self, netns: str, argv: list[str], stdin: str | None = None) -> str:
        done = subprocess.run(
            ["nsenter", f"--net=/run/netns/{netns}", *argv],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{argv[:3]} failed: {done.stderr[-2000:]}"
        return done.stdout

    def connect(self, netns: str, host: str, port: int, count: int) -> list[tuple[str, str]]:
        out = self.run(netns, [sys.executable, "-c", CLIENT, host, str(port), str(count)])
        answers = [tuple(a) for a in json.loads(out)]
        assert all(a[0] != "error" for a in answers), answers
        return [(a[0], a[1]) for a in answers]

    def load(self, text: str) -> None:
        if self.mode == "nftables":
            self.run(self.node, ["nft", "-f", "-"], text)
        else:
            self.run(self.node, [f"{self.mode}-restore", *iptables.RESTORE_FLAGS], text)

    def setup(self, services: list[BenchService] = SERVICES) -> set[str]:
        """What kube-proxy does before its first sync, then the full sync; the chains the
        ruleset defines."""
        if self.mode == "nftables":
            text = nftables.full_sync(services, node_ip=NODE_EXT)
            self.load(text)
            return set(re.findall(r"^add chain ip kube-proxy (\S+)", text, re.M))
        for argv in iptables.nfacct_argv():
            self.run(self.node, argv)
        for argv in iptables.setup_argv(self.mode):
            self.run(self.node, argv)
        text = iptables.full_sync(services)
        self.load(text)
        nat = text.split("*nat\n", 1)[1]
        return {ln[1:].split()[0] for ln in nat.splitlines() if ln.startswith(":")} | {
            "KUBE-PROXY-CANARY"
        }

    def nat_chains(self) -> set[str]:
        """Our chains as the kernel lists them."""
        if self.mode == "nftables":
            out = self.run(self.node, ["nft", "list", "table", "ip", "kube-proxy"])
            return set(re.findall(r"^\s*chain (\S+) \{", out, re.M))
        out = self.run(self.node, [f"{self.mode}-save", "-t", "nat"])
        return {line[1:].split()[0] for line in out.splitlines() if line.startswith(":KUBE-")}

    def nat_rules(self) -> int:
        out = self.run(self.node, [f"{self.mode}-save", "-t", "nat"])
        return sum(1 for line in out.splitlines() if line.startswith("-A KUBE-"))


@pytest.fixture(params=MODES)
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    mode: str = request.param
    tool = "nft" if mode == "nftables" else f"{mode}-restore"
    if subprocess.run(["which", tool], capture_output=True).returncode != 0:
        pytest.fail(f"{tool} is not installed")
    tag = uuid.uuid4().hex[:6]
    ns = Namespaces(f"elb{tag}")
    try:
        node = ns.add_namespace("node", forwarding=True)
        external = ns.add_namespace("ext")
        backends = ns.add_namespace("be")
        ns.link(external, "eth0", node, f"x{tag}")
        ns.link(node, f"b{tag}", backends, "eth0")
        sh("ip", "-n", external, "addr", "add", f"{EXTERNAL}/24", "dev", "eth0")
        sh("ip", "-n", node, "addr", "add", f"{NODE_EXT}/24", "dev", f"x{tag}")
        sh("ip", "-n", node, "addr", "add", f"{NODE_INT}/24", "dev", f"b{tag}")
        sh("ip", "-n", backends, "addr", "add", f"{BACKENDS}/24", "dev", "eth0")
        sh("ip", "-n", backends, "route", "add", "local", str(ENDPOINT_CIDR), "dev", "lo")
        for cidr in (ENDPOINT_CIDR, SERVICE_CIDR):
            sh("ip", "-n", node, "route", "add", str(cidr), "via", BACKENDS)
        sh("ip", "-n", backends, "route", "add", "192.168.50.0/24", "via", NODE_INT)
        server = ns.spawn(backends, [sys.executable, "-c", SERVER, "300"])
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield Lab(ns, node, external, mode)
    finally:
        ns.close()


def _endpoints(index: int, ready: int | None = None) -> set[str]:
    endpoints = SERVICES[index].endpoints
    return set(endpoints if ready is None else endpoints[:ready])


def test_full_sync_serves_clusterips_and_the_nodeport(lab: Lab) -> None:
    defined = lab.setup()
    assert lab.nat_chains() == defined
    for svc in SERVICES:
        answers = lab.connect(lab.node, svc.vip, 80, 30)
        # Every endpoint is used (a miss has probability 3 * (2/3)**30 < 2e-5) ...
        assert {local for local, _ in answers} == _endpoints(svc.index)
        # ... and the node's own traffic keeps its address (masquerade picks the same).
        assert {peer for _, peer in answers} == {NODE_INT}
    answers = lab.connect(lab.external, NODE_EXT, NODE_PORT, 20)
    assert {local for local, _ in answers} <= _endpoints(2)
    # NodePort DNAT + masquerade: the endpoint sees the node, not the external client.
    assert {peer for _, peer in answers} == {NODE_INT}
    # Only the NodePort service answers on the node's address.
    failed = lab.run(lab.external, [sys.executable, "-c", CLIENT, NODE_EXT, "30081", "1"])
    assert json.loads(failed)[0][0] == "error"


def test_partial_syncs_apply_on_the_full_one(lab: Lab) -> None:
    chains = lab.setup()
    services: list[BenchService | ServicePort] = list(SERVICES)
    for index, ready in ((1, 2), (2, 1)):  # a ClusterIP service, then the NodePort one
        before = services
        services = [
            ServicePort.of(s).with_ready(ready) if s is before[index] else s for s in before
        ]
        changed = ServicePort.of(before[index])
        if lab.mode == "nftables":
            stale = {naming.nft_endpoint_chain(changed, ip) for ip in changed.endpoints[ready:]}
            lab.load(nftables.partial_sync(before, index, ready))
            assert lab.nat_chains() == chains  # stale chains are flushed, not yet deleted
            lab.load(nftables.stale_cleanup(before, index, ready))
        else:
            stale = {naming.sep_chain(changed, ip) for ip in changed.endpoints[ready:]}
            lab.load(iptables.partial_sync(before, index, ready))
            nat = iptables.full_sync(services).split("*nat\n", 1)[1]
            assert lab.nat_rules() == sum(1 for ln in nat.splitlines() if ln.startswith("-A"))
        chains -= stale
        assert lab.nat_chains() == chains
        answers = lab.connect(lab.node, SERVICES[index].vip, 80, 30)
        assert {local for local, _ in answers} == _endpoints(index, ready)
    # The untouched service still has all its endpoints; the NodePort one only its first.
    assert {a for a, _ in lab.connect(lab.node, SERVICES[0].vip, 80, 30)} == _endpoints(0)
    answers = lab.connect(lab.external, NODE_EXT, NODE_PORT, 10)
    assert answers == [(SERVICES[2].endpoints[0], NODE_INT)] * 10


def test_affinity_keeps_a_client_on_one_endpoint(lab: Lab) -> None:
    lab.setup(MIXED)
    sticky, plain = MIXED[0], MIXED[3]
    assert sticky.affinity and not plain.affinity
    answers = lab.connect(lab.node, sticky.vip, 80, 20)
    # One endpoint for every new connection (by chance: 3 * (1/3)**20 < 1e-9) ...
    (chosen,) = {local for local, _ in answers}
    assert chosen in sticky.endpoints
    # ... where the same rules without affinity spread the client over all of them.
    assert {a for a, _ in lab.connect(lab.node, plain.vip, 80, 30)} == set(plain.endpoints)
    # A partial sync drops the last endpoint (and with it, if it was the chosen one, the
    # client's affinity): the client sticks to one of those left.
    ready = 2
    if lab.mode == "nftables":
        lab.load(nftables.partial_sync(MIXED, 0, ready))
        lab.load(nftables.stale_cleanup(MIXED, 0, ready))
        out = lab.run(lab.node, ["nft", "list", "table", "ip", "kube-proxy"])
        sets = set(re.findall(r"^\s*set (affinity-\S+) \{", out, re.M))
        changed = ServicePort.of(sticky)
        assert sets == {naming.nft_affinity_set(changed, ip) for ip in changed.endpoints[:ready]}
    else:
        lab.load(iptables.partial_sync(MIXED, 0, ready))
    after = {local for local, _ in lab.connect(lab.node, sticky.vip, 80, 20)}
    assert len(after) == 1 and after <= set(sticky.endpoints[:ready])


def test_local_policies_reach_only_the_nodes_endpoints(lab: Lab) -> None:
    lab.setup(MIXED)
    itp, etp = MIXED[1], MIXED[2]
    assert itp.internal_local and etp.external_local and etp.node_port == NODE_PORT + 1
    local = set(itp.endpoints[:2])
    # internalTrafficPolicy Local: the node's clients reach only (all) its own endpoints
    # (missing one of two in 30 tries: 2 * (1/2)**30).
    answers = lab.connect(lab.node, itp.vip, 80, 30)
    assert {a for a, _ in answers} == local
    # externalTrafficPolicy Local, from outside: only the local endpoints, and they see the
    # client's own address (no masquerade) ...
    answers = lab.connect(lab.external, NODE_EXT, etp.node_port, 30)
    assert {a for a, _ in answers} == set(etp.endpoints[:2])
    assert {peer for _, peer in answers} == {EXTERNAL}
    # ... while the node's own connection to the NodePort, and its ClusterIP, reach every
    # endpoint (kube-proxy's "route LOCAL traffic" short-circuit), masqueraded.
    answers = lab.connect(lab.node, NODE_EXT, etp.node_port, 30)
    assert {a for a, _ in answers} == set(etp.endpoints)
    assert {peer for _, peer in answers} == {NODE_INT}
    assert {a for a, _ in lab.connect(lab.node, etp.vip, 80, 30)} == set(etp.endpoints)
    # The plain NodePort service still masquerades and uses every endpoint.
    plain = MIXED[3]
    answers = lab.connect(lab.external, NODE_EXT, NODE_PORT, 30)
    assert {a for a, _ in answers} == set(plain.endpoints)
    assert {peer for _, peer in answers} == {NODE_INT}
