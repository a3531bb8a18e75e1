"""YAML documents as plain data, strictly: what the manifest source reads files with.

A stream is split on '---' lines first, so one broken document does not hide the ones
after it. A document is refused (InvalidObjectError, kind Manifest, reason parse) when it
is not YAML, when a mapping repeats a key (kubectl refuses that too: which value was
meant is a guess), when an alias makes it contain itself, when aliases multiply it (a
"billion laughs": harmless as shared Python objects until something walks the tree, as
comparing an object with its previous version does), or when it nests deeper than any
Kubernetes object (which would reach Python's recursion limit in that comparison).

Parsing is PyYAML's (YAML 1.1, as kubectl's sigs.k8s.io/yaml reads it) in meaning, but
most documents are read by rapidyaml (C++), which is 5-10 times faster: it parses, writes
JSON, and the json module builds the values (PyYAML builds them in Python, ~110 us a
document with libyaml). Where rapidyaml's reading could differ from PyYAML's, PyYAML reads
the document instead (`fast_read` says when): anchors, aliases, tags, directives,
characters PyYAML refuses, a stream of several documents, a duplicated key, a float, and
any string PyYAML would take for another type if it were unquoted (yes, ~, 0x1F, 1_000,
2024-01-01, "80", ...), since the JSON no longer says whether it was quoted. Those are rare
in Services and EndpointSlices, and PyYAML also words every error message. Without
rapidyaml (not installed, or an API this module does not know), PyYAML reads everything
and `parser()` says why.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from ebpflb.errors import Fault, InvalidObjectError
from ebpflb.k8s.fields import show

MANIFEST = "Manifest"  # the kind a document that is not an object yet is reported as
MAX_DEPTH = 100  # Kubernetes objects nest a dozen levels
_DOC_SEPARATOR = re.compile(r"^---[ \t]*(?:#.*)?(?:\n|$)", re.MULTILINE)  # with its line break
_ALIAS_SLACK, _ALIAS_RATIO = 10_000, 10  # as goyaml: aliases may not multiply a document


try:
    import ryml  # rapidyaml

    _RYML_ERROR = ""
    _RYML_VERSION = str(getattr(ryml, "__version__", "") or getattr(ryml, "version", ""))
    for _name in ("parse_in_arena", "emit_json", "Tree"):
        if not hasattr(ryml, _name):
            _RYML_ERROR = f"rapidyaml {_RYML_VERSION} has no ryml.{_name}"
except ImportError as exc:  # an optional speed-up: PyYAML reads everything without it
    _RYML_ERROR = f"rapidyaml is not installed ({exc})"
    _RYML_VERSION = ""


def parser() -> tuple[str, str]:
    """(what parses manifest documents, why not rapidyaml: "" when it does)."""
    pyyaml = "PyYAML with libyaml" if hasattr(yaml, "CSafeLoader") else "PyYAML (pure Python)"
    if _RYML_ERROR:
        return pyyaml, _RYML_ERROR
    return f"rapidyaml {_RYML_VERSION}, {pyyaml} where they could differ", ""


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
    if not _RYML_ERROR:
        doc = fast_read(text)
        if doc is not PYYAML:
            return doc
    return _pyyaml_read(text, where)


class _Fallback:
    def __repr__(self) -> str:
        return "PYYAML"


PYYAML: Any = _Fallback()
"""fast_read's answer for a document that PyYAML must read."""

