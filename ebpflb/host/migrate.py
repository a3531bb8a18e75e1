"""`ebpflb cleanup --kube-proxy`: remove what kube-proxy leaves on a node, as
`kube-proxy --cleanup` does, so that nothing of it keeps translating after ebpflb took over.

What kube-proxy's own CleanupLeftovers functions remove (kubernetes pkg/proxy/iptables,
nftables and ipvs, v1.31-v1.33), in this network namespace:

- iptables, for IPv4 and IPv6 and for both backends of the iptables tool (legacy and
  nf_tables: a node may have rules in either, depending on which one kube-proxy chose):
  its chains (nat: KUBE-SERVICES, KUBE-NODEPORTS, KUBE-POSTROUTING, KUBE-MARK-MASQ,
  KUBE-PROXY-CANARY and every per-service chain KUBE-SVC-/SVL-/EXT-/FW-/SEP-/XLB-*;
  filter: KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, KUBE-FORWARD, KUBE-NODEPORTS,
  KUBE-PROXY-FIREWALL, KUBE-PROXY-CANARY; mangle: KUBE-PROXY-CANARY), after removing the
  rules that jump to them. kube-proxy deletes only its own jump rules; a chain cannot be
  deleted while anything jumps to it, so here every rule jumping to one of these chains
  goes. Kubelet's chains (KUBE-FIREWALL, KUBE-MARK-DROP, KUBE-KUBELET-CANARY) stay, as
  with kube-proxy: kubelet keeps running and owns them.
- nftables: its tables `ip kube-proxy` and `ip6 kube-proxy`.
- IPVS mode: its dummy interface kube-ipvs0 (the virtual servers and ipsets of IPVS mode
  are not handled: this kernel has no IPVS to test them on).

Everything else (other chains, other rules in the built-in chains, other nftables tables)
is left as it was. Each step that fails is reported and the others still run.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field

NAT_CHAINS = frozenset(
    {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-PROXY-CANARY"}
)
FILTER_CHAINS = frozenset(
    {
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FORWARD",
        "KUBE-NODEPORTS",
        "KUBE-PROXY-FIREWALL",
        "KUBE-PROXY-CANARY",
    }
)
MANGLE_CHAINS = frozenset({"KUBE-PROXY-CANARY"})
# isServiceChainName in pkg/proxy/iptables/proxier.go (KUBE-XLB- from releases before 1.24).
SERVICE_CHAIN_PREFIXES = (
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SEP-",
    "KUBE-XLB-",
)
NFT_TABLES = ("ip kube-proxy", "ip6 kube-proxy")
IPVS_INTERFACE = "kube-ipvs0"
# (save, restore) of each backend and family.
IPTABLES_TOOLS = (
    ("iptables-legacy-save", "iptables-legacy-restore"),
    ("ip6tables-legacy-save", "ip6tables-legacy-restore"),
    ("iptables-nft-save", "iptables-nft-restore"),
    ("ip6tables-nft-save", "ip6tables-nft-restore"),
)
TIMEOUT = 60.0

_CHAIN_LINE = re.compile(r"^:(\S+) ")
_JUMP = re.compile(r"\s-[jg] (\S+)")


def kube_proxy_chains(table: str, chains: Iterable[str]) -> set[str]:
    """Which of a table's chains kube-proxy created (and its cleanup deletes)."""
    fixed = {"nat": NAT_CHAINS, "filter": FILTER_CHAINS, "mangle": MANGLE_CHAINS}.get(
        table, frozenset()
    )
    found = set()
    for chain in chains:
        if chain in fixed or (table == "nat" and chain.startswith(SERVICE_CHAIN_PREFIXES)):
            found.add(chain)
    return found


@dataclass(frozen=True, slots=True)
class TablePlan:
    """What to remove from one table: rules (as saved, `-A ...`) and chains."""

    table: str
    rules: tuple[str, ...]
    chains: tuple[str, ...]

    def restore_input(self) -> str:
        """iptables-restore --noflush input: delete the jumps, flush, then delete chains."""
        lines = [f"*{self.table}"]
        lines += ["-D" + rule[2:] for rule in self.rules]
        lines += [f":{chain} - [0:0]" for chain in self.chains]  # declaring flushes it
        lines += [f"-X {chain}" for chain in self.chains]
        lines.append("COMMIT")
        return "\n".join(lines) + "\n"


