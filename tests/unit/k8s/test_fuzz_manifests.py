"""Fuzzing the manifest loader and source: any bytes or text in a file never raise out of
them, and what they deliver is exactly the objects of the documents that parse (known
from how the test wrote them, not from the loader), with a file's last good objects kept
while it does not read cleanly.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import event, given
from hypothesis import strategies as st

from ebpflb.errors import InvalidObjectError
from ebpflb.k8s.sources.base import Kind
from ebpflb.k8s.sources.documents import MAX_DEPTH
from ebpflb.k8s.sources.manifests import ManifestSource, load
from ebpflb.model import NamespacedName
from tests.unit.k8s.fuzzing import fuzz, nested

KINDS = {
    ("v1", "Service"): Kind.SERVICE,
    ("discovery.k8s.io/v1", "EndpointSlice"): Kind.ENDPOINT_SLICE,
}
Key = tuple[Kind, NamespacedName]


@contextmanager
def directory() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ebpflb-fuzz-") as name:
        yield Path(name)


# ---- anything at all ----------------------------------------------------------------------

YAML_PIECES = [
    "---\n",
    "...\n",
    "a: ",
    "- ",
    "? ",
    ": ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "&x ",
    "*x",
    "<<: ",
    "!!binary ",
    "!!set ",
    "!!python/tuple ",
    "'",
    '"',
    "#",
    "\t",
    "  ",
    "\n",
    "2024-13-45",
    "0x1F",
    "1e3",
    "~",
    "null",
    "yes",
    "kind: Service\n",
    "kind: List\n",
    "apiVersion: v1\n",
    "apiVersion: discovery.k8s.io/v1\n",
    "kind: EndpointSlice\n",
    "metadata:\n",
    "  name: x\n",
    "items:\n",
    "metadata: {name: y}\n",
    "\ufeff",
    "\x85",
    "\u2028",
    "\x00",
]
yaml_ish = st.lists(st.sampled_from(YAML_PIECES) | st.text(max_size=4), max_size=40).map("".join)


def check_load(path: Path) -> None:
    snapshot = load(path)
    for (kind, ref), obj in snapshot.objects.items():
        assert isinstance(obj, Mapping) and obj["kind"] == kind.value
        assert isinstance(ref.name, str) and ref.name
    for problem in snapshot.errors:
        assert isinstance(problem, InvalidObjectError)
    event(f"{len(snapshot.objects)} objects, {len(snapshot.errors)} problems")


@st.composite
def spliced(draw: st.DrawFn) -> bytes:
    """YAML-like text with random bytes spliced in (some of them not UTF-8)."""
    data = draw(yaml_ish).encode()
    at = draw(st.integers(0, len(data)))
    return data[:at] + draw(st.binary(max_size=3)) + data[at:]


@fuzz(100, 20_000)
@given(st.binary(max_size=2000) | spliced())
def test_any_bytes_never_escape(data: bytes) -> None:
    with directory() as path:
        (path / "a.yaml").write_bytes(data)
        check_load(path)


@fuzz(150, 20_000)
@given(yaml_ish)
def test_any_yaml_like_text_never_escapes(text: str) -> None:
    with directory() as path:
        (path / "a.yaml").write_text(text)
        check_load(path)


# ---- documents the test knows the meaning of ----------------------------------------------

printable = st.text(st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Zs"]), max_size=8)
plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(10**6), 10**6).map(lambda n: n / 64)  # no exponent: JSON's 1e+16 is a
    # string to YAML 1.1
    | printable,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(printable, inner, max_size=3),
    max_leaves=8,
)


@dataclass
class Doc:
    """One YAML document as written, and what it means."""

    text: str
    objects: list[tuple[Key, dict[str, Any]]] = field(default_factory=list)
    problems: int = 0  # broken, or an object of a known kind without a usable name


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def meaning(obj: dict[str, Any]) -> tuple[Key | None, bool]:
    """(its key if ebpflb takes it, whether it is a problem) by the rules of the API."""
    kind = KINDS.get((obj.get("apiVersion"), obj.get("kind")))  # type: ignore[arg-type]
    if kind is None:
        return None, False
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return None, True
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name or not isinstance(namespace, (str, type(None))):
        return None, True
    return (kind, NamespacedName(namespace or "default", name)), False


def dump(value: Any, *, flow: bool = False) -> str:
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(value, Dumper=dumper, default_flow_style=flow, allow_unicode=True)


# Built once: strategies made inside a composite are validated again at every draw.
_kinds = st.sampled_from([*KINDS, ("apps/v1", "Deployment"), ("v2", "Service")])
_metas = st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b", "c"]) | st.sampled_from(["", 5, None, ["a"]])},
    optional={"namespace": st.sampled_from(["default", "ns", ""]) | st.just(7)},
)
_odd_metas = st.sampled_from([None, "a", [1]])
_bodies = st.dictionaries(
    printable.filter(lambda k: k not in ("kind", "apiVersion", "metadata")),
    plain_values,
    max_size=3,
)
_forms = st.sampled_from(["block", "flow", "json", "list", "broken", "duplicate", "deep", "empty"])
_levels = st.integers(MAX_DEPTH - 5, MAX_DEPTH + 5)


@st.composite
def objects(draw: st.DrawFn) -> dict[str, Any]:
    api_version, kind = draw(_kinds)
    meta = draw(_odd_metas) if draw(st.integers(0, 19)) == 19 else draw(_metas)
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, **draw(_bodies)}


@st.composite
def documents(draw: st.DrawFn) -> Doc:
    obj = draw(objects())
    form = draw(_forms)
    if form == "empty":
        return Doc("# nothing here\n")
    if form == "list":
        items = [obj, draw(objects())]
        doc = Doc(dump({"apiVersion": "v1", "kind": "List", "items": items}))
        for item in items:
            key, problem = meaning(item)
            doc.problems += problem
            if key is not None:
                doc.objects.append((key, item))
        return doc
    if form == "deep":
        levels = draw(_levels)
        obj["deep"] = nested(levels)
    text = json.dumps(obj, ensure_ascii=False) if form == "json" else dump(obj, flow=form == "flow")
    if form == "broken":
        return Doc(text + "\nzz: [unclosed\n", problems=1)
    if form == "duplicate":
        return Doc(text.rstrip("\n") + "\nkind: Again\n", problems=1)
    if depth(obj) > MAX_DEPTH:
        return Doc(text, problems=1)
    key, problem = meaning(obj)
    return Doc(text, [(key, obj)] if key is not None else [], int(problem))


@dataclass
class FileImage:
    """What a file holds: documents, or bytes that are not UTF-8."""

    docs: list[Doc]
    undecodable: bool = False

    def write(self, path: Path) -> None:
        text = "---\n".join(d.text if d.text.endswith("\n") else d.text + "\n" for d in self.docs)
        path.write_bytes(b"\xff\xfe\x80" + text.encode() if self.undecodable else text.encode())

    @property
    def problems(self) -> int:
        return 1 if self.undecodable else sum(d.problems for d in self.docs)

    def objects(self) -> dict[Key, dict[str, Any]]:
        found: dict[Key, dict[str, Any]] = {}
        if not self.undecodable:
            for doc in self.docs:
                found.update(doc.objects)  # a later document wins
        return found


files = st.builds(
    FileImage, st.lists(documents(), max_size=5), st.integers(0, 9).map(lambda n: n == 9)
)


@fuzz(60, 5_000)
@given(st.lists(files, min_size=1, max_size=3))
def test_load_gives_exactly_the_objects_of_the_documents_that_parse(
    images: list[FileImage],
) -> None:
    with directory() as path:
        expected: dict[Key, dict[str, Any]] = {}
        for i, image in enumerate(images):
            image.write(path / f"f{i}.yaml")
            expected.update(image.objects())  # a later file wins
        snapshot = load(path)
    assert dict(snapshot.objects) == expected
    assert len(snapshot.errors) == sum(image.problems for image in images)
    event(f"{len(expected)} objects")


class StateSink:
    """The sink's picture of the world, as object_updated/object_deleted built it."""

    def __init__(self) -> None:
        self.objects: dict[Key, Mapping[str, Any]] = {}
        self.invalid = 0

    def object_updated(self, kind: Kind, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        self.objects[(kind, NamespacedName(meta.get("namespace") or "default", meta["name"]))] = obj

    def object_deleted(self, kind: Kind, ref: NamespacedName) -> None:
        del self.objects[(kind, ref)]

    def initial_list_done(self, kind: Kind) -> None:
        pass

    def object_invalid(self, error: InvalidObjectError) -> None:
        self.invalid += 1


@fuzz(25, 2_000)
@given(st.lists(st.tuples(st.sampled_from(["a.yaml", "b.yaml"]), files), min_size=1, max_size=6))
def test_the_source_follows_edits_and_keeps_what_a_broken_file_held(
    edits: list[tuple[str, FileImage]],
) -> None:
    """Edit after edit: the sink holds each file's objects, or while a file does not read
    cleanly, what it held before plus what it still reads."""
    with directory() as path:
        sink = StateSink()
        source = ManifestSource(path, sink)
        held: dict[str, dict[Key, dict[str, Any]]] = {}
        problems = 0
        for step, (name, image) in enumerate(edits):
            image.write(path / name)
            os.utime(path / name, ns=(step * 10**9, step * 10**9))  # seen as an edit
            source.sync_once()
            assert source.sync_once()
            if image.problems:
                held[name] = {**held.get(name, {}), **image.objects()}
            else:
                held[name] = image.objects()
            problems += image.problems
            expected: dict[Key, dict[str, Any]] = {}
            for file in sorted(held):
                expected.update(held[file])
            assert sink.objects == expected
            assert sink.invalid == problems
