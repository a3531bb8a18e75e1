"""A source reading Services and EndpointSlices from YAML files, and following edits.

PATH is a file or a directory (searched recursively for *.yaml, *.yml, *.json, skipping
hidden directories such as a ConfigMap volume's ..data). Each file may hold several
documents and `kind: List` wrappers. Files are polled (stat every `poll_interval`), which
also follows ConfigMap volumes that swap a symlink. A change is read once the files have
stayed unchanged for one poll interval, so a file caught half-written (truncated, then
filled) never reads as "every object deleted"; only the files that changed are read again.

Nothing in a file stops the others. A file that cannot be read or is not UTF-8 text, a
document that is not plain YAML data (`ebpflb.sources.documents`), an object without a
usable name: each is reported to the sink (`object_invalid`, naming the file and
document) and skipped, and the file is read again when it changes. Until it reads
cleanly, the objects it held before stay as they were: a broken edit never deletes.
Whether an object that parses is a valid Service is translation's business (the agent's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebpflb.errors import Fault, InvalidObjectError, ManifestError
from ebpflb.fields import identify
from ebpflb.model import NamespacedName
from ebpflb.sources.base import Kind, ListFigures, ObjectSink, SourceProgress
from ebpflb.sources.documents import MANIFEST, parse_document, split_documents

log = logging.getLogger(__name__)

SUFFIXES = (".yaml", ".yml", ".json")
_API_VERSIONS = {Kind.SERVICE: ("v1",), Kind.ENDPOINT_SLICE: ("discovery.k8s.io/v1",)}

ObjKey = tuple[Kind, NamespacedName]
Stamp = tuple[int, int, int, int]  # mtime_ns, size, inode, ctime_ns (chmod changes ctime)
Fingerprint = tuple[tuple[str, Stamp], ...]


@dataclass(frozen=True, slots=True)
class FileContents:
    """What one read of one file found: its objects (a later document wins) and problems."""

    objects: Mapping[ObjKey, Mapping[str, Any]]
    problems: tuple[InvalidObjectError, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """Every document was read: the objects are all the file holds."""
        return not self.problems


@dataclass(frozen=True, slots=True)
class Snapshot:
    objects: Mapping[ObjKey, Mapping[str, Any]]
    errors: tuple[InvalidObjectError, ...]
    warnings: tuple[str, ...] = ()


def manifest_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(
            p
            for p in path.rglob("*")
            if p.suffix in SUFFIXES
            and not any(part.startswith(".") for part in p.relative_to(path).parts[:-1])
            and p.is_file()
        )
    raise ManifestError(f"{path}: no such file or directory")


def read_file(file: Path) -> FileContents:
    """The objects in one file; a problem with one document costs that document only."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        problem = f"cannot be read: {exc.strerror or exc}"
        return FileContents(
            {}, (InvalidObjectError(MANIFEST, str(file), problem, fault=Fault.DECODE),)
        )
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        problem = f"is not UTF-8 text (byte {exc.start} of {len(data)})"
        return FileContents(
            {}, (InvalidObjectError(MANIFEST, str(file), problem, fault=Fault.DECODE),)
        )
    objects: dict[ObjKey, Mapping[str, Any]] = {}
    problems: list[InvalidObjectError] = []
    warnings: list[str] = []
    for index, doc_text in enumerate(split_documents(text), start=1):
        where = f"{file} document {index}"
        try:
            found = list(_objects_of(parse_document(doc_text, where), where))
        except InvalidObjectError as exc:
            problems.append(exc)
            continue
        for obj in found:
            kind = _kind_of(obj)
            if kind is None:
                continue  # other kinds (Deployments, ...) share these files
            try:
                ref, _, _ = identify(obj, kind.value)
            except InvalidObjectError as exc:  # nameless: cannot even be told apart
                problems.append(
                    InvalidObjectError(
                        kind.value, where, exc.reason, fault=exc.fault, field=exc.field
                    )
                )
                continue
            if (kind, ref) in objects:
                warnings.append(f"{where}: {kind.value} {ref} defined twice; the later one wins")
            objects[(kind, ref)] = obj
    return FileContents(objects, tuple(problems), tuple(warnings))


def _objects_of(doc: Any, where: str) -> Iterator[Mapping[str, Any]]:
    if doc is None:
        return  # an empty document
    if not isinstance(doc, Mapping):
        raise InvalidObjectError(
            MANIFEST, where, f"is a {type(doc).__name__}, not an object", fault=Fault.TYPE
        )
    if doc.get("kind") != "List":
        yield doc
        return
    items = doc.get("items") or []
    if not isinstance(items, list):
        raise InvalidObjectError(MANIFEST, where, "List items is not an array", fault=Fault.TYPE)
    for i, item in enumerate(items):
        yield from _objects_of(item, f"{where} items[{i}]")


def _kind_of(obj: Mapping[str, Any]) -> Kind | None:
    for kind in Kind:
        if obj.get("kind") == kind.value and obj.get("apiVersion") in _API_VERSIONS[kind]:
            return kind
    return None


