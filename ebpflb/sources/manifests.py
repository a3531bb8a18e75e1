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

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebpflb.errors import Fault, InvalidObjectError, ManifestError
from ebpflb.fields import identify
from ebpflb.model import NamespacedName
from ebpflb.sources.base import Kind, ListFigures, ObjectSink, SourceProgress
from ebpflb.sources.documents import MANIFEST, parse_document, parser, split_documents

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
    # Each document's reading by its digest, for the next read of the file.
    readings: Mapping[bytes, DocReading] = field(default_factory=dict)
    parsed: int = 0  # documents parsed in this read (the others were read before)

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


@dataclass(frozen=True, slots=True)
class DocReading:
    """What one document gives, wherever it stands in its file: its objects, and its
    problems as (kind, where inside the document, reason, fault, field)."""

    objects: tuple[tuple[ObjKey, Mapping[str, Any]], ...]
    problems: tuple[tuple[str, str, str, Fault, str], ...] = ()


def digest(doc_text: str) -> bytes:
    """A document's identity between two reads of its file (16 bytes: ~30 ns a document
    against ~20 us to parse it)."""
    return hashlib.blake2b(doc_text.encode(), digest_size=16).digest()


def read_document(doc_text: str) -> DocReading:
    """One document's Services and EndpointSlices; a problem costs this document only."""
    try:
        found = list(_objects_of(parse_document(doc_text, ""), ""))
    except InvalidObjectError as exc:
        return DocReading((), ((exc.kind, exc.ref, exc.reason, exc.fault, exc.field),))
    objects: list[tuple[ObjKey, Mapping[str, Any]]] = []
    problems = []
    for obj in found:
        kind = _kind_of(obj)
        if kind is None:
            continue  # other kinds (Deployments, ...) share these files
        try:
            ref, _, _ = identify(obj, kind.value)
        except InvalidObjectError as exc:  # nameless: cannot even be told apart
            problems.append((kind.value, "", exc.reason, exc.fault, exc.field))
            continue
        objects.append(((kind, ref), obj))
    return DocReading(tuple(objects), tuple(problems))


def read_file(file: Path, previous: Mapping[bytes, DocReading] | None = None) -> FileContents:
    """The objects in one file; a problem with one document costs that document only.
    Documents `previous` (an earlier read's `readings`) holds are not parsed again."""
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
    previous = previous or {}
    objects: dict[ObjKey, Mapping[str, Any]] = {}
    problems: list[InvalidObjectError] = []
    warnings: list[str] = []
    readings: dict[bytes, DocReading] = {}
    parsed = 0
    for index, doc_text in enumerate(split_documents(text), start=1):
        key = digest(doc_text)
        reading = readings.get(key) or previous.get(key)
        if reading is None:
            reading = read_document(doc_text)
            parsed += 1
        readings[key] = reading
        where = f"{file} document {index}"
        for kind_name, inside, reason, fault, field_path in reading.problems:
            problems.append(
                InvalidObjectError(kind_name, where + inside, reason, fault=fault, field=field_path)
            )
        for obj_key, obj in reading.objects:
            if obj_key in objects:
                warnings.append(
                    f"{where}: {obj_key[0].value} {obj_key[1]} defined twice; the later one wins"
                )
            objects[obj_key] = obj
    return FileContents(objects, tuple(problems), tuple(warnings), readings, parsed)


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


def _settled(fingerprint: Fingerprint, interval: float, now_ns: int) -> bool:
    """Every file was last written at least `interval` ago (what two polls would show)."""
    newest = max((stamp[0] for _, stamp in fingerprint), default=now_ns)
    return now_ns - newest >= interval * 1e9


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
        self._listed = threading.Event()  # the first read was delivered
        self._thread: threading.Thread | None = None
        self._reloads = 0
        self._errors = 0
        self._parsed = 0  # documents parsed (an edit parses only the documents it changed)
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
            self._listed.set()
        return True

    def wait_listed(self, timeout: float) -> bool:
        """Whether the first read is delivered (waiting up to `timeout` seconds)."""
        return self._listed.wait(timeout)

    def _reread(self, name: str, stamp: Stamp) -> None:
        before = self._read.get(name)
        contents = read_file(Path(name), before[1].readings if before else None)
        self._parsed += contents.parsed
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
            held = self._current.get(key)
            if held is obj or held == obj:  # the same document, not parsed again: same object
                continue
            if _offer(key, self.sink.object_updated, key[0], obj):
                given[key] = obj
        self._current = given

    def start(self) -> None:
        """Read the files and follow them in a thread of their own, so the agent compiles
        its programs meanwhile (as the API source lists)."""
        if not self.path.exists():
            raise ManifestError(f"{self.path}: no such file or directory")
        name, missing = parser()
        if missing:
            log.warning("manifest documents are parsed by %s (slower): %s", name, missing)
        else:
            log.info("manifest documents are parsed by %s", name)
        fingerprint = _fingerprint(self.path)
        if _settled(fingerprint, self.poll_interval, time.time_ns()):
            self._seen = fingerprint  # unchanged for a poll already: read at once
        self._thread = threading.Thread(target=self._poll, name="manifests", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():  # the initial list, once the files are stable
            try:
                if self.sync_once():
                    break
            except Exception:
                log.exception("reading manifests under %s failed", self.path)
            self._stop.wait(self.poll_interval)
        while not self._stop.wait(self.poll_interval):
            try:
                self.sync_once()
            except Exception:  # keep watching: the next edit may fix it
                log.exception("reading manifests under %s failed", self.path)

    def counters(self) -> dict[str, dict[str, int]]:
        """Reloads of the files and problems found in them (for metrics)."""
        return {
            "manifests": {
                "reloads": self._reloads,
                "errors": self._errors,
                "documents_parsed": self._parsed,
            }
        }

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