# What rapidyaml reads differently or not at all: anchors, aliases, tags (&, *, !), the
# reserved indicators PyYAML refuses (@, `), tabs (PyYAML refuses more of them), YAML 1.1's
# other line breaks (\r\n is read as \n), a character PyYAML refuses; and, at the start of a
# line, a directive (%) or a document marker. Anywhere in the text, even quoted: then
# PyYAML reads it, which is only slower. Most manifests are ASCII: a short class for them.
_PYYAML_BREAKS = "\t\r\x85\u2028\u2029\ufeff"
_REFUSED = "[^\x0a\x0d\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
_NOT_FAST = re.compile(f"[&*!@`{_PYYAML_BREAKS}]|{_REFUSED}")
_NOT_FAST_ASCII = re.compile("[&*!@`\t\r\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_LINE_STARTS = ("%", "---", "...")
# In JSON text, where the indicators are inside strings.
_NOT_JSON = re.compile(f"[{_PYYAML_BREAKS}]|{_REFUSED}")
# A JSON string PyYAML could resolve to another type, had it been a plain scalar: a superset
# of yaml.resolver's implicit resolvers (bool, null, int, float, timestamp, merge, value).
# A JSON escape (\t in a timestamp) cannot hide one: the date alone matches.
_UNQUOTED_TYPES = (
    r"[yYnN]|yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF"
    r"|~|null|Null|NULL|"
    # 0o: YAML 1.2's octal, not PyYAML's; but a resolver some library adds to PyYAML at
    # import (yamllint does) reads it, so it is never the fast path's to decide.
    r"|[-+]?(?:0[box]?[0-9a-fA-F_]+|[0-9][0-9_]*(?::[0-5]?[0-9])*)"
    r"|[-+]?(?:[0-9][0-9_]*(?::[0-5]?[0-9])*)?\.[0-9_]*(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
    r'|[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?[^"]*'
    r"|<<|="
)
# (The lookahead skips most strings at once: 3 times faster.)
_AMBIGUOUS = re.compile(f'"(?=[-+.0-9~<=yYnNtTfFoO"])({_UNQUOTED_TYPES})"')


def _quoted_in(text: str, content: str) -> bool:
    """Whether every string `content` in the JSON was quoted in the YAML `text`: each of
    its occurrences there stands between quotes. A plain scalar's text is in the document
    as it is, between neither quote, unless it was folded over lines (then it holds a
    space) or rapidyaml rewrote it (nan, inf: always left to PyYAML), or the JSON escapes
    a character of it. kubectl's output quotes its numeric strings and timestamps
    (resourceVersion: "12345"), annotations their "true": those are read fast. An empty
    string is left to PyYAML (an empty key reads as null there)."""
    low = content.lower()
    if not content or " " in content or "\\" in content or "nan" in low or "inf" in low:
        return False
    return text.count(content) == text.count(f'"{content}"') + text.count(f"'{content}'")


# Flow collections other than an empty [] or {}: rapidyaml takes some text PyYAML refuses
# there for plain scalars (a stray "]"). Generated manifests are in block style.
_FLOW = re.compile(r"\[(?!\])|\{(?!\})|(?<!\[)\]|(?<!\{)\}")
# JSON's \uD83D\uDE00 is one character, PyYAML's two.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB]")


class _Refused(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise _Refused("duplicate key")  # PyYAML words the error
    return found


def _refuse(_text: str) -> Any:
    raise _Refused("not a JSON integer, string, boolean or null")


_JSON = json.JSONDecoder(object_pairs_hook=_pairs, parse_float=_refuse, parse_constant=_refuse)


def fast_read(text: str) -> Any:
    """The document read by rapidyaml, or PYYAML where PyYAML must read it (see the
    module's docstring), including every document rapidyaml finds an error in."""
    if text.lstrip()[:1] in ("{", "[") and not _NOT_JSON.search(text):  # JSON is YAML
        doc = _json(text)
        if doc is not PYYAML:
            return doc
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    if (_NOT_FAST_ASCII if text.isascii() else _NOT_FAST).search(text):
        return PYYAML
    if any(text.startswith(m) or f"\n{m}" in text for m in _LINE_STARTS):
        return PYYAML
    if ("[" in text or "{" in text or "]" in text or "}" in text) and _FLOW.search(text):
        return PYYAML
    try:
        tree = ryml.parse_in_arena(text.encode())
        root = tree.root_id()
        # Only a mapping or an array: a stream (`--- x` lines, a directive), a document of
        # one scalar (never an object) or of none (comments) is PyYAML's.
        if tree.is_stream(root) or not (tree.is_map(root) or tree.is_seq(root)):
            return PYYAML
        emitted = ryml.emit_json(tree)
    except Exception:  # ryml.ExceptionParse, ExceptionVisit (too deep), ...
        return PYYAML
    if any(not _quoted_in(text, m.group(1)) for m in _AMBIGUOUS.finditer(emitted)):
        return PYYAML
    return _json(emitted)


def _json(text: str) -> Any:
    """`text` as JSON, or PYYAML if PyYAML might read it otherwise (a float, a duplicate key,
    a surrogate pair escape, deep nesting) or it is not JSON."""
    if ("\\u" in text and _SURROGATE_ESCAPE.search(text)) or (
        text.count("{") + text.count("[") > MAX_DEPTH
    ):
        return PYYAML
    try:
        return _JSON.decode(text)
    except (ValueError, RecursionError):
        return PYYAML


def _pyyaml_read(text: str, where: str) -> Any:
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
