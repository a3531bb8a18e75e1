"""`ebpflb bench compare` end to end at a small N, in each family: every mode carries real
traffic through its own namespaces, from the node and from a pod behind it (a mode whose
rules or programs did not translate shows up as connect errors), and every figure the
table needs is measured, but for ebpflb's NodePort over IPv6 while its tc/XDP datapath
lacks it: then not measured, with the reason. The ebpflb phase reads the agent's readiness
and start-up figures from its /readyz and /status endpoints (lab.bench.agent)."""

from __future__ import annotations

import pytest

from lab.bench.compare import run_compare
from lab.bench.records.compare import Target
from lab.bench.render import render
from lab.bench.scenario import Family
from lab.bench.settings import MODES, CompareSettings, Mode

pytestmark = pytest.mark.kernel

N = 30


@pytest.mark.parametrize("family", list(Family))
def test_every_mode_measured_with_real_traffic(family: Family) -> None:
    settings = CompareSettings(
        family=family,
        services=(N,),
        rounds=1,
        batch=30,
        rate_seconds=0.3,
        rate_repeats=1,
        request_response_at=(N,),
        changes=1,
        quiet_timeout=5,
    )
    report = run_compare(settings, progress=lambda _line: None)
    (size,) = report.sizes
    assert size.services == N
    assert {m.mode for m in size.modes} == {*MODES, Mode.EBPFLB_XDP}
    assert report.problems == ()
    for mode in MODES:
        result = size.get(mode)
        assert result is not None and result.data.latency is not None, mode
        for target in Target:
            summary = result.data.latency.of(target)
            assert summary.samples == settings.batch, (mode, target)
            assert summary.errors == 0, (mode, result.data)
        connections = result.data.connections
        assert connections is not None and connections.per_s > 0 and connections.errors == 0
        # From the pod: an untranslated ClusterIP packet dies in the backends' namespace,
        # so no error means the mode translated every one of them on the way through the
        # node (ebpflb: per packet on the pod's link, the pod in no socket-LB cgroup).
        pod = result.data.pod_latency
        assert pod is not None, mode
        for target in Target:
            assert pod.of(target).samples == settings.batch, (mode, target)
            assert pod.of(target).errors == 0, (mode, result.data)
        exchanges = {(r.exchange.value, r.flows): r.rate for r in result.data.request_response}
        assert set(exchanges) == {("RR", 1), ("RR", 32), ("CRR", 1), ("CRR", 32)}, mode
        assert all(r.per_s > 0 and r.errors == 0 for r in exchanges.values()), (mode, exchanges)
        pod_connections = result.data.pod_connections
        assert pod_connections is not None and pod_connections.errors == 0, mode
        assert pod_connections.per_s > 0, mode
    for mode in (*MODES, Mode.EBPFLB_XDP):
        result = size.get(mode)
        assert result is not None, mode
        nodeport, why = result.data.nodeport, result.data.nodeport_not_measured
        if mode in (Mode.EBPFLB, Mode.EBPFLB_XDP) and family is Family.IPV6 and why:
            assert nodeport is None and "IPv6" in why, (mode, why)
            continue
        assert nodeport is not None and why is None, mode
        assert nodeport.per_s > 0 and nodeport.errors == 0, mode
    # ebpflb's programs per packet, timed by the kernel on the agent's own maps: each path
    # gave one verdict on every run (progcost checks), NodePort's SYN not a passer-by's.
    for mode, program, passed in (
        (Mode.EBPFLB, "ebpflb_np_in", "OK"),
        (Mode.EBPFLB_XDP, "ebpflb_np_xdp", "PASS"),
    ):
        result = size.get(mode)
        assert result is not None, mode
        costs = {c.path: c for c in result.data.program_costs}
        assert set(costs) == {"new flow (SYN)", "known flow (ACK)", "not a NodePort"}, mode
        assert {c.program for c in costs.values()} == {program}
        assert costs["not a NodePort"].verdict == passed, costs
        assert costs["new flow (SYN)"].verdict != passed, costs
        assert all(c.median_ns > 0 and c.instructions > 0 for c in costs.values()), costs
        # bpf_stats over one more NodePort run: the program ran for every exchange.
        times = {t.program: t for t in result.data.nodeport_program_time}
        assert program in times and times[program].runs_per_exchange >= 1, times
        assert times[program].ns_per_exchange > 0, times
    for mode in (Mode.IPTABLES_LEGACY, Mode.IPTABLES_NFT, Mode.NFTABLES, Mode.EBPFLB):
        result = size.get(mode)
        assert result is not None and result.control is not None, mode
        assert result.control.program_s > 0 and len(result.control.change_s) == 1, mode
        assert (result.control.memory.cgroup_bytes or 0) > 0, mode
    ebpflb = size.get(Mode.EBPFLB)
    assert ebpflb is not None and ebpflb.control is not None
    assert (ebpflb.control.memory.bpf_map_bytes or 0) > 0
    agent = ebpflb.control.agent
    assert agent is not None and agent.frontends >= N and agent.sync_errors == 0
    # The phases came from the agent's /status, in the order they happen.
    assert 0 < agent.phases["socket_lb_compiled"] <= agent.phases["first_sync"]
    assert agent.phases["first_sync"] == pytest.approx(agent.start_to_synced_s, abs=1e-3)
    assert agent.lists["Service"].objects == N
    assert report.targets  # judged, whatever the verdicts on a busy test machine
    text = render(report)
    assert "ebpflb-xdp" in text and "ebpflb (per packet)" in text
    assert "NodePort per packet (BPF_PROG_TEST_RUN)" in text
