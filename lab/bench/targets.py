"""`ebpflb bench compare`'s targets: each a rule judged on one N's results, giving a
verdict (met or missed, with the figures) wherever the run measured what it needs.

A target is a small value in TARGETS: a ratio of ebpflb's figure to another mode's in
the same run (Ratio), a ceiling on ebpflb's own figure at given N (Ceiling), or a rule of
its own (XdpBeatsTc). Adding one is adding an entry (with the accessor of the figure it
judges); verdicts keep TARGETS' order within each N. A NodePort target whose ebpflb figure
the run recorded as not measured (DataPlane.nodeport_not_measured) gets a "not measured"
verdict with that reason, so the table says why it is not judged.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from lab.bench.records.compare import ModeResult, SizeResult, Target, Verdict
from lab.bench.settings import KUBE_PROXY_MODES, Mode

Figure = Callable[[ModeResult], float | None]


class Rule(Protocol):
    def judge(self, size: SizeResult) -> Iterator[Verdict]: ...


def connect_p50(target: Target) -> Figure:
    def figure(result: ModeResult) -> float | None:
        latency = result.data.latency
        return latency.of(target).p50_us if latency else None

    return figure


def pod_connect_p50(target: Target) -> Figure:
    """connect() p50 from the pod behind the node (ebpflb: its per-packet path)."""

    def figure(result: ModeResult) -> float | None:
        latency = result.data.pod_latency
        return latency.of(target).p50_us if latency else None

    return figure


def connections_per_s(result: ModeResult) -> float | None:
    return result.data.connections.per_s if result.data.connections else None


def nodeport_per_s(result: ModeResult) -> float | None:
    return result.data.nodeport.per_s if result.data.nodeport else None


def nodeport_not_measured(result: ModeResult) -> str | None:
    return result.data.nodeport_not_measured


def worst_change_s(result: ModeResult) -> float | None:
    changes = result.control.change_s if result.control else ()
    return max(changes) if changes else None


def changes(result: ModeResult) -> int:
    return len(result.control.change_s) if result.control else 0


def program_s(result: ModeResult) -> float | None:
    return result.control.program_s if result.control else None


def programmed(seconds: float, result: ModeResult) -> str:
    """The time to every service in the maps, and where it went: each program set's compile
    or load (and which: a cold compile, stored bytecode, adopted pins), the attach, the
    first sync (the agent's /status phases)."""
    agent = result.control.agent if result.control else None
    parts = [f"{seconds:.2f} s"]
    if agent is not None:
        sets = [
            " ".join(filter(None, (name, agent.program_origin.get(name), f"{s:.2f} s")))
            for name, s in agent.compile_s.items()
        ]
        if sets:
            parts.append(", ".join(sets))
        if (attached := agent.phases.get("attached")) is not None:
            parts.append(f"attached at {attached:.2f} s")
        if agent.first_sync_s is not None:
            parts.append(f"first sync {agent.first_sync_s:.2f} s")
    return "; ".join(parts)


def kernel_bytes(result: ModeResult) -> float | None:
    """Kernel memory charged to the loader's (or agent's) memory cgroup."""
    memory = result.control.memory if result.control else None
    return memory.cgroup_bytes if memory and memory.cgroup_bytes is not None else None


@dataclass(frozen=True)
class Ratio:
    """ebpflb's figure over `reference`'s: at most `limit` (a cost such as latency) or at
    least `limit` (a rate). Judged wherever both figures exist and are not zero."""

    name: str
    figure: Figure
    limit: float
    at_least: bool  # the ratio must reach the limit (rates), not stay under it (costs)
    render: Callable[[float, float], str]  # (ebpflb's figure, the reference's) -> text
    reference: Mode = Mode.NONE
    mode: Mode = Mode.EBPFLB
    at: frozenset[int] | None = None  # judged only at these N (None: at every N)

    def judge(self, size: SizeResult) -> Iterator[Verdict]:
        if self.at is not None and size.services not in self.at:
            return
        mine_result, theirs_result = size.get(self.mode), size.get(self.reference)
        if mine_result is None or theirs_result is None:
            return
        mine, theirs = self.figure(mine_result), self.figure(theirs_result)
        if not mine or not theirs:
            return
        ratio = mine / theirs
        ok = ratio >= self.limit if self.at_least else ratio <= self.limit
        detail = f"{self.render(mine, theirs)} (x{ratio:.3f})"
        yield Verdict(self.name, size.services, ok, detail)


@dataclass(frozen=True)
class Ceiling:
    """ebpflb's figure below a limit that depends on N; judged only at those N."""

    name: Callable[[float], str]  # limit -> the target's name
    figure: Figure
    limits: Mapping[int, float]  # N -> limit
    render: Callable[[float, ModeResult], str]
    mode: Mode = Mode.EBPFLB

    def judge(self, size: SizeResult) -> Iterator[Verdict]:
        result = size.get(self.mode)
        limit = self.limits.get(size.services)
        value = self.figure(result) if result is not None and limit is not None else None
        if result is None or limit is None or value is None:
            return
        yield Verdict(self.name(limit), size.services, value < limit, self.render(value, result))


@dataclass(frozen=True)
class AtLeastAsFast:
    """ebpflb's figure at least each of `others`' (one verdict per mode measured)."""

    figure: Figure
    others: Sequence[Mode]
    name: Callable[[Mode], str]
    unit: str
    not_measured: Callable[[ModeResult], str | None] | None = None  # why ebpflb's is missing

    def judge(self, size: SizeResult) -> Iterator[Verdict]:
        mine_result = size.get(Mode.EBPFLB)
        mine = self.figure(mine_result) if mine_result else None
        why = self.not_measured(mine_result) if mine_result and self.not_measured else None
        for mode in self.others:
            other = size.get(mode)
            theirs = self.figure(other) if other else None
            if why and mine is None and theirs:
                yield Verdict(self.name(mode), size.services, None, why)
            elif mine and theirs:
                detail = f"{mine:,.0f} vs {theirs:,.0f} {self.unit}"
                yield Verdict(self.name(mode), size.services, mine >= theirs, detail)


@dataclass(frozen=True)
class XdpBeatsTc:
    """ "Measurably" faster: every XDP NodePort run beats every tc run."""

    name: str = "NodePort via XDP measurably faster than tc"

    def judge(self, size: SizeResult) -> Iterator[Verdict]:
        tc, xdp = size.get(Mode.EBPFLB), size.get(Mode.EBPFLB_XDP)
        why = next(
            (nodeport_not_measured(r) for r in (tc, xdp) if r and nodeport_not_measured(r)), None
        )
        if why:
            yield Verdict(self.name, size.services, None, why)
            return
        tc_runs = tc.data.nodeport.runs if tc and tc.data.nodeport else ()
        xdp_runs = xdp.data.nodeport.runs if xdp and xdp.data.nodeport else ()
        if tc is None or not tc_runs or not xdp_runs:
            return
        detail = f"{statistics.median(xdp_runs):,.0f} vs {statistics.median(tc_runs):,.0f} req/s"
        yield Verdict(self.name, size.services, min(xdp_runs) > max(tc_runs), detail)


# Issue 15's targets (the first round's were 1.05 and 0.95), as ratios or limits in one run.
CONNECT_P50_MAX_RATIO = 1.03  # ebpflb / none
CONNECT_RATE_MIN_RATIO = 0.97  # ebpflb / none
KERNEL_MEMORY_MAX_RATIO = 1.0  # ebpflb / nftables
KERNEL_MEMORY_AT = frozenset({20_000})
CHANGE_MAX_S = {20_000: 0.005}
PROGRAM_MAX_S = {20_000: 5.0, 100_000: 30.0}
# Issue 28: NodePort's request rate against plain forwarding through the same node (the no
# proxy mode's external client reaches a backend's own address: routing, no translation).
NODEPORT_TC_MIN_RATIO = 0.95  # ebpflb / none
NODEPORT_XDP_MIN_RATIO = 0.99  # ebpflb-xdp / none


def _percent(ratio: float) -> str:
    return f"{abs(ratio - 1) * 100:.0f}%"


TARGETS: tuple[Rule, ...] = (
    *(
        Ratio(
            f"connect p50 ({target}) within {_percent(CONNECT_P50_MAX_RATIO)} of no proxy",
            connect_p50(target),
            CONNECT_P50_MAX_RATIO,
            at_least=False,
            render=lambda mine, floor: f"{mine:.1f} vs {floor:.1f} µs",
        )
        for target in Target
    ),
    Ratio(
        f"new connections/s within {_percent(CONNECT_RATE_MIN_RATIO)} of no proxy",
        connections_per_s,
        CONNECT_RATE_MIN_RATIO,
        at_least=True,
        render=lambda mine, floor: f"{mine:,.0f} vs {floor:,.0f}/s",
    ),
    Ratio(
        "kernel memory at most nftables'",
        kernel_bytes,
        KERNEL_MEMORY_MAX_RATIO,
        at_least=False,
        render=lambda mine, theirs: f"{mine / 2**20:.1f} vs {theirs / 2**20:.1f} MiB",
        reference=Mode.NFTABLES,
        at=KERNEL_MEMORY_AT,
    ),
    Ceiling(
        lambda limit: f"one endpoint change < {limit * 1000:g} ms",
        worst_change_s,
        CHANGE_MAX_S,
        lambda worst, result: f"worst {worst * 1000:.2f} ms of {changes(result)}",
    ),
    Ceiling(
        lambda limit: f"all services programmed from nothing < {limit:g} s",
        program_s,
        PROGRAM_MAX_S,
        programmed,
    ),
    # Issue 28: the per-packet ClusterIP path at or below nftables' connect p50 from a pod,
    # and ahead of iptables' (both through the node, as every pod's packets are).
    *(
        Ratio(
            f"per-packet ClusterIP from a pod: connect p50 (random) at most {mode}",
            pod_connect_p50(Target.RANDOM),
            1.0,
            at_least=False,
            render=lambda mine, theirs: f"{mine:.1f} vs {theirs:.1f} µs",
            reference=mode,
        )
        for mode in (Mode.NFTABLES, Mode.IPTABLES_LEGACY)
    ),
    *(
        Ratio(
            f"NodePort via {hook} within {_percent(limit)} of plain forwarding",
            nodeport_per_s,
            limit,
            at_least=True,
            render=lambda mine, floor: f"{mine:,.0f} vs {floor:,.0f} req/s",
            mode=mode,
        )
        for hook, mode, limit in (
            ("tc", Mode.EBPFLB, NODEPORT_TC_MIN_RATIO),
            ("XDP", Mode.EBPFLB_XDP, NODEPORT_XDP_MIN_RATIO),
        )
    ),
    AtLeastAsFast(
        nodeport_per_s,
        KUBE_PROXY_MODES,
        lambda mode: f"NodePort via tc at least as fast as {mode}",
        "req/s",
        nodeport_not_measured,
    ),
    XdpBeatsTc(),
)


def judge(sizes: Sequence[SizeResult], targets: Sequence[Rule] = TARGETS) -> tuple[Verdict, ...]:
    """Every target the run has the figures for; one verdict per (target, N), by N."""
    return tuple(
        verdict
        for size in sorted(sizes, key=lambda s: s.services)
        for target in targets
        for verdict in target.judge(size)
    )
