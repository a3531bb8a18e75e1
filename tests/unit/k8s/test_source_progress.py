"""What sources report about their own work (`Source.progress()`, read by /status)."""

from __future__ import annotations

import time
from pathlib import Path

from ebpflb.k8s.sources.base import Kind, ListFigures
from ebpflb.k8s.sources.kubernetes import ApiConfig, KubernetesSource, WatchOptions
from ebpflb.k8s.sources.manifests import ManifestSource
from lab.harness.fakeapi import FakeApiServer
from tests.factories import endpoint_slice, service
from tests.unit.k8s.test_kubernetes_source import Recorder, both_listed, wait_until
from tests.unit.k8s.test_manifests import SERVICE, SLICE, Sink


def test_manifest_source_reports_its_first_read_and_current_errors(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(f"{SERVICE}---\nkind: [unclosed\n---\n{SLICE}")
    source = ManifestSource(tmp_path, Sink(), poll_interval=0.01)
    assert source.progress().lists == {}
    while not source.sync_once():
        time.sleep(0.01)
    progress = source.progress()
    assert {kind: figures.objects for kind, figures in progress.lists.items()} == {
        Kind.SERVICE: 1,
        Kind.ENDPOINT_SLICE: 1,
    }
    assert progress.lists[Kind.SERVICE].seconds >= 0
    (error,) = progress.errors
    assert error.startswith(f"{tmp_path / 'a.yaml'} document 2: invalid YAML")

    (tmp_path / "a.yaml").write_text(SERVICE)  # fixed, and the slice gone
    while not source.sync_once():
        time.sleep(0.01)
    assert source.progress().errors == ()
    assert source.progress().lists[Kind.ENDPOINT_SLICE].objects == 1  # the first read's


def test_kubernetes_source_reports_each_initial_list() -> None:
    api = FakeApiServer().start()
    source = None
    try:
        for i in range(5):
            api.create(service(f"s{i}", cluster_ip=f"10.96.0.{i + 1}"))
        api.create(endpoint_slice("s0-1", service_name="s0"))
        recorder = Recorder()
        source = KubernetesSource(
            recorder, ApiConfig.from_host(api.url), options=WatchOptions(page_size=2)
        )
        source.start()
        wait_until(both_listed(recorder), "both initial lists")
        lists = source.progress().lists
        assert {kind: figures.objects for kind, figures in lists.items()} == {
            Kind.SERVICE: 5,  # over three pages
            Kind.ENDPOINT_SLICE: 1,
        }
        assert all(isinstance(f, ListFigures) and f.seconds > 0 for f in lists.values())
        assert source.progress().errors == ()
    finally:
        if source is not None:
            source.stop()
        api.close()
