"""YAML documents as plain data, strictly: what the manifest source reads files with.

A stream is split on '---' lines first, so one broken document does not hide the ones
after it. A document is refused (InvalidObjectError, kind Manifest, reason parse) when it
is not YAML, when a mapping repeats a key (kubectl refuses that too: which value was
meant is a guess), when an alias makes it contain itself, when aliases multiply it (a
"billion laughs": harmless as shared Python objects until something walks the tree, as
comparing an object with its previous version does), or when it nests deeper than any
Kubernetes object (which would reach Python's recursion limit in that comparison).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from ebpflb.errors import Fault, InvalidObjectError
from ebpflb.fields import show

MANIFEST = "Manifest"  # the kind a document that is not an object yet is reported as
MAX_DEPTH = 100  # Kubernetes objects nest a dozen levels
_DOC_SEPARATOR = re.compile(r"^---[ \t]*(?:#.*)?$", re.MULTILINE)
_ALIAS_SLACK, _ALIAS_RATIO = 10_000, 10  # as goyaml: aliases may not multiply a document


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
