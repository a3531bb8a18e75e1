"""A source reading Services and EndpointSlices from YAML files, and following edits.

PATH is a file or a directory (searched recursively for *.yaml, *.yml, *.json). Each file may
hold several documents and `kind: List` wrappers. A document that fails to parse is
reported with its file and index and skipped; the others still load. Files are polled
(stat every `poll_interval`), which also follows ConfigMap volumes that swap a symlink.
A change is read once the files have stayed unchanged for one poll interval, so a file
caught half-written (truncated, then filled) never reads as "every object deleted".
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ebpflb.errors import ManifestError
from ebpflb.model import NamespacedName
from ebpflb.sources.base import Kind, ListFigures, ObjectSink, SourceProgress
from ebpflb.translate import object_ref

log = logging.getLogger(__name__)

SUFFIXES = (".yaml", ".yml", ".json")
_API_VERSIONS = {Kind.SERVICE: ("v1",), Kind.ENDPOINT_SLICE: ("discovery.k8s.io/v1",)}
_DOC_SEPARATOR = re.compile(r"^---[ \t]*(?:#.*)?$", re.MULTILINE)

ObjKey = tuple[Kind, NamespacedName]
Fingerprint = tuple[tuple[str, int, int, int], ...]  # (file, mtime_ns, size, inode) each


@dataclass(frozen=True, slots=True)
class Snapshot:
    objects: Mapping[ObjKey, Mapping[str, Any]]
    errors: tuple[str, ...]


def manifest_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    raise ManifestError(f"{path}: no such file or directory")


def split_documents(text: str) -> list[str]:
    """YAML documents of a stream, split on '---' lines so one broken document does not
    hide the ones after it."""
    return [doc for doc in _DOC_SEPARATOR.split(text) if doc.strip()]


def _objects_of(doc: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(doc, Mapping) and doc.get("kind") == "List":
        for item in doc.get("items") or []:
            yield from _objects_of(item)
    elif isinstance(doc, Mapping):
        yield doc


def _kind_of(obj: Mapping[str, Any]) -> Kind | None:
    for kind in Kind:
        if obj.get("kind") == kind.value and obj.get("apiVersion") in _API_VERSIONS[kind]:
            return kind
    return None


def load(path: Path) -> Snapshot:
    """Every Service and EndpointSlice under `path`, keyed by kind and name."""
    objects: dict[ObjKey, Mapping[str, Any]] = {}
    errors: list[str] = []
    for file in manifest_files(path):
        try:
            text = file.read_text()
        except OSError as exc:
            errors.append(f"{file}: {exc.strerror}")
            continue
        for index, doc_text in enumerate(split_documents(text), start=1):
            try:
                doc = yaml.safe_load(doc_text)
            except yaml.YAMLError as exc:
                reason = str(exc).replace("\n", " ")
                errors.append(f"{file} document {index}: invalid YAML: {reason}")
                continue
            if doc is not None and not isinstance(doc, Mapping):
                errors.append(f"{file} document {index}: not a mapping")
                continue
            for obj in _objects_of(doc):
                kind = _kind_of(obj)
                if kind is None:
                    continue  # other kinds (Deployments, ...) share these files
                key = (kind, object_ref(obj))
                if key in objects:
                    errors.append(
                        f"{file} document {index}: {kind.value} {key[1]} defined twice;"
                        " the later one wins"
                    )
                objects[key] = obj
    return Snapshot(objects, tuple(errors))


def _fingerprint(path: Path) -> Fingerprint:
    prints = []
    try:
        files = manifest_files(path)
    except ManifestError:
        return ()
    for file in files:
        try:
            st = file.stat()
        except OSError:
            continue
        prints.append((str(file), st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(prints)


class ManifestSource:
    """Delivers the objects under PATH to a sink, then every change as files are edited."""

    def __init__(self, path: Path, sink: ObjectSink, *, poll_interval: float = 0.2) -> None:
        self.path = path
        self.sink = sink
        self.poll_interval = poll_interval
        self._current: Mapping[ObjKey, Mapping[str, Any]] = {}
        self._loaded: Fingerprint | None = None  # what the delivered objects were read from
        self._seen: Fingerprint | None = None  # what the previous poll saw
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reloads = 0
        self._errors = 0
        self._progress = SourceProgress()

    def sync_once(self) -> bool:
        """Reload if the files changed and have since stayed unchanged for a poll, and
        deliver the differences; True if it reloaded."""
        fingerprint = _fingerprint(self.path)
        seen, self._seen = self._seen, fingerprint
        if fingerprint == self._loaded or fingerprint != seen:
            return False  # unchanged, or still changing
        first = self._loaded is None
        self._loaded = fingerprint
        started = time.monotonic()
        snapshot = load(self.path)
        self._reloads += 1
        self._errors += len(snapshot.errors)
        for error in snapshot.errors:
            log.error("manifest: %s", error)
        previous, self._current = self._current, snapshot.objects
        for key in sorted(previous.keys() - snapshot.objects.keys(), key=_sort_key):
            self.sink.object_deleted(*key)
        for key, obj in sorted(snapshot.objects.items(), key=lambda item: _sort_key(item[0])):
            if previous.get(key) != obj:
                self.sink.object_updated(key[0], obj)
        lists = self._progress.lists
        if first:  # both kinds come from one read of the files
            seconds = time.monotonic() - started
            lists = {
                kind: ListFigures(sum(1 for k, _ in snapshot.objects if k is kind), seconds)
                for kind in Kind
            }
        self._progress = SourceProgress(lists=lists, errors=snapshot.errors)
        if first:
            for kind in Kind:
                self.sink.initial_list_done(kind)
        return True

    def start(self) -> None:
        if not self.path.exists():
            raise ManifestError(f"{self.path}: no such file or directory")
        while not self.sync_once():  # the initial list, once the files are stable
            time.sleep(self.poll_interval)
        self._thread = threading.Thread(target=self._poll, name="manifests", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                self.sync_once()
            except Exception:  # keep watching: the next edit may fix it
                log.exception("reading manifests under %s failed", self.path)

    def counters(self) -> dict[str, dict[str, int]]:
        """Reloads of the files and documents that failed to parse (for metrics)."""
        return {"manifests": {"reloads": self._reloads, "errors": self._errors}}

    def progress(self) -> SourceProgress:
        """The first read's sizes and time; the errors of the latest read."""
        return self._progress

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _sort_key(key: ObjKey) -> tuple[str, NamespacedName]:
    return key[0].value, key[1]
