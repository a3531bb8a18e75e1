"""kube-proxy's rulesets from lab.bench.kubeproxy, loaded into real netfilter: they work.

Per mode (iptables-legacy, iptables-nft, nftables) and family (IPv4: iptables, table ip;
IPv6: ip6tables, table ip6) a topology of our own namespaces (NETS):

    external 192.168.50.2 --- 192.168.50.1 node 192.168.51.1 --- 192.168.51.2 backends
    external fd00:50::2   --- fd00:50::1   node fd00:51::1   --- fd00:51::2   backends

The backends namespace accepts the whole endpoint range of the family (10.128.0.0/11 or
fd00:128::/107, an AnyIP local route) on port 8080 and answers "<address it was reached
at> <peer address>", so a client learns which endpoint the rules picked and which source
the endpoint saw. The node routes the service and endpoint ranges to it; the backends
route the external link back through the node (an externalTrafficPolicy Local endpoint
answers the client's own address). Nothing here has a
route out of these namespaces, and every connection is made from inside them. IPv6
addresses are added without duplicate address detection, so they are usable at once.

The bench's --mix services (scenario.Mix) run here too: the backends are "local" or not
only by their EndpointSlice's nodeName, which is what kube-proxy's rules go by.
"""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from lab.bench.kubeproxy import iptables, naming, nftables
from lab.bench.kubeproxy.naming import ServicePort
from lab.bench.scenario import NODE_PORT, PLANS, BenchService, Family, Mix, bench_services
from lab.bench.topology import ipv6_on
from lab.harness.netns import Namespaces, sh

pytestmark = pytest.mark.kernel


@dataclass(frozen=True)
class Net:
    """The lab's addresses in one family."""

    node_ext: str
    external: str
    node_int: str
    backends: str
    prefix_len: int

    @property
    def external_net(self) -> str:
        """The external link's network (the backends' route back for a Local policy)."""
        return str(ipaddress.ip_interface(f"{self.external}/{self.prefix_len}").network)


NETS = {
    Family.IPV4: Net("192.168.50.1", "192.168.50.2", "192.168.51.1", "192.168.51.2", 24),
    Family.IPV6: Net("fd00:50::1", "fd00:50::2", "fd00:51::1", "fd00:51::2", 64),
}
MODES = ("iptables-legacy", "iptables-nft", "nftables")

SERVER = r"""
import socket, sys, time
family = socket.AF_INET6 if sys.argv[2] == "ipv6" else socket.AF_INET
listener = socket.socket(family)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if family == socket.AF_INET6:
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
listener.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 8080))
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
    family: Family
    net: Net = field(init=False)
    services: list[BenchService] = field(init=False)  # the last one is the NodePort service
    # 0: ClientIP affinity, 1: internalTrafficPolicy Local, 2: NodePort NODE_PORT + 1 with
    # externalTrafficPolicy Local, 3: the plain NodePort service. Local endpoints: the first
    # two.
    mixed: list[BenchService] = field(init=False)

    def __post_init__(self) -> None:
        self.net = NETS[self.family]
        self.services = bench_services(3, 3, family=self.family)
        self.mixed = bench_services(4, 3, mix=(Mix.AFFINITY, Mix.LOCAL), family=self.family)

    @property
    def tool(self) -> str:
        """iptables-legacy, ip6tables-nft, ...: the iptables tool of the lab's family."""
        return iptables.tool(self.mode, self.family)

    @property
    def nft_table(self) -> str:
        return nftables.SYNTAX[self.family].table

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
            self.run(self.node, [f"{self.tool}-restore", *iptables.RESTORE_FLAGS], text)

    def setup(self, services: list[BenchService] | None = None) -> set[str]:
        """What kube-proxy does before its first sync, then the full sync (of the lab's
        services unless given); the chains the ruleset defines."""
        services = self.services if services is None else services
        if self.mode == "nftables":
            text = nftables.full_sync(services, family=self.family, node_ip=self.net.node_ext)
            self.load(text)
            return set(re.findall(rf"^add chain {self.nft_table} (\S+)", text, re.M))
        for argv in iptables.nfacct_argv():
            self.run(self.node, argv)
        for argv in iptables.setup_argv(self.tool):
            self.run(self.node, argv)
        text = iptables.full_sync(services, family=self.family)
        self.load(text)
        nat = text.split("*nat\n", 1)[1]
        return {ln[1:].split()[0] for ln in nat.splitlines() if ln.startswith(":")} | {
            "KUBE-PROXY-CANARY"
        }

    def nat_chains(self) -> set[str]:
        """Our chains as the kernel lists them."""
        if self.mode == "nftables":
            out = self.run(self.node, ["nft", "list", "table", *self.nft_table.split()])
            return set(re.findall(r"^\s*chain (\S+) \{", out, re.M))
        out = self.run(self.node, [f"{self.tool}-save", "-t", "nat"])
        return {line[1:].split()[0] for line in out.splitlines() if line.startswith(":KUBE-")}

    def nat_rules(self) -> int:
        out = self.run(self.node, [f"{self.tool}-save", "-t", "nat"])
        return sum(1 for line in out.splitlines() if line.startswith("-A KUBE-"))


