"""`ebpflb bench pps` without a kernel: its options, the generator's frames, its targets
judged from figures, its report as JSON and back, and its table."""

from __future__ import annotations

import argparse
import json

import pytest

from ebpflb.cli import parse_args
from ebpflb.errors import ConfigError
from lab.bench import command, pktgen, pps
from lab.bench.records import codec
from lab.bench.records.compare import Machine, ProgramTime
from lab.bench.records.pps import FixedRate, Flood, PpsResult, PpsRun
from lab.bench.render import render
from lab.bench.scenario import Family
from lab.bench.settings import PPS_MODES, Mode, PpsSettings


def flood(delivered: float, busy: float = 1.0, misdelivered: int = 0) -> Flood:
    return Flood(5.0, delivered * 1.01, delivered, misdelivered, busy, 1.0)


def result(
    mode: Mode, mpps: float, *, busy: float = 1.0, misdelivered: int = 0, program_ns: float = 0
) -> PpsResult:
    programs = (ProgramTime("ebpflb_np_in", program_ns, 1.0),) if program_ns else ()
    rate = FixedRate(100_000, flood(100_000, busy=0.09), idle_busy=0.01)
    sat = (flood(mpps * 1e6, busy, misdelivered), flood(mpps * 1e6 + 1000, busy))
    return PpsResult(mode, sat, (rate,), programs)


RESULTS = (
    result(Mode.NONE, 1.0),
    result(Mode.NONE_XDP, 0.96),
    result(Mode.IPTABLES_LEGACY, 0.6),
    result(Mode.NFTABLES, 0.7, busy=0.5),
    result(Mode.EBPFLB, 0.8, program_ns=250),
    result(Mode.EBPFLB_XDP, 0.995, misdelivered=3, program_ns=140),
)


def parse(*argv: str) -> argparse.Namespace:
    return parse_args(["bench", "pps", *argv])


def test_options_and_quick() -> None:
    args = parse("--quick", "--modes", "none,ebpflb", "--family", "ipv6", "--rates", "1000,2000")
    settings = command.pps_settings(args)
    assert settings.modes == (Mode.NONE, Mode.EBPFLB)
    assert settings.repeats == 1 and settings.family is Family.IPV6
    assert settings.rates == (1000, 2000)
    assert command.pps_settings(parse()).modes == PPS_MODES
    with pytest.raises(ConfigError, match="unknown mode"):
        command.pps_settings(parse("--modes", "ipvs"))
    with pytest.raises(ConfigError, match="one offered rate at least"):
        command.pps_settings(parse("--rates", "0"))
    with pytest.raises(ConfigError, match="--rates: comma-separated numbers"):
        command.pps_settings(parse("--rates", "fast"))


@pytest.mark.parametrize("family", list(Family), ids=str)
def test_frames_name_every_header_the_generator_needs(family: Family) -> None:
    config = pktgen.frame_config(
        family,
        src_mac="02:00:00:00:00:02",
        dst_mac="02:00:00:00:00:01",
        src="fd00:240::2" if family is Family.IPV6 else "10.240.0.2",
        dst="fd00:240::1" if family is Family.IPV6 else "10.240.0.1",
        dport=30080,
        flows=256,
    )
    assert "udp(sp=dinc(10000, 10255), dp=30080)" in config
    if family is Family.IPV6:  # trafgen 0.6.8 would send EtherType 0
        assert "type=0x86dd" in config and "hl=64" in config
    else:
        assert "ttl=64" in config


def test_targets_judged_with_the_gap_per_packet_and_the_programs() -> None:
    verdicts = {v.target: v for v in pps.judge(RESULTS)}
    tc = verdicts["NodePort via tc >= 0.95x plain forwarding, packets/s on one core"]
    assert tc.ok is False and "x0.80" in tc.detail
    # 1,250 ns vs 1,000 ns per packet: the gap, beside the program's own time.
    assert "gap 250" in tc.detail and "np_in 250 ns per packet" in tc.detail
    xdp = verdicts["NodePort via XDP >= 0.99x plain forwarding, packets/s on one core"]
    assert xdp.ok is True
    assert verdicts["NodePort via tc at least the packets/s of nftables"].ok is True
    assert not any("iptables-nft" in target for target in verdicts)  # not measured
    # A mode that delivered packets to another port, or whose core never saturated.
    assert verdicts["ebpflb-xdp: every packet translated"].ok is False
    assert "busy 50%" in verdicts["nftables: the node's core saturated"].detail


def test_fixed_rate_takes_the_idle_share_off() -> None:
    fixed = RESULTS[0].rates[0]
    assert fixed.node_cpu == pytest.approx(0.08)
    assert fixed.ns_per_packet == pytest.approx(800)


def test_report_round_trip_and_table() -> None:
    machine = Machine("6.18", "cpu", 2, 24.0, "iptables", "nft")
    run = PpsRun(machine, PpsSettings(), RESULTS, pps.judge(RESULTS), 42.0)
    assert codec.from_json(json.loads(codec.to_json(run))) == run
    text = render(run)
    assert "ebpflb bench pps" in text and "MISSED" in text
    rows = [line.split() for line in text.splitlines()]
    row = " ".join(next(r for r in rows if r[:1] == ["ebpflb"] and r[1] != "bench"))
    assert row.split()[1] == "0.800"  # the median window, in Mpps
    assert "8.0% (800 ns)" in row  # the node core at 100,000 packets/s offered
    assert "np_in 250 ns = 4.0 Mpps alone" in row
