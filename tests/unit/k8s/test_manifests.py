from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from ebpflb.errors import Fault, InvalidObjectError, ManifestError
from ebpflb.k8s.sources.base import Kind
from ebpflb.k8s.sources.documents import split_documents
from ebpflb.k8s.sources.manifests import ManifestSource, load
from ebpflb.model import NamespacedName

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
        self.invalid: list[InvalidObjectError] = []

    def object_updated(self, kind: Kind, obj: Mapping[str, Any]) -> None:
        self.events.append(("update", kind, obj["metadata"]["name"]))

    def object_deleted(self, kind: Kind, ref: NamespacedName) -> None:
        self.events.append(("delete", kind, ref.name))

    def initial_list_done(self, kind: Kind) -> None:
        self.events.append(("listed", kind, None))

    def object_invalid(self, error: InvalidObjectError) -> None:
        self.invalid.append(error)


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
    assert "a.yaml document 2: invalid YAML" in str(error)
    assert (error.kind, error.fault) == ("Manifest", Fault.PARSE)


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
    assert sink.events == [  # the first read: in the files' order, as each is parsed
        ("update", Kind.SERVICE, "web"),
        ("update", Kind.ENDPOINT_SLICE, "web-1"),
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


def sync(source: ManifestSource, *files: Path) -> bool:
    """One reload after an edit: a new mtime for each file (the clock's resolution may hide
    an edit), then the two polls that see the files stay unchanged."""
    for n, file in enumerate(files):
        os.utime(file, ns=(10**9 * (100 + n + sync.calls), 10**9 * (100 + n + sync.calls)))
    sync.calls += len(files) + 1  # type: ignore[attr-defined]
    source.sync_once()
    return source.sync_once()


sync.calls = 0  # type: ignore[attr-defined]


def started(path: Path, sink: Sink | None = None) -> tuple[ManifestSource, Sink]:
    sink = sink or Sink()
    source = ManifestSource(path, sink)
    source.sync_once()
    assert source.sync_once()
    return source, sink


def test_an_undecodable_file_is_reported_skipped_and_read_again_when_it_changes(
    tmp_path: Path,
) -> None:
    """Random bytes named *.yaml: UnicodeDecodeError escaped load() and the agent exited."""
    (tmp_path / "good.yaml").write_text(SERVICE)
    junk = tmp_path / "junk.yaml"
    junk.write_bytes(b"\xff\xfe\x00garbage\x80" + bytes(range(256)))
    source, sink = started(tmp_path)
    assert ("update", Kind.SERVICE, "web") in sink.events
    (problem,) = sink.invalid
    assert (problem.kind, problem.fault) == ("Manifest", Fault.DECODE)
    assert str(problem).startswith(f"Manifest {junk}: is not UTF-8 text")
    junk.write_text(SLICE)  # fixed: read again, and its object arrives
    sink.events.clear()
    assert sync(source, junk)
    assert sink.events == [("update", Kind.ENDPOINT_SLICE, "web-1")]
    assert len(sink.invalid) == 1


def test_a_file_that_cannot_be_read_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.yaml").write_text(SERVICE)
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.name == "a.yaml":
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    snapshot = load(tmp_path)
    assert not snapshot.objects
    (problem,) = snapshot.errors
    assert "a.yaml: cannot be read: Permission denied" in str(problem)
    assert problem.fault is Fault.DECODE


def test_problems_are_reported_once_per_change_of_their_file(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("kind: [unclosed\n")
    good = tmp_path / "good.yaml"
    good.write_text(SERVICE)
    source, sink = started(tmp_path)
    assert len(sink.invalid) == 1
    good.write_text(SERVICE.replace("10.96.0.10", "10.96.0.11"))
    assert sync(source, good)
    assert len(sink.invalid) == 1  # bad.yaml did not change: not read, not reported again


def test_a_broken_edit_keeps_what_the_file_held_until_it_reads_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "svc.yaml"
    path.write_text(f"{SERVICE}---\n{SLICE}")
    source, sink = started(path)
    sink.events.clear()
    # The slice removed and the Service broken in one edit: nothing is deleted yet.
    path.write_text(SERVICE.replace("ports: [", "ports: [[["))
    assert sync(source, path)
    assert sink.events == [] and len(sink.invalid) == 1
    path.write_text(SERVICE)  # readable again: now the slice's removal is applied
    assert sync(source, path)
    assert sink.events == [("delete", Kind.ENDPOINT_SLICE, "web-1")]


def test_a_sink_failing_on_one_object_does_not_stop_the_others(tmp_path: Path) -> None:
    """A reload used to stop at the first object the agent raised on: the objects after it
    were never delivered, yet counted as delivered."""

    class Fussy(Sink):
        def object_updated(self, kind: Kind, obj: Mapping[str, Any]) -> None:
            if obj["metadata"]["name"] == "a-bad":
                raise AttributeError("'int' object has no attribute 'upper'")
            super().object_updated(kind, obj)

    path = tmp_path / "svc.yaml"
    path.write_text(SERVICE)
    source, sink = started(path, Fussy())
    sink.events.clear()
    bad = SERVICE.replace("name: web", "name: a-bad")
    after = SERVICE.replace("name: web", "name: z-after")
    path.write_text(f"{SERVICE}---\n{bad}---\n{after}")
    assert sync(source, path)
    assert sink.events == [("update", Kind.SERVICE, "z-after")]


def test_a_later_edit_is_applied_while_a_broken_file_stays(tmp_path: Path) -> None:
    """The files were marked loaded before they were read: with one unreadable file, every
    reload failed and no later edit of any file was applied."""
    good = tmp_path / "good.yaml"
    good.write_text(SERVICE)
    source, sink = started(tmp_path)
    junk = tmp_path / "junk.yaml"
    junk.write_bytes(b"\x80\x81 not text")
    assert sync(source, junk)
    sink.events.clear()
    good.write_text(f"{SERVICE}---\n{SLICE}")
    assert sync(source, good)
    assert sink.events == [("update", Kind.ENDPOINT_SLICE, "web-1")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("apiVersion: v1\nkind: Service\nkind: Service\n", "duplicate key 'kind'"),
        ("a: &a [*a]\n", "a YAML alias contains itself"),
        ("a: " + "[" * 120 + "]" * 120 + "\n", "nests 121 levels deep"),
        (
            "\n".join(
                f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}" if i else "x"] * 9) + "]"
                for i in range(9)
            ),
            "YAML aliases expand",
        ),
        ("a: 2024-13-45\n", "invalid YAML: month must be in 1..12"),
        ("a: !!python/object/apply:os.system [ls]\n", "invalid YAML: could not determine"),
        ("? [1, 2]\n: x\n", "unhashable key"),
        ("just a string\n", "is a str, not an object"),
        ("apiVersion: v1\nkind: List\nitems: {a: 1}\n", "List items is not an array"),
        ("\x07\n", "control characters are not allowed"),
    ],
)
def test_documents_that_are_not_objects_are_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    (tmp_path / "a.yaml").write_text(f"{text}\n---\n{SERVICE}")
    snapshot = load(tmp_path)
    assert [r.name for _, r in snapshot.objects] == ["web"]
    (problem,) = snapshot.errors
    assert message in str(problem) and "a.yaml document 1" in str(problem)


