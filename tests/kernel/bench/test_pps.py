"""`ebpflb bench pps` end to end, briefly: trafgen floods a UDP NodePort on the bench
topology for plain forwarding, nftables, ebpflb via tc and via XDP. Every mode must
deliver translated packets at saturation with the node's core the limit, give the node
core's share at a fixed rate, and (ebpflb) its programs' time per packet from bpf_stats."""

from __future__ import annotations

import pytest

from lab.bench.pps import run_pps_bench
from lab.bench.render import render
from lab.bench.settings import Mode, PpsSettings

pytestmark = pytest.mark.kernel


def test_every_mode_floods_a_nodeport_on_one_core() -> None:
    modes = (Mode.NONE, Mode.NFTABLES, Mode.EBPFLB, Mode.EBPFLB_XDP)
    settings = PpsSettings(
        modes=modes, seconds=1.0, repeats=1, rates=(50_000,), rate_seconds=1.0, quiet_timeout=5
    )
    report = run_pps_bench(settings, progress=lambda _line: None)
    assert [r.mode for r in report.results] == list(modes)
    for r in report.results:
        assert r.delivered_pps > 10_000, r
        assert r.misdelivered == 0, r
        (fixed,) = r.rates
        assert fixed.flood.delivered_pps > 0 and fixed.ns_per_packet is not None, r
    for mode, programs in ((Mode.EBPFLB, {"ebpflb_np_in"}), (Mode.EBPFLB_XDP, {"ebpflb_np_xdp"})):
        found = report.get(mode)
        assert found is not None
        assert programs <= {p.program for p in found.programs}, found.programs
        assert found.program_ns_per_packet and found.program_ns_per_packet > 0
    judged = {v.target for v in report.targets}
    assert "NodePort via tc >= 0.95x plain forwarding, packets/s on one core" in judged
    assert "NodePort via tc at least the packets/s of nftables" in judged
    assert not any(v.target.endswith("every packet translated") for v in report.targets)
    assert "ebpflb-xdp" in render(report)
