"""`ebpflb bench bulk` end to end, briefly: the forwarding floor, ebpflb via tc and via
XDP, each moving real bulk TCP through its own namespaces with GRO on (a mode that did not
carry the transfer raises), ebpflb's drop counters read from its pinned maps."""

from __future__ import annotations

import pytest

from lab.bench.bulk import run_bulk_bench
from lab.bench.render import render
from lab.bench.settings import BulkSettings, Mode

pytestmark = pytest.mark.kernel


def test_bulk_modes_measured_with_real_transfers() -> None:
    modes = (Mode.NONE, Mode.NONE_XDP, Mode.EBPFLB, Mode.EBPFLB_XDP)
    settings = BulkSettings(modes=modes, seconds=1, repeats=1, quiet_timeout=5)
    report = run_bulk_bench(settings, progress=lambda _line: None)
    assert [r.mode for r in report.results] == list(modes)
    for r in report.results:
        assert r.upload.gbit_s > 0 and r.download.gbit_s > 0, r
    for mode in (Mode.EBPFLB, Mode.EBPFLB_XDP):
        found = report.get(mode)
        assert found is not None and found.dropped == 0, found
    judged = {v.target.rsplit(",", 1)[0] for v in report.targets}
    assert "NodePort via tc >= 0.9x plain forwarding" in judged
    assert "NodePort via XDP at least forwarding with XDP_PASS attached" in judged
    assert "ebpflb-xdp" in render(report)
