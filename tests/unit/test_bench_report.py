"""ebpflb bench's settings, verdicts, table and plot, on synthetic reports (no kernel)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from ebpflb.bench import report, scenario
from ebpflb.bench.settings import QUICK, Settings
from ebpflb.cli import build_parser
from ebpflb.errors import ConfigError


def _mode(p50: float, cps: float, nodeport: float, **control: Any) -> dict[str, Any]:
    latency = {
        t: {"p50_us": p50, "p99_us": p50 * 2, "samples": 10, "errors": 0}
        for t in ("first", "last", "random")
    }
    data: dict[str, Any] = {
        "latency": latency,
        "connections": {"per_s": cps, "runs": [cps], "errors": 0},
        "nodeport": {"per_s": nodeport, "runs": [nodeport * 0.99, nodeport * 1.01], "errors": 0},
    }
    if control:
        data["control"] = control
    return data


def synthetic(n: int = 20_000) -> dict[str, Any]:
    return {
        "machine": {
            "kernel": "6.x",
            "cpu": "test",
            "cpus": 2,
            "memory_gib": 1.0,
            "iptables": "iptables",
            "nft": "nft",
        },
        "settings": {"endpoints": 3},
        "total_s": 1.0,
        "results": {
            str(n): {
                "none": _mode(20.0, 25_000, 14_000),
                "iptables-legacy": _mode(
                    40.0,
                    15_000,
                    10_000,
                    program_s=2.0,
                    program_cpu_s=1.0,
                    change_s=[0.2],
                    change_cpu_s=[0.1],
                    kernel_memory_bytes=2**20,
                ),
                "ebpflb": _mode(
                    20.5,
                    24_900,
                    12_000,
                    program_s=4.0,
                    program_cpu_s=3.0,
                    change_s=[0.002, 0.003],
                    change_cpu_s=[0.001],
                    kernel_memory_bytes=2**27,
                    details={"bpf_map_bytes": 2**27},
                ),
                "ebpflb-xdp": {"nodeport": {"per_s": 13_000, "runs": [12_900, 13_100]}},
            }
        },
    }


def _verdicts(rep: dict[str, Any]) -> dict[str, bool]:
    return {v["target"]: v["ok"] for v in report.check_targets(rep)}


def test_all_targets_met_on_a_good_run() -> None:
    verdicts = _verdicts(synthetic())
    assert verdicts and all(verdicts.values()), verdicts
    assert "all services programmed from nothing < 5 s" in verdicts
    assert "one endpoint change < 5 ms" in verdicts


@pytest.mark.parametrize(
    ("path", "value", "target"),
    [
        (("ebpflb", "latency", "last", "p50_us"), 21.5, "connect p50 (last) within 5% of no proxy"),
        (("ebpflb", "connections", "per_s"), 23_000, "new connections/s within 5% of no proxy"),
        (("ebpflb", "control", "change_s"), [0.002, 0.006], "one endpoint change < 5 ms"),
        (("ebpflb", "control", "program_s"), 5.5, "all services programmed from nothing < 5 s"),
        (
            ("ebpflb", "nodeport", "per_s"),
            9_000,
            "NodePort via tc at least as fast as iptables-legacy",
        ),
        (
            ("ebpflb-xdp", "nodeport", "runs"),
            [11_000, 12_500],
            "NodePort via XDP measurably faster than tc",
        ),
    ],
)
def test_each_target_can_be_missed(path: tuple[str, ...], value: Any, target: str) -> None:
    rep = copy.deepcopy(synthetic())
    node = rep["results"]["20000"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert _verdicts(rep)[target] is False


def test_targets_only_where_the_figures_exist() -> None:
    rep = synthetic(1000)
    names = _verdicts(rep)
    assert "one endpoint change < 5 ms" not in names  # only judged at 20,000
    del rep["results"]["1000"]["none"]
    assert not any("no proxy" in t for t in _verdicts(rep))


def test_render_and_plot(tmp_path: Path) -> None:
    text = report.render(synthetic())
    for word in ("Data plane", "Control plane", "Targets", "iptables-legacy", "20,000", "met"):
        assert word in text
    out = tmp_path / "bench.png"
    report.plot(synthetic(), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_settings_validate() -> None:
    Settings().validate()
    QUICK.validate()
    with pytest.raises(ConfigError, match="unknown mode"):
        Settings(modes=("ipvs",)).validate()
    with pytest.raises(ConfigError, match="--services"):
        Settings(services=(scenario.MAX_SERVICES + 1,)).validate()
    assert not Settings().runs("iptables-nft", 100_000)
    assert not Settings().runs("iptables-nft", 20_000)
    assert Settings().runs("iptables-legacy", 20_000)
    assert Settings(iptables_nft_max_services=20_000).runs("iptables-nft", 20_000)
    assert Settings().runs("ebpflb", 100_000)


def test_cli_settings() -> None:
    from ebpflb.cli import _bench_settings

    args = build_parser().parse_args(["bench", "--quick"])
    assert _bench_settings(args).services == QUICK.services
    args = build_parser().parse_args(["bench", "--quick", "--services", "50,5_000"])
    settings = _bench_settings(args)
    assert settings.services == (50, 5000) and settings.batch == QUICK.batch
    args = build_parser().parse_args(["bench", "--modes", "none,ebpflb", "--no-xdp"])
    settings = _bench_settings(args)
    assert settings.modes == ("none", "ebpflb") and not settings.xdp
    assert settings.services == Settings().services
    with pytest.raises(ConfigError):
        _bench_settings(build_parser().parse_args(["bench", "--services", "ten"]))
    assert build_parser().parse_args(["bench", "maglev"]).bench_command == "maglev"


def test_scenario_addresses() -> None:
    services = scenario.bench_services(5, 3)
    assert services[0].vip == "10.96.0.1" and services[4].vip == "10.96.0.5"
    assert services[1].endpoints == ("10.128.0.2", "10.130.0.2", "10.132.0.2")
    assert [s.node_port for s in services] == [None] * 4 + [scenario.NODE_PORT]
    last = scenario.bench_services(scenario.MAX_SERVICES, scenario.MAX_ENDPOINTS)[-1]
    assert all(scenario.endpoint(last.index, e) in scenario.ENDPOINT_CIDR for e in range(8))
    slice_ = scenario.slice_object(services[2], not_ready=1)
    assert [e["conditions"]["ready"] for e in slice_["endpoints"]] == [True, True, False]
