"""A source reading Services and EndpointSlices from YAML files, and following edits.

PATH is a file or a directory (searched recursively for *.yaml, *.yml, *.json, skipping
hidden directories such as a ConfigMap volume's ..data). Each file may hold several
documents and `kind: List` wrappers. Files are polled (stat every `poll_interval`), which
also follows ConfigMap volumes that swap a symlink. A change is read once the files have
stayed unchanged for one poll interval, so a file caught half-written (truncated, then
filled) never reads as "every object deleted"; only the files that changed are read again.

Nothing in a file stops the others. A file that cannot be read or is not UTF-8 text, a
document that is not plain YAML data (`ebpflb.k8s.sources.documents`), an object without a
usable name: each is reported to the sink (`object_invalid`, naming the file and
document) and skipped, and the file is read again when it changes. Until it reads
cleanly, the objects it held before stay as they were: a broken edit never deletes.
Whether an object that parses is a valid Service is translation's business (the agent's).

At scale (one file of 20,000 documents): a read parses only the documents whose text is
new (by digest), the source keeps documents' texts rather than their objects, and the
first read hands each object on as soon as it is parsed. Over 400 lines because reading a
file, remembering where each object came from and delivering what changed are one state
machine; split, they would share all of it through arguments.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ebpflb.errors import Fault, InvalidObjectError, ManifestError
from ebpflb.k8s.fields import identify
from ebpflb.k8s.sources.base import Kind, ListFigures, ObjectSink, SourceProgress
from ebpflb.k8s.sources.documents import MANIFEST, parse_document, parser, split_documents
from ebpflb.model import NamespacedName

log = logging.getLogger(__name__)

SUFFIXES = (".yaml", ".yml", ".json")
_API_VERSIONS = {Kind.SERVICE: ("v1",), Kind.ENDPOINT_SLICE: ("discovery.k8s.io/v1",)}

ObjKey = tuple[Kind, NamespacedName]
Stamp = tuple[int, int, int, int]  # mtime_ns, size, inode, ctime_ns (chmod changes ctime)
Fingerprint = tuple[tuple[str, Stamp], ...]
T = TypeVar("T")
Where = tuple[str, bytes, int]  # an object's file, document digest and place in it


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
class DocReading:
    """One document, wherever it stands in its file: its text (to parse it again when one
    of its objects is needed), the keys of its objects in order, and its problems as
    (kind, where inside the document, reason, fault, field)."""

    text: str
    keys: tuple[ObjKey, ...]
    problems: tuple[tuple[str, str, str, Fault, str], ...] = ()


Token = tuple[bytes, int]  # an object's document (its digest) and its place in it


@dataclass(frozen=True, slots=True)
class FileScan:
    """One read of one file, as the source keeps it: which document gives each object (a
    later document wins), the problems, and each document's reading by its digest. The
    objects themselves are not kept: a document's text is 5-10 times smaller than the
    objects parsed from it, and only a changed document's objects are delivered."""

    held: Mapping[ObjKey, Token]
    problems: tuple[InvalidObjectError, ...] = ()
    warnings: tuple[str, ...] = ()
    readings: Mapping[bytes, DocReading] = field(default_factory=dict)
    parsed: int = 0  # documents parsed in this read (the others were read before)

    @property
    def complete(self) -> bool:
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


def digest(doc_text: str) -> bytes:
    """A document's identity between two reads of its file (16 bytes: ~30 ns a document
    against ~20 us to parse it)."""
    return hashlib.blake2b(doc_text.encode(), digest_size=16).digest()


def read_document(doc_text: str) -> tuple[DocReading, list[Mapping[str, Any]]]:
    """One document's Services and EndpointSlices (its reading, and the objects in the
    order of its keys); a problem costs this document only."""
    try:
        found = list(_objects_of(parse_document(doc_text, ""), ""))
    except InvalidObjectError as exc:
        return DocReading(
            doc_text, (), ((exc.kind, exc.ref, exc.reason, exc.fault, exc.field),)
        ), []
    keys: list[ObjKey] = []
    objects: list[Mapping[str, Any]] = []
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
        keys.append((kind, ref))
        objects.append(obj)
    return DocReading(doc_text, tuple(keys), tuple(problems)), objects