def merge(
    files: Mapping[str, Mapping[ObjKey, Mapping[str, Any]]],
) -> tuple[dict[ObjKey, Mapping[str, Any]], list[str]]:
    """The objects of every file, in file order (a later file wins), and the duplicates."""
    objects: dict[ObjKey, Mapping[str, Any]] = {}
    duplicates = []
    for name in sorted(files):
        for key, obj in files[name].items():
            if key in objects:
                duplicates.append(
                    f"{name}: {key[0].value} {key[1]} defined twice; the later one wins"
                )
            objects[key] = obj
    return objects, duplicates


def load(path: Path) -> Snapshot:
    """Every Service and EndpointSlice under `path`, keyed by kind and name (one read)."""
    contents = {str(file): read_file(file) for file in manifest_files(path)}
    objects, duplicates = merge({name: c.objects for name, c in contents.items()})
    return Snapshot(
        objects,
        tuple(p for c in contents.values() for p in c.problems),
        tuple(w for c in contents.values() for w in c.warnings) + tuple(duplicates),
    )


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
        prints.append((str(file), (st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns)))
    return tuple(prints)


class ManifestSource:
    """Delivers the objects under PATH to a sink, then every change as files are edited."""

    def __init__(self, path: Path, sink: ObjectSink, *, poll_interval: float = 0.2) -> None:
        self.path = path
        self.sink = sink
        self.poll_interval = poll_interval
        self._read: dict[str, tuple[Stamp, FileContents]] = {}  # the last read of each file
        self._held: dict[str, Mapping[ObjKey, Mapping[str, Any]]] = {}  # what each file gives
        self._current: dict[ObjKey, Mapping[str, Any]] = {}  # what the sink was given
        self._duplicates: set[str] = set()
        self._loaded: Fingerprint | None = None  # what the delivered objects were read from
        self._seen: Fingerprint | None = None  # what the previous poll saw
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reloads = 0
        self._errors = 0
        self._lists: Mapping[Kind, ListFigures] = {}
        self._progress = SourceProgress()

    def sync_once(self) -> bool:
        """Reload if the files changed and have since stayed unchanged for a poll, and
        deliver the differences; True if it reloaded."""
        fingerprint = _fingerprint(self.path)
        seen, self._seen = self._seen, fingerprint
        if fingerprint == self._loaded or fingerprint != seen:
            return False  # unchanged, or still changing
        first = self._loaded is None
        started = time.monotonic()
        stamps = dict(fingerprint)
        for name in self._read.keys() - stamps.keys():  # removed: its objects go too
            del self._read[name]
            self._held.pop(name, None)
        for name, stamp in stamps.items():
            if name not in self._read or self._read[name][0] != stamp:
                self._reread(name, stamp)
        objects, duplicates = merge(self._held)
        for line in sorted(set(duplicates) - self._duplicates):
            log.warning("manifest: %s", line)
        self._duplicates = set(duplicates)
        self._deliver(objects)
        if first:  # both kinds come from one read of the files
            seconds = time.monotonic() - started
            self._lists = {
                kind: ListFigures(sum(1 for k, _ in objects if k is kind), seconds) for kind in Kind
            }
        self._reloads += 1
        # Only now: a reload that failed part-way is done again at the next poll.
        self._loaded = fingerprint
        if first:
            for kind in Kind:
                self.sink.initial_list_done(kind)
        return True

    def _reread(self, name: str, stamp: Stamp) -> None:
        contents = read_file(Path(name))
        self._read[name] = (stamp, contents)
        for warning in contents.warnings:
            log.warning("manifest: %s", warning)
        for problem in contents.problems:
            self._errors += 1
            _offer(None, self.sink.object_invalid, problem)
        if contents.complete:
            self._held[name] = contents.objects
        else:  # what the file held before stays until it reads cleanly
            self._held[name] = {**self._held.get(name, {}), **contents.objects}

    def _deliver(self, objects: Mapping[ObjKey, Mapping[str, Any]]) -> None:
        """Hand the sink what changed; one object the sink fails on does not stop the rest
        (it stays as the sink last had it, and is offered again at the next reload)."""
        given = dict(self._current)
        for key in sorted(self._current.keys() - objects.keys(), key=_sort_key):
            if _offer(key, self.sink.object_deleted, key[0], key[1]):
                del given[key]
        for key, obj in sorted(objects.items(), key=lambda item: _sort_key(item[0])):
            if self._current.get(key) != obj and _offer(key, self.sink.object_updated, key[0], obj):
                given[key] = obj
        self._current = given

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
        """Reloads of the files and problems found in them (for metrics)."""
        return {"manifests": {"reloads": self._reloads, "errors": self._errors}}

    def progress(self) -> SourceProgress:
        """The first read's sizes and time; what the files hold now that cannot be read."""
        errors = tuple(
            f"{p.ref}: {p.reason}" if p.kind == MANIFEST else str(p)
            for _, contents in list(self._read.values())  # the poll thread may be replacing one
            for p in contents.problems
        )
        return SourceProgress(lists=self._lists, errors=errors)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _offer(key: ObjKey | None, deliver: Callable[..., None], *args: Any) -> bool:
    """deliver(*args); False (logged) if the sink raised: a bug there, but one object's."""
    try:
        deliver(*args)
    except Exception:
        what = f"{key[0].value} {key[1]}" if key else "a manifest problem"
        log.exception("manifest: the agent failed on %s", what)
        return False
    return True


def _sort_key(key: ObjKey) -> tuple[str, NamespacedName]:
    return key[0].value, key[1]
