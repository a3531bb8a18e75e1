"""`bench compare`'s targets, tables and plot on synthetic typed runs (no kernel); the
run builders here serve the other bench unit tests too."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lab.bench import targets
from lab.bench.records.agent import AgentStartup
from lab.bench.records.compare import (
    CompareRun,
    ConnectLatency,
    ControlPlane,
    DataPlane,
    KernelMemory,
    LatencySummary,
    Machine,
    ModeResult,
    Rate,
    SizeResult,
)
from lab.bench.settings import CompareSettings, Mode

MACHINE = Machine("6.x", "test", 2, 1.0, "iptables", "nft", "2026-01-01")


def data(p50: float, cps: float, nodeport: float) -> DataPlane:
    summary = LatencySummary(samples=10, errors=0, p50_us=p50, p99_us=p50 * 2, mean_us=p50)
    return DataPlane(
        latency=ConnectLatency(summary, summary, summary),
        connections=Rate(cps, (cps,), 0),
        nodeport=Rate(nodeport, (nodeport * 0.99, nodeport * 1.01), 0),
    )


def size(n: int = 20_000) -> SizeResult:
    startup = AgentStartup(
        start_to_synced_s=4.0, cpu_s_at_synced=3.0, frontends=n + 3, sync_errors=0
    )
    return SizeResult(
        n,
        (
            ModeResult(
                Mode.IPTABLES_LEGACY,
                data(40.0, 15_000, 10_000),
                ControlPlane(2.0, 1.0, (0.2,), (0.1,), KernelMemory(cgroup_bytes=2**20)),
            ),
            ModeResult(
                Mode.NFTABLES,
                data(26.0, 21_000, 8_000),
                ControlPlane(9.0, 9.0, (0.4,), (0.2,), KernelMemory(cgroup_bytes=150 * 2**20)),
            ),
            ModeResult(Mode.NONE, data(20.0, 25_000, 12_500)),
            ModeResult(
                Mode.EBPFLB,
                data(20.5, 24_900, 12_000),
                ControlPlane(
                    4.0,
                    3.0,
                    (0.002, 0.003),
                    (0.001,),
                    KernelMemory(cgroup_bytes=2**27, bpf_map_bytes=2**27),
                    agent=startup,
                ),
            ),
            ModeResult(
                Mode.EBPFLB_XDP,
                DataPlane(nodeport=Rate(13_000, (12_900, 13_100), 0)),
                ControlPlane(4.5, agent=startup),
            ),
        ),
    )


def run(*sizes: SizeResult) -> CompareRun:
    sizes = sizes or (size(),)
    return CompareRun(MACHINE, CompareSettings(), tuple(sizes), 1.0, (), targets.judge(sizes))


def replace_mode(result: SizeResult, mode: Mode, **changes: object) -> SizeResult:
    """`result` with `mode`'s record changed (dataclasses.replace on it)."""
    return dataclasses.replace(
        result,
        modes=tuple(
            dataclasses.replace(m, **changes) if m.mode is mode else m for m in result.modes
        ),
    )


def verdicts(*sizes: SizeResult) -> dict[str, bool]:
    return {v.target: v.ok for v in targets.judge(sizes)}


def test_all_targets_met_on_a_good_run() -> None:
    found = verdicts(size())
    assert found and all(found.values()), found
    assert set(found) == {
        "connect p50 (first) within 3% of no proxy",
        "connect p50 (last) within 3% of no proxy",
        "connect p50 (random) within 3% of no proxy",
        "new connections/s within 3% of no proxy",
        "one endpoint change < 5 ms",
        "all services programmed from nothing < 5 s",
        "kernel memory at most nftables'",
        "NodePort via tc at least as fast as iptables-legacy",
        "NodePort via tc at least as fast as nftables",
        "NodePort via XDP measurably faster than tc",
        "NodePort via tc within 5% of plain forwarding",
        "NodePort via XDP within 1% of plain forwarding",
    }


def _ebpflb(s: SizeResult) -> ModeResult:
    found = s.get(Mode.EBPFLB)
    assert found is not None and found.control is not None
    return found


