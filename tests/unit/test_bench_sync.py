"""The sync bench's own arithmetic: start-up figures from the agent's log, summaries, sizes."""

from __future__ import annotations

from datetime import datetime

import pytest

from ebpflb.bench import sync
from ebpflb.config import Config

LOG = [
    "2026-11-30 06:40:41,100 INFO ebpflb.sources.kubernetes: watching Services and ...",
    "2026-11-30 06:40:41,900 INFO ebpflb.sources.kubernetes: listed 20000 Services at"
    " resourceVersion 40001 in 0.900s (40 requests)",
    "2026-11-30 06:40:42,008 INFO ebpflb.datapath.loader: compiled and loaded socket-LB"
    " programs in 0.49s",
    "2026-11-30 06:40:42,013 INFO ebpflb.app: socket-LB attached to cgroup /x; maps pinned",
    "2026-11-30 06:40:42,100 INFO ebpflb.sources.kubernetes: listed 20000 EndpointSlices at"
    " resourceVersion 40001 in 1.100s (40 requests)",
    "2026-11-30 06:40:43,350 INFO ebpflb.agent: initial sync complete in 1.250s: 20001"
    " frontends, 0 errors",
]


def test_startup_figures_come_from_the_log_timestamps() -> None:
    started = datetime(2026, 11, 30, 6, 40, 41).timestamp()
    figures = sync.startup_figures(LOG, started)
    assert figures == {
        "socket_lb_compile_s": 0.49,
        "start_to_socket_lb_compiled_s": 1.008,
        "start_to_attached_s": 1.013,
        "services_list_s": 0.9,
        "services_listed": 20000,
        "start_to_services_listed_s": 0.9,
        "slices_list_s": 1.1,
        "slices_listed": 20000,
        "start_to_slices_listed_s": 1.1,
        "sync_s": 1.25,
        "frontends": 20001,
        "sync_errors": 0,
        "start_to_synced_s": 2.35,
    }


def test_latency_summary() -> None:
    values = [0.003, 0.001, 0.002, 0.010, 0.002]
    assert sync.latency_summary(values) == {
        "median_s": 0.002,
        "p99_s": 0.010,
        "min_s": 0.001,
        "max_s": 0.010,
    }
    assert sync.latency_summary([]) == {}


@pytest.mark.parametrize(
    ("args", "names"),
    [
        ((), []),
        (("--interfaces", "eth0,eth1"), ["eth0", "eth1"]),
        (("--xdp", "native", "--interfaces=eth1"), ["eth1"]),
        (("--interfaces=",), []),
    ],
)
def test_the_interfaces_to_clean_are_the_ones_named(
    args: tuple[str, ...], names: list[str]
) -> None:
    assert sync._interfaces_in(args) == names


def test_map_sizes_hold_every_service_and_never_go_below_the_defaults() -> None:
    default = Config()
    small = sync.map_sizes(10, 3)
    assert small == {
        "slot_pool_size": default.slot_pool_size,
        "max_services": default.max_services,
        "max_backends": default.max_backends,
    }
    big = sync.map_sizes(100_000, 3)
    assert big["slot_pool_size"] >= 100_000 * 509 * 5 // 4
    assert big["max_services"] >= 100_008 * 5 // 4 and big["max_backends"] >= 300_000 * 5 // 4
    assert all(value & (value - 1) == 0 for value in big.values())  # powers of two