def plan(saved: str) -> list[TablePlan]:
    """From iptables-save output: per table, the rules outside kube-proxy's chains that jump
    into them, and kube-proxy's chains. Tables with nothing of kube-proxy's are left out."""
    plans = []
    table: str | None = None
    chains: list[str] = []
    rules: list[str] = []

    def close() -> None:
        if table is None:
            return
        ours = kube_proxy_chains(table, chains)
        if not ours:
            return
        jumps = []
        for rule in rules:
            owner = rule.split()[1]
            target = _JUMP.search(rule)
            if owner not in ours and target is not None and target.group(1) in ours:
                jumps.append(rule)
        plans.append(TablePlan(table, tuple(jumps), tuple(sorted(ours))))

    for line in saved.splitlines():
        if line.startswith("*"):
            table, chains, rules = line[1:].strip(), [], []
        elif (match := _CHAIN_LINE.match(line)) is not None:
            chains.append(match.group(1))
        elif line.startswith("-A "):
            rules.append(line)
        elif line.strip() == "COMMIT":
            close()
            table = None
    return plans


@dataclass
class Report:
    """What the cleanup removed, and what failed."""

    chains: dict[str, int] = field(default_factory=dict)  # "iptables-legacy-save" -> count
    rules: dict[str, int] = field(default_factory=dict)
    nft_tables: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [
            f"{tool.removesuffix('-save')}: {count} chains, {self.rules[tool]} jump rules"
            for tool, count in self.chains.items()
        ]
        parts += [f"nftables table {t}" for t in self.nft_tables]
        parts += [f"interface {name}" for name in self.interfaces]
        text = "removed kube-proxy's " + ("; ".join(parts) if parts else "nothing (none found)")
        if self.errors:
            text += "\nfailed:\n  " + "\n  ".join(self.errors)
        return text


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def cleanup_iptables(report: Report) -> None:
    for save, restore in IPTABLES_TOOLS:
        if shutil.which(save) is None or shutil.which(restore) is None:
            continue
        saved = _run([save])
        if saved.returncode != 0:
            hint = ""
            if "Permission denied" in saved.stderr:  # legacy talks through a raw socket
                hint = " (iptables needs CAP_NET_ADMIN, and CAP_NET_RAW for its legacy backend)"
            report.errors.append(f"{save}: {saved.stderr.strip()}{hint}")
            continue
        for table in plan(saved.stdout):
            done = _run([restore, "--noflush"], table.restore_input())
            if done.returncode != 0:
                report.errors.append(
                    f"{shlex.join([restore, '--noflush'])} ({table.table}): {done.stderr.strip()}"
                )
                continue
            report.chains[save] = report.chains.get(save, 0) + len(table.chains)
            report.rules[save] = report.rules.get(save, 0) + len(table.rules)


def cleanup_nftables(report: Report) -> None:
    if shutil.which("nft") is None:
        return
    listed = _run(["nft", "list", "tables"])
    if listed.returncode != 0:
        report.errors.append(f"nft list tables: {listed.stderr.strip()}")
        return
    present = {line.removeprefix("table ").strip() for line in listed.stdout.splitlines()}
    for table in NFT_TABLES:
        if table not in present:
            continue
        done = _run(["nft", "delete", "table", *table.split()])
        if done.returncode != 0:
            report.errors.append(f"nft delete table {table}: {done.stderr.strip()}")
        else:
            report.nft_tables.append(table)


def cleanup_ipvs_interface(report: Report) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        indexes = ipr.link_lookup(ifname=IPVS_INTERFACE)
        for index in indexes:
            (link,) = ipr.get_links(index)
            info = link.get_attr("IFLA_LINKINFO")
            kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
            if kind != "dummy":  # not kube-proxy's: leave it
                continue
            try:
                ipr.link("del", index=index)
            except Exception as exc:  # pyroute2's NetlinkError
                report.errors.append(f"deleting interface {IPVS_INTERFACE}: {exc}")
            else:
                report.interfaces.append(IPVS_INTERFACE)


def cleanup_kube_proxy() -> Report:
    """Remove kube-proxy's rules, tables and interface from this network namespace."""
    report = Report()
    cleanup_iptables(report)
    cleanup_nftables(report)
    cleanup_ipvs_interface(report)
    return report