def _slower_last(s: SizeResult) -> SizeResult:
    e = _ebpflb(s)
    assert e.data.latency is not None
    slow = dataclasses.replace(e.data.latency.last, p50_us=21.5)
    latency = dataclasses.replace(e.data.latency, last=slow)
    return replace_mode(s, Mode.EBPFLB, data=dataclasses.replace(e.data, latency=latency))


def _fewer_connections(s: SizeResult) -> SizeResult:
    e = _ebpflb(s)
    rate = Rate(23_000, (23_000,), 0)
    return replace_mode(s, Mode.EBPFLB, data=dataclasses.replace(e.data, connections=rate))


def _control(s: SizeResult, **changes: object) -> SizeResult:
    e = _ebpflb(s)
    assert e.control is not None
    control = dataclasses.replace(e.control, **changes)
    return replace_mode(s, Mode.EBPFLB, control=control)


def _slow_nodeport(s: SizeResult) -> SizeResult:
    e = _ebpflb(s)
    slow = Rate(11_000, (11_000,), 0)
    return replace_mode(s, Mode.EBPFLB, data=dataclasses.replace(e.data, nodeport=slow))


def _fast_iptables_nodeport(s: SizeResult) -> SizeResult:
    legacy = s.get(Mode.IPTABLES_LEGACY)
    assert legacy is not None
    fast = Rate(12_100, (12_100,), 0)
    data = dataclasses.replace(legacy.data, nodeport=fast)
    return replace_mode(s, Mode.IPTABLES_LEGACY, data=data)


def _slow_xdp(s: SizeResult) -> SizeResult:
    return replace_mode(
        s, Mode.EBPFLB_XDP, data=DataPlane(nodeport=Rate(12_300, (12_250, 12_350), 0))
    )


def _more_kernel_memory(s: SizeResult) -> SizeResult:
    return _control(s, memory=KernelMemory(cgroup_bytes=151 * 2**20))


def _xdp_overlapping_tc(s: SizeResult) -> SizeResult:
    return replace_mode(
        s, Mode.EBPFLB_XDP, data=DataPlane(nodeport=Rate(12_400, (11_900, 12_600), 0))
    )


@pytest.mark.parametrize(
    ("change", "target"),
    [
        (_slower_last, "connect p50 (last) within 3% of no proxy"),
        (_fewer_connections, "new connections/s within 3% of no proxy"),
        (lambda s: _control(s, change_s=(0.002, 0.006)), "one endpoint change < 5 ms"),
        (lambda s: _control(s, program_s=5.5), "all services programmed from nothing < 5 s"),
        (_fast_iptables_nodeport, "NodePort via tc at least as fast as iptables-legacy"),
        (_slow_nodeport, "NodePort via tc within 5% of plain forwarding"),
        (_slow_xdp, "NodePort via XDP within 1% of plain forwarding"),
        (_xdp_overlapping_tc, "NodePort via XDP measurably faster than tc"),
        (_more_kernel_memory, "kernel memory at most nftables'"),
    ],
)
def test_each_target_can_be_missed(change: object, target: str) -> None:
    assert callable(change)
    found = verdicts(change(size()))
    assert found[target] is False
    assert sum(not ok for ok in found.values()) == 1, found


def test_verdicts_carry_the_figures() -> None:
    by_name = {v.target: v for v in targets.judge([size()])}
    assert by_name["connect p50 (last) within 3% of no proxy"].detail == (
        "20.5 vs 20.0 µs (x1.025)"
    )
    assert by_name["one endpoint change < 5 ms"].detail == "worst 3.00 ms of 2"
    assert by_name["NodePort via XDP measurably faster than tc"].detail == (
        "13,000 vs 12,000 req/s"
    )


