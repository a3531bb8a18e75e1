"""Programming each mode into the bench's node namespace, as that proxy would.

- iptables-legacy / iptables-nft: kube-proxy's iptables proxier's rules
  (lab.bench.kubeproxy.iptables), loaded with kube-proxy's `iptables-restore --noflush`
  through each backend of the iptables tool (ip6tables-restore for IPv6); then its
  partial syncs, one per change;
- nftables: kube-proxy's nftables ruleset (kubeproxy.nftables; table ip6 kube-proxy for
  IPv6), loaded with `nft -f`;
- ebpflb: the real agent on the Kubernetes source (lab.bench.agentrun) in the node
  namespace, its socket programs on the `lb` cgroup, its per-packet path on the pod's link.

The loaders run in a fresh memory cgroup, so its kernel-memory counter is what the rules
cost; the full load and each change are timed (lab.bench.measure.cost).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from ebpflb.errors import EbpflbError
from lab.bench.agentrun import RunningAgent, running_agent
from lab.bench.kubeproxy import iptables, nftables
from lab.bench.measure.cost import KernelMemoryCgroup, Timed, memory_cgroup, run_timed
from lab.bench.records.compare import ControlPlane, KernelMemory, RulesLoad
from lab.bench.scenario import AGENT_NODE, BenchService, Family
from lab.bench.settings import IPTABLES_MODES, CompareSettings, Mode
from lab.bench.topology import NODE_INTERFACES, POD_LINK, BenchTopology

R = TypeVar("R")
AGENT_CPU = 1  # away from the data-plane client, so its housekeeping never lands inside


def change_picks(n: int, count: int) -> list[int]:
    """Services whose endpoints change: spread out, never the first or the last (the
    data plane's targets)."""
    if n < 3:
        return [0] * count
    return [1 + (k * 7919 + n // 2) % (n - 2) for k in range(count)]


def program_iptables(
    topo: BenchTopology, mode: Mode, services: list[BenchService], settings: CompareSettings
) -> ControlPlane:
    if mode not in IPTABLES_MODES:
        raise EbpflbError(f"not an iptables mode: {mode}")
    # iptables-legacy, iptables-nft: also the binaries' names (ip6tables-* for IPv6)
    binary, family = iptables.tool(mode.value, settings.family), settings.family
    if shutil.which(f"{binary}-restore") is None:
        raise EbpflbError(f"{binary}-restore not found (Debian package iptables)")
    restore = [f"{binary}-restore", *iptables.RESTORE_FLAGS]
    with memory_cgroup(f"{topo.prefix}-{mode}-mem") as memory:
        enter = memory.enter if memory else None
        # What kube-proxy does before its first sync (counters, chains, jumps), untimed.
        for argv in [*iptables.nfacct_argv(), *iptables.setup_argv(binary)]:
            run_timed(argv, topo.node, preexec_fn=enter)
        full_text = iptables.full_sync(services, family=family)
        full = run_timed(restore, topo.node, stdin=full_text, preexec_fn=enter)
        kernel = memory.kernel_bytes() if memory else None
    ready = settings.endpoints - 1
    changes = [
        run_timed(
            restore, topo.node, stdin=iptables.partial_sync(services, index, ready, family=family)
        )
        for index in change_picks(len(services), settings.changes)
    ]
    rules = sum(1 for line in full_text.splitlines() if line.startswith("-A "))
    load = RulesLoad(" ".join(restore), len(full_text), rules)
    return _control_plane(full, changes, kernel, load)


def program_nftables(
    topo: BenchTopology, services: list[BenchService], settings: CompareSettings
) -> ControlPlane:
    if shutil.which("nft") is None:
        raise EbpflbError("nft not found (Debian package nftables)")
    nft = ["nft", "-f", "-"]
    with memory_cgroup(f"{topo.prefix}-nftables-mem") as memory:
        full_text = nftables.full_sync(
            services, family=settings.family, node_ip=topo.addresses.node
        )
        full = run_timed(
            nft, topo.node, stdin=full_text, preexec_fn=memory.enter if memory else None
        )
        kernel = memory.kernel_bytes() if memory else None
    ready = settings.endpoints - 1
    changes = [
        run_timed(
            nft,
            topo.node,
            stdin=nftables.partial_sync(services, index, ready, family=settings.family),
        )
        for index in change_picks(len(services), settings.changes)
    ]
    return _control_plane(full, changes, kernel, RulesLoad(" ".join(nft), len(full_text)))


def _control_plane(
    full: Timed, changes: list[Timed], kernel: int | None, rules: RulesLoad
) -> ControlPlane:
    """A kube-proxy mode's figures: its full load, its partial syncs, its kernel memory."""
    return ControlPlane(
        program_s=full.seconds,
        program_cpu_s=full.cpu_seconds,
        change_s=tuple(c.seconds for c in changes),
        change_cpu_s=tuple(c.cpu_seconds for c in changes),
        memory=KernelMemory(cgroup_bytes=kernel),
        rules=rules,
    )


def program_kube_proxy(
    topo: BenchTopology, mode: Mode, services: list[BenchService], settings: CompareSettings
) -> ControlPlane:
    if mode is Mode.NFTABLES:
        return program_nftables(topo, services, settings)
    return program_iptables(topo, mode, services, settings)


@contextlib.contextmanager
def ebpflb_agent(
    topo: BenchTopology,
    services: Sequence[BenchService],
    *,
    memory: KernelMemoryCgroup | None,
    xdp: bool,
) -> Iterator[RunningAgent]:
    """The real agent in the node namespace, NodePort on the node's interfaces (in native
    XDP if `xdp`), its kernel memory charged to `memory`."""

    def enter() -> None:
        if memory is not None:
            memory.enter()
        if (os.cpu_count() or 1) > AGENT_CPU:
            os.sched_setaffinity(0, {AGENT_CPU})

    extra = [
        f"--node-name={AGENT_NODE}",
        f"--interfaces={','.join(NODE_INTERFACES)}",
        f"--pod-interfaces={POD_LINK}",  # the per-packet path for the pod's client
        f"--xdp={'native' if xdp else 'off'}",
    ]
    with running_agent(
        services, extra_args=extra, netns=topo.node, cgroup=topo.lb_cgroup.path, preexec_fn=enter
    ) as agent:
        if xdp:
            ingress = NODE_INTERFACES[0]  # the external side, where NodePort packets arrive
            modes = agent.endpoints.status().xdp
            if modes.get(ingress) != "native":
                raise EbpflbError(
                    f"the agent did not put NodePort ingress on {ingress} in native XDP"
                    f" (its /status: {dict(modes)})"
                )
        yield agent


def each_mode(
    bench: str,
    modes: Sequence[Mode],
    family: Family,
    measure: Callable[[Mode], R],
    progress: Callable[[str], None],
) -> tuple[tuple[R, ...], float]:
    """`measure` for each mode in turn (as root: it builds namespaces and loads programs),
    each named on `progress`; the results and the seconds they took."""
    if os.geteuid() != 0:
        raise EbpflbError("ebpflb bench creates namespaces and loads BPF programs: run as root")
    started = time.perf_counter()
    results = []
    for mode in modes:
        progress(f"bench {bench}: {family}, {mode}")
        results.append(measure(mode))
    return tuple(results), time.perf_counter() - started