@pytest.fixture(
    params=[(mode, family) for family in Family for mode in MODES],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    mode: str
    family: Family
    mode, family = request.param
    tool = "nft" if mode == "nftables" else f"{iptables.tool(mode, family)}-restore"
    if subprocess.run(["which", tool], capture_output=True).returncode != 0:
        pytest.fail(f"{tool} is not installed")
    net, plan = NETS[family], PLANS[family]
    tag = uuid.uuid4().hex[:6]
    ns = Namespaces(f"elb{tag}")
    try:
        node = ns.add_namespace("node", forwarding=True)
        external = ns.add_namespace("ext")
        backends = ns.add_namespace("be")
        if family is Family.IPV6:  # before the links, so their interfaces inherit it
            for netns in (node, external, backends):
                ipv6_on(netns, forwarding=netns == node)
        ns.link(external, "eth0", node, f"x{tag}")
        ns.link(node, f"b{tag}", backends, "eth0")
        nodad = ("nodad",) if family is Family.IPV6 else ()
        for netns, address, dev in (
            (external, net.external, "eth0"),
            (node, net.node_ext, f"x{tag}"),
            (node, net.node_int, f"b{tag}"),
            (backends, net.backends, "eth0"),
        ):
            sh("ip", "-n", netns, "addr", "add", f"{address}/{net.prefix_len}", "dev", dev, *nodad)
        endpoint_cidr = str(plan.endpoint_cidr)
        sh("ip", "-n", backends, "route", "add", "local", endpoint_cidr, "dev", "lo")
        for cidr in (endpoint_cidr, str(plan.service_cidr)):
            sh("ip", "-n", node, "route", "add", cidr, "via", net.backends)
        sh("ip", "-n", backends, "route", "add", net.external_net, "via", net.node_int)
        server = ns.spawn(backends, [sys.executable, "-c", SERVER, "300", family.value])
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield Lab(ns, node, external, mode, family)
    finally:
        ns.close()


def _endpoints(lab: Lab, index: int, ready: int | None = None) -> set[str]:
    endpoints = lab.services[index].endpoints
    return set(endpoints if ready is None else endpoints[:ready])


def test_full_sync_serves_clusterips_and_the_nodeport(lab: Lab) -> None:
    defined = lab.setup()
    assert lab.nat_chains() == defined
    for svc in lab.services:
        answers = lab.connect(lab.node, svc.vip, 80, 30)
        # Every endpoint is used (a miss has probability 3 * (2/3)**30 < 2e-5) ...
        assert {local for local, _ in answers} == _endpoints(lab, svc.index)
        # ... and the node's own traffic keeps its address (masquerade picks the same).
        assert {peer for _, peer in answers} == {lab.net.node_int}
    answers = lab.connect(lab.external, lab.net.node_ext, NODE_PORT, 20)
    assert {local for local, _ in answers} <= _endpoints(lab, 2)
    # NodePort DNAT + masquerade: the endpoint sees the node, not the external client.
    assert {peer for _, peer in answers} == {lab.net.node_int}
    # Only the NodePort service answers on the node's address.
    failed = lab.run(lab.external, [sys.executable, "-c", CLIENT, lab.net.node_ext, "30081", "1"])
    assert json.loads(failed)[0][0] == "error"


def test_partial_syncs_apply_on_the_full_one(lab: Lab) -> None:
    chains = lab.setup()
    services: list[BenchService | ServicePort] = list(lab.services)
    for index, ready in ((1, 2), (2, 1)):  # a ClusterIP service, then the NodePort one
        before = services
        services = [
            ServicePort.of(s).with_ready(ready) if s is before[index] else s for s in before
        ]
        changed = ServicePort.of(before[index])
        if lab.mode == "nftables":
            stale = {naming.nft_endpoint_chain(changed, ip) for ip in changed.endpoints[ready:]}
            lab.load(nftables.partial_sync(before, index, ready, family=lab.family))
            assert lab.nat_chains() == chains  # stale chains are flushed, not yet deleted
            lab.load(nftables.stale_cleanup(before, index, ready, family=lab.family))
        else:
            stale = {naming.sep_chain(changed, ip) for ip in changed.endpoints[ready:]}
            lab.load(iptables.partial_sync(before, index, ready, family=lab.family))
            nat = iptables.full_sync(services, family=lab.family).split("*nat\n", 1)[1]
            assert lab.nat_rules() == sum(1 for ln in nat.splitlines() if ln.startswith("-A"))
        chains -= stale
        assert lab.nat_chains() == chains
        answers = lab.connect(lab.node, lab.services[index].vip, 80, 30)
        assert {local for local, _ in answers} == _endpoints(lab, index, ready)
    # The untouched service still has all its endpoints; the NodePort one only its first.
    assert {a for a, _ in lab.connect(lab.node, lab.services[0].vip, 80, 30)} == _endpoints(lab, 0)
    answers = lab.connect(lab.external, lab.net.node_ext, NODE_PORT, 10)
    assert answers == [(lab.services[2].endpoints[0], lab.net.node_int)] * 10


def test_affinity_keeps_a_client_on_one_endpoint(lab: Lab) -> None:
    lab.setup(lab.mixed)
    sticky, plain = lab.mixed[0], lab.mixed[3]
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
        lab.load(nftables.partial_sync(lab.mixed, 0, ready, family=lab.family))
        lab.load(nftables.stale_cleanup(lab.mixed, 0, ready, family=lab.family))
        out = lab.run(lab.node, ["nft", "list", "table", *lab.nft_table.split()])
        sets = set(re.findall(r"^\s*set (affinity-\S+) \{", out, re.M))
        changed = ServicePort.of(sticky)
        assert sets == {naming.nft_affinity_set(changed, ip) for ip in changed.endpoints[:ready]}
    else:
        lab.load(iptables.partial_sync(lab.mixed, 0, ready, family=lab.family))
    after = {local for local, _ in lab.connect(lab.node, sticky.vip, 80, 20)}
    assert len(after) == 1 and after <= set(sticky.endpoints[:ready])


def test_local_policies_reach_only_the_nodes_endpoints(lab: Lab) -> None:
    lab.setup(lab.mixed)
    itp, etp = lab.mixed[1], lab.mixed[2]
    assert itp.internal_local and etp.external_local and etp.node_port == NODE_PORT + 1
    local = set(itp.endpoints[:2])
    # internalTrafficPolicy Local: the node's clients reach only (all) its own endpoints
    # (missing one of two in 30 tries: 2 * (1/2)**30).
    answers = lab.connect(lab.node, itp.vip, 80, 30)
    assert {a for a, _ in answers} == local
    # externalTrafficPolicy Local, from outside: only the local endpoints, and they see the
    # client's own address (no masquerade) ...
    answers = lab.connect(lab.external, lab.net.node_ext, etp.node_port, 30)
    assert {a for a, _ in answers} == set(etp.endpoints[:2])
    assert {peer for _, peer in answers} == {lab.net.external}
    # ... while the node's own connection to the NodePort, and its ClusterIP, reach every
    # endpoint (kube-proxy's "route LOCAL traffic" short-circuit), masqueraded.
    answers = lab.connect(lab.node, lab.net.node_ext, etp.node_port, 30)
    assert {a for a, _ in answers} == set(etp.endpoints)
    assert {peer for _, peer in answers} == {lab.net.node_int}
    assert {a for a, _ in lab.connect(lab.node, etp.vip, 80, 30)} == set(etp.endpoints)
    # The plain NodePort service still masquerades and uses every endpoint.
    plain = lab.mixed[3]
    answers = lab.connect(lab.external, lab.net.node_ext, NODE_PORT, 30)
    assert {a for a, _ in answers} == set(plain.endpoints)
    assert {peer for _, peer in answers} == {lab.net.node_int}
