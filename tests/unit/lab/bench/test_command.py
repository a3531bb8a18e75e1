"""`ebpflb bench compare|maglev|sync`: options, settings, and rendering saved reports
through the command line (no kernel, nothing measured)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from ebpflb.cli import main, parse_args
from ebpflb.errors import ConfigError
from lab.bench import command, scenario
from lab.bench.records import codec
from lab.bench.settings import (
    COMPARE_QUICK,
    SYNC_QUICK,
    CompareSettings,
    Mode,
    SyncSettings,
    parse_modes,
)
from tests import REPO
from tests.unit.lab.bench.test_records import _maglev, _sync
from tests.unit.lab.bench.test_report import run

DOCS = REPO / "docs" / "bench"


def parse(*argv: str) -> argparse.Namespace:
    return parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["bench"], ("bench", "compare", False)),
        (["bench", "--quick"], ("bench", "compare", False)),
        (["--debug", "bench", "--json"], ("bench", "compare", True)),
        (["bench", "maglev", "--quick"], ("bench", "maglev", False)),
        (["bench", "compare"], ("bench", "compare", False)),
        (["bench", "--help"], None),  # the bench's own help
        (["run", "--manifests", "bench"], ("run", None, False)),
    ],
)
def test_bench_alone_means_compare(
    argv: list[str],
    expected: tuple[str, str | None, bool] | None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if expected is None:
        with pytest.raises(SystemExit) as exit_:
            parse(*argv)
        assert exit_.value.code == 0
        assert capsys.readouterr().out.startswith("usage: ebpflb bench [-h] {compare,maglev,")
        return
    args = parse(*argv)
    assert (args.command, getattr(args, "bench_command", None), args.debug) == expected
    assert ("--quick" in argv) == bool(getattr(args, "quick", False))


@pytest.mark.parametrize("sub", command.SUBCOMMANDS)
def test_every_subcommand_has_the_common_options(sub: str) -> None:
    args = parse("bench", sub, "--quick", "--json", "--save", "x.json", "--from-report", "y")
    assert args.bench_command == sub and args.quick and args.json
    assert args.save == Path("x.json") and args.from_report == Path("y")


def test_compare_settings_quick_and_explicit_options() -> None:
    settings = command.compare_settings(parse("bench", "--quick"))
    assert settings == COMPARE_QUICK
    args = parse("bench", "--quick", "--services", "50,5_000", "--rounds", "3")
    settings = command.compare_settings(args)
    assert settings.services == (50, 5000) and settings.rounds == 3
    assert settings.batch == COMPARE_QUICK.batch  # --quick's, not the default
    args = parse("bench", "compare", "--modes", "none,ebpflb", "--no-xdp")
    settings = command.compare_settings(args)
    assert settings.modes == (Mode.NONE, Mode.EBPFLB) and not settings.xdp
    assert settings.services == CompareSettings().services
    with pytest.raises(ConfigError, match="comma-separated numbers"):
        command.compare_settings(parse("bench", "--services", "ten"))
    with pytest.raises(ConfigError, match="unknown mode 'ipvs'"):
        command.compare_settings(parse("bench", "--modes", "none,ipvs"))


def test_sync_settings() -> None:
    assert command.sync_settings(parse("bench", "sync")) == SyncSettings()
    quick = command.sync_settings(parse("bench", "sync", "--quick", "--changes", "7"))
    assert quick.services == SYNC_QUICK.services and quick.changes == 7
    with pytest.raises(ConfigError, match="--changes"):
        command.sync_settings(parse("bench", "sync", "--changes", "0"))
    churn = command.sync_settings(
        parse(
            "bench", "sync", "--services", "100000", "--endpoints", "10", "--sync-period", "30",
            "--min-sync-period", "0.02", "--churn-rate", "500", "--churn-seconds", "12",
            "--agent-arg=--per-service-metrics=false",
        )
    )  # fmt: skip
    assert (churn.services, churn.endpoints, churn.sync_period) == (100_000, 10, 30.0)
    assert (churn.min_sync_period, churn.churn_rate, churn.churn_seconds) == (0.02, 500, 12.0)
    assert churn.agent_args == ("--per-service-metrics=false",)
    # The churn must end before the next periodic resync (15 s by default).
    with pytest.raises(ConfigError, match="--churn-seconds 15 must end a second before"):
        command.sync_settings(parse("bench", "sync", "--churn-seconds", "15"))


def test_settings_validate() -> None:
    CompareSettings().validate()
    COMPARE_QUICK.validate()
    SYNC_QUICK.validate()
    with pytest.raises(ConfigError, match="unknown mode"):
        parse_modes("ipvs")
    with pytest.raises(ConfigError, match="--services"):
        CompareSettings(services=(scenario.MAX_SERVICES + 1,)).validate()
    assert not CompareSettings().runs(Mode.IPTABLES_NFT, 100_000)
    assert not CompareSettings().runs(Mode.IPTABLES_NFT, 20_000)
    assert CompareSettings().runs(Mode.IPTABLES_LEGACY, 20_000)
    assert CompareSettings(iptables_nft_max_services=20_000).runs(Mode.IPTABLES_NFT, 20_000)
    assert CompareSettings().runs(Mode.EBPFLB, 100_000)


def test_scenario_addresses() -> None:
    services = scenario.bench_services(5, 3)
    assert services[0].vip == "10.96.0.1" and services[4].vip == "10.96.0.5"
    assert services[1].endpoints == ("10.128.0.2", "10.130.0.2", "10.132.0.2")
    assert [s.node_port for s in services] == [None] * 4 + [scenario.NODE_PORT]
    last = scenario.bench_services(scenario.MAX_SERVICES, scenario.MAX_ENDPOINTS)[-1]
    blocks = range(scenario.MAX_ENDPOINTS)
    assert all(scenario.endpoint(last.index, e) in scenario.ENDPOINT_CIDR for e in blocks)
    slice_ = scenario.slice_object(services[2], not_ready=1)
    assert [e["conditions"]["ready"] for e in slice_["endpoints"]] == [True, True, False]


def test_from_report_renders_saves_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved, png = tmp_path / "again.json", tmp_path / "bench.png"
    argv = ["bench", "--from-report", str(DOCS / "report.json"), "--save", str(saved)]
    assert main([*argv, "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "Data plane" in text and "100,000 │ ebpflb" in text and "MISSED" in text
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert json.loads(saved.read_text())["kind"] == "compare"
    assert main(["bench", "compare", "--from-report", str(saved)]) == 0
    assert capsys.readouterr().out == text  # the schema 2 copy renders the same
    assert main(["bench", "--from-report", str(saved), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(saved.read_text())


@pytest.mark.parametrize("report", [_maglev(), _sync()], ids=["maglev", "sync"])
def test_from_report_for_the_other_subcommands(
    report: codec.Report, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.json"
    codec.save(report, path)
    assert main(["bench", report.KIND, "--from-report", str(path)]) == 0
    assert capsys.readouterr().out.startswith(("Maglev benchmark", "ebpflb bench sync"))
    # Asking another sub-command to render it says which one renders it.
    assert main(["bench", "--from-report", str(path)]) == 1
    assert f"ebpflb bench {report.KIND} --from-report" in capsys.readouterr().err


def test_a_broken_report_is_one_line_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.json"
    data = json.loads(codec.to_json(run()))
    data["total_s"] = "long"
    path.write_text(json.dumps(data))
    assert main(["bench", "--from-report", str(path)]) == 1
    assert capsys.readouterr().err == f'ebpflb: {path}.total_s: expected a number, got "long"\n'


def test_bench_without_the_lab_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where only the agent is installed (its wheel, its image), `ebpflb bench` names the
    lab and how to install it; every other command is unaffected."""
    for name in ("lab", "lab.bench", "lab.bench.command"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails: ModuleNotFoundError
    assert main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ebpflb: `ebpflb bench` is in the lab distribution")
    assert "pip install -e lab/" in err
    assert parse("maps", "dump").command == "maps"
