"""`ebpflb bench bulk` without a kernel: its options, its targets judged from figures, its
report as JSON and back, and its table."""

from __future__ import annotations

import argparse

import pytest

from ebpflb.cli import parse_args
from ebpflb.errors import ConfigError
from lab.bench import bulk, command
from lab.bench.records import codec
from lab.bench.records.bulk import BulkFigure, BulkResult, BulkRun
from lab.bench.records.compare import Machine
from lab.bench.render import render
from lab.bench.settings import BULK_MODES, BulkSettings, Mode


def fig(gbit: float) -> BulkFigure:
    return BulkFigure(gbit, (gbit,), 0)


def result(mode: Mode, up: float, down: float, dropped: int | None = None) -> BulkResult:
    return BulkResult(mode, fig(up), fig(down), dropped)


RESULTS = (
    result(Mode.NONE, 10.0, 10.0),
    result(Mode.NONE_XDP, 3.0, 3.0),
    result(Mode.IPTABLES_LEGACY, 9.0, 9.5),
    result(Mode.NFTABLES, 9.2, 9.0),
    result(Mode.EBPFLB, 9.5, 8.0, dropped=0),
    result(Mode.EBPFLB_XDP, 3.1, 2.5, dropped=2),
)


def parse(*argv: str) -> argparse.Namespace:
    return parse_args(["bench", "bulk", *argv])


def test_options_and_quick() -> None:
    args = parse("--quick", "--modes", "none,ebpflb", "--family", "ipv6")
    settings = command.bulk_settings(args)
    assert settings.modes == (Mode.NONE, Mode.EBPFLB)
    assert settings.repeats == 1 and settings.family.value == "ipv6"
    assert command.bulk_settings(parse()).modes == BULK_MODES
    with pytest.raises(ConfigError, match="unknown mode 'kube-proxy'"):
        command.bulk_settings(parse("--modes", "kube-proxy"))
    with pytest.raises(ConfigError, match="seconds >= 1"):
        command.bulk_settings(parse("--seconds", "0"))


def test_targets_judged_against_the_floor_of_each_path() -> None:
    verdicts = {v.target: v for v in bulk.judge(RESULTS)}
    tc = "NodePort via tc >= 0.9x plain forwarding"
    assert verdicts[f"{tc}, upload"].ok is True  # 9.5 / 10
    assert verdicts[f"{tc}, download"].ok is False  # 8.0 / 10
    assert "x0.80" in verdicts[f"{tc}, download"].detail
    xdp = "NodePort via XDP at least forwarding with XDP_PASS attached"
    assert verdicts[f"{xdp}, upload"].ok is True and verdicts[f"{xdp}, download"].ok is False
    assert verdicts["NodePort via tc at least as fast as nftables, upload"].ok is True
    # A mode the run did not measure is not judged.
    assert not any("iptables-nft" in target for target in verdicts)
    # ebpflb's own drops are a missed target, named with the counters.
    dropped = verdicts["ebpflb-xdp: no packet dropped by ebpflb"]
    assert dropped.ok is False and "fib_fail" in dropped.detail


def test_report_round_trip_and_table() -> None:
    machine = Machine("6.18", "cpu", 2, 24.0, "iptables", "nft")
    run = BulkRun(machine, BulkSettings(), RESULTS, bulk.judge(RESULTS), 42.0)
    assert codec.from_json(__import__("json").loads(codec.to_json(run))) == run
    text = render(run)
    assert "ebpflb bench bulk" in text
    assert "ebpflb-xdp" in text and "MISSED" in text
    row = next(line for line in text.splitlines() if line.split()[:2] == ["ebpflb", "9.50"])
    assert "8.00" in row
