"""The sync bench's own arithmetic and text: map sizes, the interfaces it cleans, which
services change, and its report rendered (no kernel)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ebpflb.config import Config
from lab.bench import agentrun, render, sync
from tests.unit.lab.bench.test_records import _sync


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
    assert agentrun.interfaces_in(args) == names


def test_map_sizes_hold_every_service_and_never_go_below_the_defaults() -> None:
    default = Config()
    small = agentrun.map_sizes(10, 3)
    assert (small.slot_pool_size, small.max_services, small.max_backends) == (
        default.slot_pool_size,
        default.max_services,
        default.max_backends,
    )
    big = agentrun.map_sizes(100_000, 3)
    assert big.slot_pool_size >= 100_000 * 509 * 5 // 4
    assert big.max_services >= 100_008 * 5 // 4 and big.max_backends >= 300_000 * 5 // 4
    for value in (big.slot_pool_size, big.max_services, big.max_backends):
        assert value & (value - 1) == 0  # powers of two


def test_changes_are_spread_and_in_range() -> None:
    picks = sync.sync_picks(10_000, 10)
    assert len(set(picks)) == 10 and all(0 <= p < 10_000 for p in picks)


def test_the_sync_report_as_text() -> None:
    text = render.render(_sync())
    assert "ebpflb bench sync: 10,000 Services x 3 endpoints (30,000 endpoints" in text
    assert "compile + load socket-LB programs" in text and "400.0 ms" in text
    assert "list 10,000 Services (in parallel)" in text and "260.0 ms, done at" not in text
    assert "first sync: 10,003 frontends, M=509 each" in text
    assert "median 1.7 ms (p99 1.8 ms, min 1.6 ms, max 1.8 ms), 2 changes" in text
    assert "periodic full resync (every 15 s here)" in text
    assert "RSS 300 MiB, peak 320 MiB" in text


def test_the_manifests_sync_report_judges_the_targets() -> None:
    import dataclasses

    from lab.bench.settings import SyncSource

    run = _sync()
    run = dataclasses.replace(
        run,
        settings=dataclasses.replace(run.settings, source=SyncSource.MANIFESTS),
        change_to_map_s=(0.3, 1.2),
    )
    text = render.render(run)
    assert "`ebpflb run --manifests FILE`, one file of 20,000 documents" in text
    assert "one document edited: file write -> map entry" in text
    start = next(line for line in text.splitlines() if "manifests 10,000+10,000 from" in line)
    assert "met" in start and "1.60 s" in start
    edit = next(line for line in text.splitlines() if "one edit in 20,000 documents" in line)
    assert "MISSED" in edit and "worst 1.20 s" in edit


def test_a_manifest_change_edits_only_that_services_slice_document(tmp_path: Path) -> None:
    from ebpflb.k8s.sources.manifests import read_file, scan_file
    from lab.bench.manifests import ManifestFile
    from lab.bench.scenario import bench_services, objects, slice_object

    services = bench_services(20, 3)
    file = ManifestFile.write(tmp_path / "s.yaml", services)
    before = read_file(file.path)
    assert not before.problems and list(before.objects.values()) == list(objects(services))
    scan, _ = scan_file(file.path)
    file.write_change(slice_object(services[7], not_ready=1))
    after, fresh = scan_file(file.path, scan.readings)
    assert after.parsed == 1
    assert list(fresh.values()) == [slice_object(services[7], not_ready=1)]
    assert read_file(file.path).objects == {
        **before.objects,
        **{key: fresh[token] for key, token in after.held.items() if token in fresh},
    }
    assert not list(tmp_path.glob(".*"))  # the staged file was renamed over the old one


def test_sync_source_option() -> None:
    from ebpflb.cli import parse_args
    from lab.bench import command
    from lab.bench.settings import SyncSource

    args = parse_args(["bench", "sync", "--source", "manifests"])
    assert command.sync_settings(args).source is SyncSource.MANIFESTS
    args = parse_args(["bench", "sync"])
    assert command.sync_settings(args).source is SyncSource.API