def test_yaml_merge_keys_and_small_aliases_are_fine(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: &m {name: web}\n"
        "spec: {<<: {clusterIP: 10.0.0.1}, clusterIP: 10.96.0.10, ports: [{port: 80}]}\n"
    )
    snapshot = load(tmp_path)
    assert not snapshot.errors
    ((_, obj),) = snapshot.objects.items()
    assert obj["spec"]["clusterIP"] == "10.96.0.10"


def test_an_object_without_a_name_is_reported_with_its_file(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        f"apiVersion: v1\nkind: Service\nmetadata: {{name: [web]}}\n---\n{SERVICE}"
    )
    snapshot = load(tmp_path)
    (problem,) = snapshot.errors
    assert str(problem) == (
        f"Service {tmp_path / 'a.yaml'} document 1: metadata.name must be a string, "
        "not array ['web']"
    )
    assert (problem.fault, problem.field) == (Fault.TYPE, "metadata.name")


def test_hidden_directories_are_skipped(tmp_path: Path) -> None:
    """A ConfigMap volume: each file is a symlink into ..data, itself a symlink to a
    hidden timestamped directory. Each object is read once, through the visible name."""
    stamped = tmp_path / "..2024_01_01"
    stamped.mkdir()
    (stamped / "svc.yaml").write_text(SERVICE)
    (tmp_path / "..data").symlink_to(stamped.name)
    (tmp_path / "svc.yaml").symlink_to("..data/svc.yaml")
    snapshot = load(tmp_path)
    assert [r.name for _, r in snapshot.objects] == ["web"] and not snapshot.warnings


def test_a_utf8_byte_order_mark_is_fine(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_bytes(b"\xef\xbb\xbf" + SERVICE.encode())
    assert [r.name for _, r in load(tmp_path).objects] == ["web"]