def scan_file(
    file: Path,
    previous: Mapping[bytes, DocReading] | None = None,
    on_object: Callable[[Token, ObjKey, Mapping[str, Any]], None] | None = None,
) -> tuple[FileScan, dict[Token, Mapping[str, Any]]]:
    """One file read: its scan, and the objects of the documents parsed now (or, with
    `on_object`, each handed to it as soon as its document is parsed, and none kept).
    Documents `previous` (an earlier scan's readings) holds are not parsed again. A
    problem with one document costs that document only."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        problem = f"cannot be read: {exc.strerror or exc}"
        return FileScan(
            {}, (InvalidObjectError(MANIFEST, str(file), problem, fault=Fault.DECODE),)
        ), {}
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        problem = f"is not UTF-8 text (byte {exc.start} of {len(data)})"
        return FileScan(
            {}, (InvalidObjectError(MANIFEST, str(file), problem, fault=Fault.DECODE),)
        ), {}
    previous = previous or {}
    held: dict[ObjKey, Token] = {}
    fresh: dict[Token, Mapping[str, Any]] = {}
    problems: list[InvalidObjectError] = []
    warnings: list[str] = []
    readings: dict[bytes, DocReading] = {}
    parsed = 0
    for index, doc_text in enumerate(split_documents(text), start=1):
        key = digest(doc_text)
        reading = readings.get(key) or previous.get(key)
        if reading is None:
            reading, objects = read_document(doc_text)
            parsed += 1
            for place, obj in enumerate(objects):
                if on_object is None:
                    fresh[(key, place)] = obj
                else:
                    on_object((key, place), reading.keys[place], obj)
        readings[key] = reading
        where = f"{file} document {index}"
        for kind_name, inside, reason, fault, field_path in reading.problems:
            problems.append(
                InvalidObjectError(kind_name, where + inside, reason, fault=fault, field=field_path)
            )
        for place, obj_key in enumerate(reading.keys):
            if obj_key in held:
                warnings.append(
                    f"{where}: {obj_key[0].value} {obj_key[1]} defined twice; the later one wins"
                )
            held[obj_key] = (key, place)
    return FileScan(held, tuple(problems), tuple(warnings), readings, parsed), fresh


def read_file(file: Path) -> FileContents:
    """The objects in one file; a problem with one document costs that document only."""
    scan, fresh = scan_file(file)
    return FileContents(
        {key: fresh[token] for key, token in scan.held.items()}, scan.problems, scan.warnings
    )


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


def merge(files: Mapping[str, Mapping[ObjKey, T]]) -> tuple[dict[ObjKey, T], list[str]]:
    """The objects of every file, in file order (a later file wins), and the duplicates."""
    objects: dict[ObjKey, T] = {}
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
        self._read: dict[str, tuple[Stamp, FileScan]] = {}  # the last read of each file
        # Where each file's objects are (their documents' digests and places): what the
        # file read last, or while it does not read cleanly, what it held before as well.
        self._held: dict[str, Mapping[ObjKey, Token]] = {}
        self._docs: dict[str, Mapping[bytes, DocReading]] = {}  # the documents _held names
        self._current: dict[ObjKey, Where] = {}  # where the sink's objects came from
        self._fresh: dict[Where, Mapping[str, Any]] = {}  # objects parsed in this reload
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
            self._docs.pop(name, None)
        for name in sorted(stamps):  # merge's order
            if name not in self._read or self._read[name][0] != stamps[name]:
                self._reread(name, stamps[name], stream=first)
        objects, duplicates = merge(
            {name: {key: (name, *token) for key, token in held.items()}
             for name, held in self._held.items()}
        )  # fmt: skip
        for line in sorted(set(duplicates) - self._duplicates):
            log.warning("manifest: %s", line)
        self._duplicates = set(duplicates)
        try:
            self._deliver(objects)
        finally:
            self._fresh.clear()
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

    def _reread(self, name: str, stamp: Stamp, *, stream: bool = False) -> None:
        """Read one file again. `stream` (the first read): each object goes to the sink as
        soon as it is parsed, so that the objects of a large file never all exist at once
        (a later document defining the same object again replaces it in the sink)."""

        def deliver(token: Token, key: ObjKey, obj: Mapping[str, Any]) -> None:
            if _offer(key, self.sink.object_updated, key[0], obj):
                self._current[key] = (name, *token)

        scan, fresh = scan_file(Path(name), self._docs.get(name), deliver if stream else None)
        self._parsed += scan.parsed
        self._read[name] = (stamp, scan)
        self._fresh.update(((name, *token), obj) for token, obj in fresh.items())
        for warning in scan.warnings:
            log.warning("manifest: %s", warning)
        for problem in scan.problems:
            self._errors += 1
            _offer(None, self.sink.object_invalid, problem)
        if scan.complete:
            held, docs = scan.held, scan.readings
        else:  # what the file held before stays until it reads cleanly
            held = {**self._held.get(name, {}), **scan.held}
            docs = {**self._docs.get(name, {}), **scan.readings}
        self._held[name] = held
        used = {token[0] for token in held.values()}
        self._docs[name] = {
            key: doc for key, doc in docs.items() if key in used or key in scan.readings
        }

    def _object(self, where: Where) -> Mapping[str, Any] | None:
        """The object at `where`: parsed in this reload, or parsed again from its document
        (a file's other document that stood before it, an object the sink failed on)."""
        obj = self._fresh.get(where)
        if obj is None:
            name, key, _ = where
            doc = self._docs.get(name, {}).get(key)
            if doc is None:
                return None
            _, objects = read_document(doc.text)
            self._fresh.update(((name, key, place), o) for place, o in enumerate(objects))
            obj = self._fresh.get(where)
        return obj

    def _deliver(self, objects: Mapping[ObjKey, Where]) -> None:
        """Hand the sink what changed (an object whose document changed, or that now comes
        from another document); one object the sink fails on does not stop the rest (it
        stays as the sink last had it, and is offered again at the next reload)."""
        given = dict(self._current)
        for key in sorted(self._current.keys() - objects.keys(), key=_sort_key):
            if _offer(key, self.sink.object_deleted, key[0], key[1]):
                del given[key]
        for key, where in sorted(objects.items(), key=lambda item: _sort_key(item[0])):
            if self._current.get(key) == where:
                continue  # the same document as delivered
            obj = self._object(where)
            if obj is not None and _offer(key, self.sink.object_updated, key[0], obj):
                given[key] = where
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