def test_programming_verdict_says_where_the_time_went() -> None:
    """A start's compiles, attach and first sync beside its time (the agent's phases)."""
    e = _ebpflb(size())
    assert e.control is not None and e.control.agent is not None
    agent = dataclasses.replace(
        e.control.agent,
        first_sync_s=1.7,
        phases={"attached": 6.6},
        compile_s={"socket_lb": 1.9, "nodeport": 2.0},
        program_origin={"socket_lb": "loaded", "nodeport": "compiled"},
    )
    slow = _control(size(), program_s=8.3, agent=agent)
    (verdict,) = [v for v in targets.judge([slow]) if "programmed" in v.target]
    assert verdict.ok is False
    assert verdict.detail == (
        "8.30 s; socket_lb loaded 1.90 s, nodeport compiled 2.00 s; attached at 6.60 s;"
        " first sync 1.70 s"
    )


def test_targets_only_where_the_figures_exist() -> None:
    names = verdicts(size(1000))
    assert "one endpoint change < 5 ms" not in names  # only judged at 20,000
    assert "all services programmed from nothing < 5 s" not in names
    without_none = dataclasses.replace(
        size(1000), modes=tuple(m for m in size(1000).modes if m.mode is not Mode.NONE)
    )
    assert not any("no proxy" in t for t in verdicts(without_none))
    assert verdicts(dataclasses.replace(size(), modes=())) == {}


