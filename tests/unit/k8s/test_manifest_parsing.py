"""Manifest parsing at speed: rapidyaml where it reads a document as PyYAML would (and
PyYAML otherwise), documents split and identified by digest, and a file read again
parsing only the documents that changed."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ebpflb.errors import Fault, InvalidObjectError
from ebpflb.k8s.sources import documents
from ebpflb.k8s.sources.base import Kind
from ebpflb.k8s.sources.documents import PYYAML, fast_read, parse_document, split_documents
from ebpflb.k8s.sources.manifests import ManifestSource, digest, scan_file
from tests.unit.k8s.fuzzing import fuzz
from tests.unit.k8s.test_fuzz_manifests import dump, plain_values, yaml_ish
from tests.unit.k8s.test_manifests import SERVICE, SLICE, Sink, sync

pytestmark = pytest.mark.skipif(
    bool(documents.parser()[1]), reason="rapidyaml is a dependency: it should be installed"
)


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (True == 1 is not enough here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def pyyaml(text: str) -> Any:
    return documents._pyyaml_read(text, "x")


def check_same_as_pyyaml(text: str) -> bool:
    """fast_read either declines or reads `text` exactly as PyYAML does (which must not
    refuse it); True if it read it."""
    fast = fast_read(text)
    if fast is PYYAML:
        return False
    try:
        slow = pyyaml(text)
    except InvalidObjectError as exc:
        raise AssertionError(f"rapidyaml read {text!r} as {fast!r}; PyYAML: {exc}") from exc
    assert same(fast, slow), f"{text!r}: rapidyaml {fast!r}, PyYAML {slow!r}"
    return True


PIECES = [
    *("a: ", "- ", "b:\n  ", "\n", "  ", "'", '"', "x", "1", "0", ".", "-", "+", ":", "#"),
    *("e", "_", "\\", "|", ">", "|-", ">+", "?", "[", "]", "{", "}", ",", "y", "~", "True"),
    *("\t", "\r", "\r\n", "\x85", "\u2028", "\ufeff", "...", "--- ", "%", "0x", "1e3", " #c"),
    *("\\n", "\\t", "\\x41", "\\u00e9", "\\ud83d", "\\\n", "-0", "12:30", "2024-01-01", "="),
    *("<<", "[]", "{}", "@", "`", ".inf", "NaN", "0o7", "1_000", "null", "off", "nan", "inf"),
    *('"yes"', "'80'", '"2024-01-01"', '"12:30"', "'~'", '"true"', "'.inf'", '""', "''"),
    *("a: '1'\n", 'b: "1"\n', "c: 1\n", "- '07'\n", "'0x1F': 1\n", "  ", "e: |-\n  yes\n"),
]
fragments = st.lists(st.sampled_from(PIECES) | st.text(max_size=3), max_size=30).map("".join)


@fuzz(400, 50_000)
@given(fragments | yaml_ish)
def test_rapidyaml_reads_any_text_as_pyyaml_or_leaves_it_to_pyyaml(text: str) -> None:
    for doc in split_documents(text) or [text]:
        check_same_as_pyyaml(doc)


@fuzz(150, 20_000)
@given(
    st.dictionaries(st.text(max_size=6), plain_values, max_size=4),
    st.sampled_from(["block", "flow", "json"]),
)
def test_rapidyaml_reads_dumped_values_as_pyyaml(obj: dict[str, Any], form: str) -> None:
    import json

    text = json.dumps(obj, ensure_ascii=False) if form == "json" else dump(obj, flow=form == "flow")
    check_same_as_pyyaml(text)


def test_generated_services_and_slices_take_the_fast_path() -> None:
    from lab.bench.manifests import manifest_text
    from lab.bench.scenario import bench_services, objects

    services = bench_services(50, 3)
    docs = split_documents(manifest_text(services))
    assert [fast_read(doc) for doc in docs] == list(objects(services))


@pytest.mark.parametrize(
    "text",
    [
        "a: yes\n",  # YAML 1.1's bool
        "a: 0x1F\n",
        "a: 010\n",  # octal 8 for PyYAML
        "a: 0o7\n",  # YAML 1.2's octal: a string for PyYAML, 7 once yamllint is imported
        "a: 1_000\n",
        "a: 1e3\n",  # a string for PyYAML, a number for rapidyaml
        "a: 1.5\n",  # floats: PyYAML decides
        "a: 80\nb: '80'\n",  # "80" in the JSON: quoted, but 80 stands unquoted too
        "a: ~\n",
        "a: 2024-01-01\n",
        "a: &x 1\nb: *x\n",
        "a: !!str 5\n",
        "a: [x, y]\n",  # flow collections
        "a: 1\na: 2\n",  # duplicate key: PyYAML refuses it, with its message
        "a: `x\n",  # PyYAML refuses a reserved indicator
        "a:\n\tb: 1\n",
        "%YAML 1.1\n---\na: 1\n",
        "a: [1,2\n",  # broken: rapidyaml prints its error, PyYAML words the one reported
    ],
)
def test_documents_rapidyaml_might_read_otherwise_go_to_pyyaml(text: str) -> None:
    assert fast_read(text) is PYYAML


def test_plain_block_documents_and_json_take_the_fast_path() -> None:
    assert fast_read(SLICE.replace("[", "\n  - ").replace("]", "")) is PYYAML  # still flow
    block = "a:\n  b: [] \n  c: {}\n  d:\n  - 1\n  - x\n  e: true\n  f: null\n  g: |\n    t\n"
    assert fast_read(block) == {"a": {"b": [], "c": {}, "d": [1, "x"], "e": True, "f": None,
                                      "g": "t\n"}}  # fmt: skip
    assert fast_read('{"a": [1, "2", true, null]}') == {"a": [1, "2", True, None]}
    assert fast_read("# only a comment\n") is PYYAML  # which reads None


def test_strings_quoted_as_kubectl_quotes_them_take_the_fast_path() -> None:
    text = (
        'apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  resourceVersion: "12345"\n'
        '  creationTimestamp: "2024-05-01T10:00:00Z"\n  annotations:\n'
        '    service.beta.kubernetes.io/aws-load-balancer-internal: "true"\n'
        "    x: '0x1F'\nspec:\n  ports:\n  - port: 80\n    targetPort: \"8080\"\n"
    )
    assert check_same_as_pyyaml(text)
    assert fast_read(text)["metadata"]["resourceVersion"] == "12345"


def test_without_rapidyaml_pyyaml_reads_everything_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setattr(documents, "_RYML_ERROR", "rapidyaml is not installed (test)")
    name, why = documents.parser()
    assert name.startswith("PyYAML") and why == "rapidyaml is not installed (test)"
    assert parse_document("a: 1\n", "x") == {"a": 1}
    (tmp_path / "a.yaml").write_text(SERVICE)
    source = ManifestSource(tmp_path, Sink(), poll_interval=0.01)
    with caplog.at_level("WARNING"):
        source.start()
        assert source.wait_listed(10)
    source.stop()
    assert "rapidyaml is not installed (test)" in caplog.text


# ---- splitting, digests, reading only what changed ---------------------------------------


def test_split_on_separator_lines_only() -> None:
    text = "a: 1\n---\nb: '---'\n--- # c\n---\n\nc: |\n  ---x\n---   \n"
    assert split_documents(text) == ["a: 1\n", "b: '---'\n", "\nc: |\n  ---x\n"]


def service(name: str, ip: str) -> str:
    return SERVICE.replace("name: web", f"name: {name}").replace("10.96.0.10", ip)


def test_a_read_again_parses_only_changed_and_added_documents(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    docs = [service(f"s{i}", f"10.96.0.{i + 1}") for i in range(5)]
    path.write_text("---\n".join(docs))
    first, fresh = scan_file(path)
    assert first.parsed == 5 and len(first.held) == 5 and len(fresh) == 5
    # s1 changed, s3 removed, s9 added, two documents swapped places: two parsed.
    docs[1] = service("s1", "10.96.1.1")
    del docs[3]
    docs.append(service("s9", "10.96.0.9"))
    docs[0], docs[2] = docs[2], docs[0]
    path.write_text("---\n".join(docs))
    second, fresh = scan_file(path, first.readings)
    assert second.parsed == 2
    assert {ref.name for _, ref in second.held} == {"s0", "s1", "s2", "s4", "s9"}
    # Only the parsed documents' objects are given; the others are where they were.
    assert sorted(obj["metadata"]["name"] for obj in fresh.values()) == ["s1", "s9"]
    assert [obj["spec"]["clusterIP"] for obj in fresh.values()] == ["10.96.1.1", "10.96.0.9"]
    for key, token in second.held.items():
        if key[1].name in ("s0", "s2", "s4"):
            assert token == first.held[key]
    assert set(second.readings) == {digest(d) for d in docs}


def test_a_malformed_document_reread_names_its_new_place(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    broken = "kind: [unclosed\n"
    path.write_text(f"{SERVICE}---\n{broken}")
    first, _ = scan_file(path)
    (problem,) = first.problems
    assert f"{path} document 2: invalid YAML" in str(problem)
    path.write_text(f"{SLICE}---\n{SERVICE}---\n{broken}")  # moved: not parsed again
    second, _ = scan_file(path, first.readings)
    assert second.parsed == 1  # the slice
    (problem,) = second.problems
    assert str(problem).startswith(f"Manifest {path} document 3: invalid YAML")
    assert problem.fault is Fault.PARSE


def test_the_source_delivers_one_edited_document_of_many(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    docs = [service(f"s{i:03d}", f"10.96.{i // 250}.{i % 250 + 1}") for i in range(300)]
    path.write_text("---\n".join(docs))
    sink = Sink()
    source = ManifestSource(path, sink)
    source.sync_once()
    assert source.sync_once()
    parsed = source.counters()["manifests"]["documents_parsed"]
    assert parsed == 300
    sink.events.clear()
    docs[150] = service("s150", "10.96.9.9")
    docs[151] = "kind: [unclosed\n"  # malformed: counted, its Service kept
    path.write_text("---\n".join(docs))
    assert sync(source, path)
    assert sink.events == [("update", Kind.SERVICE, "s150")]
    assert [str(p).split(": ")[0] for p in sink.invalid] == [f"Manifest {path} document 152"]
    assert source.counters()["manifests"]["documents_parsed"] == parsed + 2
    docs[151] = service("s151", "10.96.9.10")
    del docs[10]  # removed
    path.write_text("---\n".join(docs))
    sink.events.clear()
    assert sync(source, path)
    assert sink.events == [
        ("delete", Kind.SERVICE, "s010"),
        ("update", Kind.SERVICE, "s151"),
    ]


def test_files_unchanged_for_a_poll_are_read_at_start_without_waiting(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text(SERVICE)
    old = time.time_ns() - 60 * 10**9  # written a minute ago
    os.utime(path, ns=(old, old))
    source = ManifestSource(tmp_path, Sink(), poll_interval=30)  # a second poll: 30 s later
    source.start()
    try:
        assert source.wait_listed(5)
    finally:
        source.stop()


def test_a_file_changed_just_now_is_read_when_it_has_stayed_unchanged(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(SERVICE)  # now
    source = ManifestSource(tmp_path, Sink(), poll_interval=0.3)
    started = time.monotonic()
    source.start()
    try:
        assert source.wait_listed(5)
        assert time.monotonic() - started >= 0.3
    finally:
        source.stop()


def test_an_object_kept_from_a_broken_file_is_delivered_when_it_wins_again(
    tmp_path: Path,
) -> None:
    """The source keeps documents' texts, not their objects: an object a broken file still
    holds (its document gone in the broken edit) is parsed again from the kept text when
    the later file stops defining it."""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(service("web", "10.96.0.1"))
    b.write_text(service("web", "10.96.0.2"))  # the later file wins
    sink = Sink()
    source = ManifestSource(tmp_path, sink)
    source.sync_once()
    assert source.sync_once()
    a.write_text("kind: [unclosed\n")  # broken: web from a.yaml is kept
    assert sync(source, a)
    b.write_text(SLICE)  # b.yaml no longer defines web: a.yaml's kept web wins
    sink.events.clear()

    delivered: list[str] = []
    real = sink.object_updated

    def updated(kind: Kind, obj: Any) -> None:
        delivered.append(obj.get("spec", {}).get("clusterIP", ""))
        real(kind, obj)

    sink.object_updated = updated  # type: ignore[method-assign]
    assert sync(source, b)
    assert ("update", Kind.SERVICE, "web") in sink.events
    assert "10.96.0.1" in delivered
