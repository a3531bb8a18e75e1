"""A source reading Services and EndpointSlices from YAML files, and following edits.

PATH is a file or a directory (searched recursively for *.yaml, *.yml, *.json, skipping
hidden directories such as a ConfigMap volume's ..data). Each file may hold several
documents and `kind: List` wrappers. Files are polled (stat every `poll_interval`), which
also follows ConfigMap volumes that swap a symlink. A change is read once the files have
stayed unchanged for one poll interval, so a file caught half-written (truncated, then
filled) never reads as "every object deleted"; only the files that changed are read again.

Nothing in a file stops the others. A file that cannot be read or is not UTF-8 text, a
document that is not YAML (or repeats a key, or expands aliases without bound), an object
without a usable name: each is reported to the sink (`object_invalid`, naming the file
and document) and skipped, and the file is read again when it changes. Until it reads
cleanly, the objects it held before stay as they were: a broken edit never deletes.
Whether an object that parses is a valid Service is translation's business (the agent's).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ebpflb.errors import Fault, InvalidObjectError, ManifestError
from ebpflb.fields import identify, show
from ebpflb.model import NamespacedName
from ebpflb.sources.base import Kind, ObjectSink

log = logging.getLogger(__name__)

SUFFIXES = (".yaml", ".yml", ".json")
MANIFEST = "Manifest"  # the kind a document that is not an object yet is reported as
_API_VERSIONS = {Kind.SERVICE: ("v1",), Kind.ENDPOINT_SLICE: ("discovery.k8s.io/v1",)}
_DOC_SEPARATOR = re.compile(r"^---[ \t]*(?:#.*)?$", re.MULTILINE)
# Aliases let a few lines of YAML stand for an exponential tree (a "billion laughs"):
# harmless as shared Python objects, until anything walks it (comparing an object with its
# previous version does). As goyaml does, refuse a document whose aliases multiply it.
_ALIAS_SLACK, _ALIAS_RATIO = 10_000, 10
# Kubernetes objects nest a dozen levels; far deeper ones would only reach Python's
# recursion limit when compared with their previous version.
MAX_DEPTH = 100

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


def split_documents(text: str) -> list[str]:
    """YAML documents of a stream, split on '---' lines so one broken document does not
    hide the ones after it."""
    return [doc for doc in _DOC_SEPARATOR.split(text) if doc.strip()]


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """yaml's safe loader (libyaml's parser where installed), refusing a mapping that repeats
    a key, as kubectl does: which of the two values the author meant is a guess."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base`: the keys it brings may be overridden
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue  # unhashable: the base class refuses it with its own message
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {show(key)}", key_node.start_mark
                )
        return super().construct_mapping(node, deep)  # type: ignore[no-any-return]


def parse_document(text: str, where: str) -> Any:
    """One YAML document as Python values; InvalidObjectError (kind Manifest) if it is not
    one, or repeats a key, or contains itself, or is an alias bomb."""
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # a safe loader: plain data only
    except Exception as exc:  # YAMLError, and the ValueError of a date like 2024-13-45
        reason = " ".join(str(exc).split())
        raise InvalidObjectError(
            MANIFEST, where, f"invalid YAML: {reason}", fault=Fault.PARSE
        ) from None
    shape = _shape(doc)
    if shape is None:
        raise InvalidObjectError(MANIFEST, where, "a YAML alias contains itself", fault=Fault.PARSE)
    total, unique, depth = shape
    if depth > MAX_DEPTH:
        raise InvalidObjectError(
            MANIFEST, where, f"nests {depth} levels deep (at most {MAX_DEPTH})", fault=Fault.PARSE
        )
    if total > _ALIAS_SLACK + _ALIAS_RATIO * unique:
        raise InvalidObjectError(
            MANIFEST,
            where,
            f"YAML aliases expand {unique} arrays and objects to {total}",
            fault=Fault.PARSE,
        )
    return doc


def _shape(doc: Any) -> tuple[int, int, int] | None:
    """(arrays and objects in `doc` counting every reach through an alias, distinct ones,
    nesting depth), or None if one contains itself. Iterative: no recursion limit."""
    shapes: dict[int, tuple[int, int]] = {}  # id -> (expanded count, height)
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(doc, False)]
    while stack:
        node, finished = stack.pop()
        if not isinstance(node, (dict, list)) or (not finished and id(node) in shapes):
            continue
        children = [
            c
            for c in (node.values() if isinstance(node, dict) else node)
            if isinstance(c, (dict, list))
        ]
        if finished:
            on_path.discard(id(node))
            below = [shapes[id(c)] for c in children]
            shapes[id(node)] = (
                1 + sum(count for count, _ in below),
                1 + max((height for _, height in below), default=0),
            )
            continue
        if id(node) in on_path:
            return None
        on_path.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children)
    total, depth = shapes.get(id(doc), (0, 0))
    return total, len(shapes), depth


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

    def sync_once(self) -> bool:
        """Reload if the files changed and have since stayed unchanged for a poll, and
        deliver the differences; True if it reloaded."""
        fingerprint = _fingerprint(self.path)
        seen, self._seen = self._seen, fingerprint
        if fingerprint == self._loaded or fingerprint != seen:
            return False  # unchanged, or still changing
        first = self._loaded is None
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