def test_render_and_plot(tmp_path: Path) -> None:
    from lab.bench import plot, render

    text = render.render(run(size(), size(100)))
    for word in ("Data plane", "Control plane", "Targets", "iptables-legacy", "20,000", "met"):
        assert word in text
    assert text.index("│    100 │ none") < text.index("│ 20,000 │ none")  # by N
    assert "128.0" in text  # ebpflb's kernel and BPF map memory, in MiB
    out = tmp_path / "bench.png"
    plot.plot(run(), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unlisted_modes_are_judged_but_not_shown() -> None:
    from lab.bench import render

    hidden = replace_mode(size(), Mode.NONE, listed=False)
    assert "connect p50 (last) within 3% of no proxy" in verdicts(hidden)
    rows = render.data_plane_rows(run(hidden))
    assert [row[1] for row in rows] == ["iptables-legacy", "nftables", "ebpflb", "ebpflb-xdp"]


def test_bulk_report_plots_from_a_saved_report(tmp_path: Path) -> None:
    """`ebpflb bench bulk --from-report docs/bench/bulk.json --plot FILE` draws it again."""
    from lab.bench.command import build_parser, run

    out = tmp_path / "bulk.png"
    report = Path(__file__).resolve().parents[4] / "docs/bench/bulk.json"
    args = build_parser().parse_args(["bulk", "--from-report", str(report), "--plot", str(out)])
    assert run(args) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_pods_clusterip_figures_get_their_table_and_survive_the_codec() -> None:
    """ClusterIP from the pod: ebpflb's row named for its per-packet path; a report from
    before the figures existed still reads, without the table's rows."""
    from lab.bench import render
    from lab.bench.records import codec

    summary = LatencySummary(samples=10, errors=0, p50_us=40.0, p99_us=80.0, mean_us=41.0)
    pod = {"pod_latency": ConnectLatency(summary, summary, summary)}
    with_pod = size()
    for mode in (Mode.NONE, Mode.NFTABLES, Mode.EBPFLB):
        result = with_pod.get(mode)
        assert result is not None
        rate = {"pod_connections": Rate(9_000.0, (9_000.0,), 0)}
        with_pod = replace_mode(
            with_pod, mode, data=dataclasses.replace(result.data, **pod, **rate)
        )
    rows = render.pod_rows(run(with_pod))
    assert [row[1] for row in rows] == ["none", "nftables", "ebpflb (per packet)"]
    assert rows[-1][2:] == ["40.0", "40.0", "40.0", "80.0", render._fmt(9_000.0, "/s")]
    judged = {v.target: v.ok for v in targets.judge([with_pod])}
    # ebpflb's 40.0 µs against nftables' 40.0: met; iptables-legacy has no pod figure here.
    assert judged["per-packet ClusterIP from a pod: connect p50 (random) at most nftables"]
    assert not any(n.startswith("per-packet") and "iptables-legacy" in n for n in judged)
    again = codec.from_json(json.loads(codec.to_json(run(with_pod))))
    assert again == run(with_pod)
    old = json.loads(codec.to_json(run(size())))
    for mode in old["sizes"][0]["modes"]:
        mode["data"].pop("pod_latency", None), mode["data"].pop("pod_connections", None)
    assert render.pod_rows(codec.from_json(old)) == []  # type: ignore[arg-type]


def test_program_costs_get_their_table_and_survive_the_codec() -> None:
    """ebpflb's per-packet program costs: a row per path, the instructions beside them; a
    report from before them reads and renders without the table."""
    from lab.bench import render
    from lab.bench.records import codec
    from lab.bench.records.compare import ProgramCost

    cost = ProgramCost("ebpflb_np_in", "not a NodePort", "OK", 10_201, 60, 55, 31, 7_140, 40_000)
    new = dataclasses.replace(cost, path="new flow (SYN)", verdict="REDIRECT", median_ns=900)
    e = _ebpflb(size())
    with_costs = replace_mode(
        size(), Mode.EBPFLB, data=dataclasses.replace(e.data, program_costs=(new, cost))
    )
    rows = render.program_cost_rows(run(with_costs))
    assert rows == [
        ["20,000", "ebpflb", "ebpflb_np_in", "new flow (SYN)", "REDIRECT", "900", "55", "31",
         "7,140"],
        ["20,000", "ebpflb", "ebpflb_np_in", "not a NodePort", "OK", "60", "55", "31", "7,140"],
    ]  # fmt: skip
    assert "NodePort per packet (BPF_PROG_TEST_RUN)" in render.render(run(with_costs))
    assert codec.from_json(json.loads(codec.to_json(run(with_costs)))) == run(with_costs)
    old = json.loads(codec.to_json(run(size())))
    for mode in old["sizes"][0]["modes"]:
        mode["data"].pop("program_costs", None)
    text = render.render(codec.from_json(old))
    assert "Data plane" in text and "BPF_PROG_TEST_RUN" not in text


def test_request_response_gets_its_table() -> None:
    from lab.bench import render
    from lab.bench.records import codec
    from lab.bench.records.compare import Exchange, RequestResponse

    rr = (
        RequestResponse(Exchange.RR, 1, Rate(40_000.0, (40_000.0,), 0)),
        RequestResponse(Exchange.CRR, 32, Rate(9_000.0, (9_000.0,), 0)),
    )
    e = _ebpflb(size())
    with_rr = replace_mode(
        size(), Mode.EBPFLB, data=dataclasses.replace(e.data, request_response=rr)
    )
    rows = render.request_response_rows(run(with_rr))
    assert rows == [["20,000", "ebpflb", "40,000", "-", "-", "9,000"]]
    assert render.RR_HEADERS[2:] == ["RR x1 /s", "RR x32 /s", "CRR x1 /s", "CRR x32 /s"]
    assert codec.from_json(json.loads(codec.to_json(run(with_rr)))) == run(with_rr)


def test_program_time_per_exchange_beside_the_gap_to_plain_forwarding() -> None:
    from lab.bench import progcost, render
    from lab.bench.records.compare import ProgramTime

    before = {"ebpflb_np_in": (1_000, 10), "ebpflb_np_out": (0, 0)}
    after = {"ebpflb_np_in": (9_001_000, 40_010), "ebpflb_np_out": (0, 0)}
    (t,) = progcost.per_exchange(before, after, 5_000)  # np_out never ran: left out
    assert t == ProgramTime("ebpflb_np_in", 1_800.0, 8.0)
    assert progcost.per_exchange(before, after, 0) == ()
    e = _ebpflb(size())  # ebpflb 12,000/s, none 12,500/s: 3,333 ns more per exchange
    timed = replace_mode(
        size(), Mode.EBPFLB, data=dataclasses.replace(e.data, nodeport_program_time=(t,))
    )
    assert render.program_time_rows(run(timed)) == [
        ["20,000", "ebpflb", "ebpflb_np_in", "1,800", "8.0", ""],
        ["20,000", "ebpflb", "all", "1,800", "", "3,333"],
    ]
