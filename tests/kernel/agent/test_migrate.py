"""`ebpflb cleanup --kube-proxy` in a network namespace of the test's own, on the rulesets
kube-proxy writes (lab.bench.kubeproxy: its iptables mode through both backends of the
iptables tool, its nftables mode), next to rules, tables and an interface that are not
kube-proxy's: those must survive untouched.

IPVS mode's kube-ipvs0 is a dummy interface, and this kernel has no dummy driver: only the
other half is tested here (an interface of that name that is not a dummy stays)."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from lab.bench.kubeproxy import iptables, nftables
from lab.bench.scenario import bench_services
from lab.harness.netns import Namespaces, sh

pytestmark = pytest.mark.kernel

SERVICES = bench_services(3, 3)
NODE_IP = "192.168.52.1"
BACKENDS = ("iptables-legacy", "iptables-nft")
# Rules, a chain and a table that are someone else's; kubelet's KUBE-FIREWALL chain and
# its jumps are kube-proxy's ruleset too (iptables.IPTABLES_JUMPS) but kubelet owns them.
FOREIGN_IPTABLES = """\
*nat
:FOREIGN-NAT - [0:0]
-A POSTROUTING -s 10.99.0.0/16 -m comment --comment "foreign masquerade" -j MASQUERADE
-A FOREIGN-NAT -p tcp --dport 7777 -j RETURN
-A PREROUTING -j FOREIGN-NAT
COMMIT
*filter
-A INPUT -p tcp --dport 2222 -m comment --comment "foreign accept" -j ACCEPT
COMMIT
"""
FOREIGN_NFT = """\
table ip foreign {
  chain input {
    type filter hook input priority 0;
    tcp dport 2222 counter accept
  }
}
"""
KUBELET_CHAINS = {"KUBE-FIREWALL"}


def run(netns: str, argv: list[str], stdin: str | None = None) -> str:
    done = subprocess.run(
        ["nsenter", f"--net=/run/netns/{netns}", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{argv} failed: {done.stderr[-2000:]}"
    return done.stdout


def rules(netns: str, backend: str) -> list[str]:
    """The ruleset as iptables-save prints it, without comments and counters."""
    out = run(netns, [f"{backend}-save"])
    return [
        re.sub(r"\[\d+:\d+\]", "", line).strip()
        for line in out.splitlines()
        if line and not line.startswith("#")
    ]


def kube_lines(lines: list[str]) -> list[str]:
    return [ln for ln in lines if "KUBE-" in ln and not any(c in ln for c in KUBELET_CHAINS)]


@pytest.fixture
def node() -> Iterator[str]:
    ns = Namespaces(f"elb{uuid.uuid4().hex[:6]}")
    try:
        netns = ns.add_namespace("node", forwarding=True)
        sh("ip", "-n", netns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
        sh("ip", "-n", netns, "addr", "add", f"{NODE_IP}/24", "dev", "eth0")
        sh("ip", "-n", netns, "link", "set", "eth0", "up")
        yield netns
    finally:
        ns.close()


def load_kube_proxy(netns: str) -> None:
    """kube-proxy's iptables ruleset through both iptables backends (as on a node where
    kube-proxy switched backends once) and its nftables ruleset."""
    for backend in BACKENDS:
        for argv in iptables.setup_argv(backend):
            run(netns, argv)
        run(
            netns,
            [f"{backend}-restore", *iptables.RESTORE_FLAGS],
            iptables.full_sync(SERVICES, nfacct=False),
        )
    run(netns, ["nft", "-f", "-"], nftables.full_sync(SERVICES, node_ip=NODE_IP))


def expected_counts() -> tuple[int, int]:
    """kube-proxy's chains in the generated ruleset (per table, with the canary chain of
    nat, filter and mangle) and its jump rules from the built-in chains."""
    text = iptables.full_sync(SERVICES, nfacct=False)
    chains = 3  # KUBE-PROXY-CANARY in mangle, nat and filter (iptables_setup_argv)
    for section in text.split("*")[1:]:
        declared = {ln[1:].split()[0] for ln in section.splitlines() if ln.startswith(":")}
        chains += len({c for c in declared if c.startswith("KUBE-")} - KUBELET_CHAINS)
    jumps = sum(1 for _, _, target, _, _ in iptables.IPTABLES_JUMPS if target not in KUBELET_CHAINS)
    return chains, jumps


def load_foreign(netns: str) -> None:
    for backend in BACKENDS:
        run(netns, [f"{backend}-restore", "--noflush"], FOREIGN_IPTABLES)
    run(netns, ["nft", "-f", "-"], FOREIGN_NFT)


def cleanup(netns: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "ebpflb", "cleanup", "--kube-proxy"]
    return subprocess.run(
        ["nsenter", f"--net=/run/netns/{netns}", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_removes_kube_proxy_and_keeps_the_rest(node: str) -> None:
    load_foreign(node)
    foreign = {b: rules(node, b) for b in BACKENDS}
    foreign_nft = run(node, ["nft", "list", "table", "ip", "foreign"])
    load_kube_proxy(node)
    for backend in BACKENDS:  # loaded, so the checks below can fail
        assert len(kube_lines(rules(node, backend))) > 40
    assert "table ip kube-proxy" in run(node, ["nft", "list", "tables"])

    done = cleanup(node)
    assert done.returncode == 0, done.stderr
    chains, jumps = expected_counts()
    for backend in BACKENDS:
        assert f"{backend}: {chains} chains, {jumps} jump rules" in done.stdout
    assert "nftables table ip kube-proxy" in done.stdout

    for backend in BACKENDS:
        after = rules(node, backend)
        assert kube_lines(after) == [], backend
        # Exactly the foreign rules, plus kubelet's chain and jumps (kept as kube-proxy
        # keeps them), plus the canary's empty tables.
        kept = [ln for ln in after if not any(c in ln for c in KUBELET_CHAINS)]
        assert [ln for ln in kept if ln.startswith(("-A", ":FOREIGN"))] == [
            ln for ln in foreign[backend] if ln.startswith(("-A", ":FOREIGN"))
        ], backend
        assert any(ln.startswith(":KUBE-FIREWALL") for ln in after)
    tables = run(node, ["nft", "list", "tables"])
    assert "kube-proxy" not in tables
    assert run(node, ["nft", "list", "table", "ip", "foreign"]) == foreign_nft
    assert "eth0" in run(node, ["ip", "-o", "link", "show"])

    again = cleanup(node)  # nothing left: a second run changes nothing and says so
    assert again.returncode == 0, again.stderr
    assert "removed kube-proxy's nothing" in again.stdout


def test_an_interface_named_kube_ipvs0_that_is_not_a_dummy_stays(node: str) -> None:
    sh("ip", "-n", node, "link", "add", "kube-ipvs0", "type", "veth", "peer", "name", "peer0")
    done = cleanup(node)
    assert done.returncode == 0, done.stderr
    assert "kube-ipvs0" in run(node, ["ip", "-o", "link", "show"])
    assert "interface kube-ipvs0" not in done.stdout
