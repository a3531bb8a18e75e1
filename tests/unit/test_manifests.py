from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from ebpflb.errors import ManifestError
from ebpflb.model import NamespacedName
from ebpflb.sources.base import Kind
from ebpflb.sources.manifests import ManifestSource, load, split_documents

SERVICE = """\
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
"""
SLICE = """\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.1.11]}]
"""


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, Kind, Any]] = []

    def object_updated(self, kind: Kind, obj: Mapping[str, Any]) -> None:
        self.events.append(("update", kind, obj["metadata"]["name"]))

    def object_deleted(self, kind: Kind, ref: NamespacedName) -> None:
        self.events.append(("delete", kind, ref.name))

    def initial_list_done(self, kind: Kind) -> None:
        self.events.append(("listed", kind, None))


def test_split_keeps_documents_apart() -> None:
    assert len(split_documents(f"---\n{SERVICE}---\n{SLICE}\n--- # trailing\n")) == 2


def test_broken_document_is_reported_and_others_load(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(f"{SERVICE}---\nkind: [unclosed\n---\n{SLICE}")
    (tmp_path / "notes.txt").write_text("ignored")
    snapshot = load(tmp_path)
    assert {(k.value, r.name) for k, r in snapshot.objects} == {
        ("Service", "web"),
        ("EndpointSlice", "web-1"),
    }
    (error,) = snapshot.errors
    assert "a.yaml document 2: invalid YAML" in error


def test_list_kind_and_other_kinds(tmp_path: Path) -> None:
    (tmp_path / "list.yaml").write_text(
        textwrap.dedent("""\
        apiVersion: v1
        kind: List
        items:
          - apiVersion: v1
            kind: Service
            metadata: {name: a}
            spec: {clusterIP: 10.96.0.1, ports: [{port: 1}]}
          - {apiVersion: apps/v1, kind: Deployment, metadata: {name: d}}
        """)
    )
    assert [r.name for _, r in load(tmp_path).objects] == ["a"]


def test_missing_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no such file"):
        load(tmp_path / "nope")


def test_source_delivers_initial_list_then_only_changes(tmp_path: Path) -> None:
    path = tmp_path / "svc.yaml"
    path.write_text(f"{SERVICE}---\n{SLICE}")
    sink = Sink()
    source = ManifestSource(path, sink)
    assert not source.sync_once()  # files seen once: read when they stay the same
    assert source.sync_once()
    assert sink.events == [
        ("update", Kind.ENDPOINT_SLICE, "web-1"),
        ("update", Kind.SERVICE, "web"),
        ("listed", Kind.SERVICE, None),
        ("listed", Kind.ENDPOINT_SLICE, None),
    ]
    assert not source.sync_once()  # nothing changed on disk
    sink.events.clear()
    path.write_text(SERVICE.replace("10.96.0.10", "10.96.0.11"))
    os.utime(path, ns=(1, 1))  # a different mtime even within the clock's resolution
    assert not source.sync_once()
    assert source.sync_once()
    assert sink.events == [
        ("delete", Kind.ENDPOINT_SLICE, "web-1"),
        ("update", Kind.SERVICE, "web"),
    ]


def test_a_half_written_file_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "svc.yaml"
    path.write_text(SERVICE)
    sink = Sink()
    source = ManifestSource(path, sink)
    source.sync_once()
    source.sync_once()
    sink.events.clear()
    path.write_text("")  # an editor truncated the file and has not written it yet...
    assert not source.sync_once()
    path.write_text(SERVICE.replace("80", "81"))  # ...and now has
    os.utime(path, ns=(2, 2))
    assert not source.sync_once()
    assert source.sync_once()
    assert sink.events == [("update", Kind.SERVICE, "web")]  # never a delete
