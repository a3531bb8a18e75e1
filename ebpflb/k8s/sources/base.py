"""What a source of Services and EndpointSlices delivers to the agent, and what it reports.

Sources (manifest files, the Kubernetes API) hand raw objects, in the API's JSON shape, to
an ObjectSink; translation and change tracking happen behind it, once for every source.
What a source knows about its own work (how big and how slow its initial lists were, what
it could not read) it reports as typed values through `Source.progress()`, read by the
agent's /status, never through its log lines.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ebpflb.errors import InvalidObjectError
from ebpflb.model import NamespacedName


class Kind(enum.Enum):
    SERVICE = "Service"
    ENDPOINT_SLICE = "EndpointSlice"


class ObjectSink(Protocol):
    def object_updated(self, kind: Kind, obj: Mapping[str, Any]) -> None:
        """An object was added or changed (the whole new object)."""

    def object_deleted(self, kind: Kind, ref: NamespacedName) -> None: ...

    def object_invalid(self, error: InvalidObjectError) -> None:
        """Something the source read is not a valid object (a document that does not
        parse, a file that does not decode): reported and counted, and nothing else
        changes; the source keeps delivering what it last read there."""

    def initial_list_done(self, kind: Kind) -> None:
        """Every object of `kind` that existed at start has been delivered."""


@dataclass(frozen=True, slots=True)
class ListFigures:
    """The first complete list of one kind."""

    objects: int  # objects it held
    seconds: float  # from the first request (or file read) to the last object handed on


@dataclass(frozen=True, slots=True)
class SourceProgress:
    lists: Mapping[Kind, ListFigures] = field(default_factory=dict)  # kinds listed so far
    # What the source cannot read right now (e.g. a manifest document that does not parse),
    # one message each naming the file or object.
    errors: tuple[str, ...] = ()


class Source(Protocol):
    """What the agent needs of a source: start delivering, stop, report."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def counters(self) -> dict[str, dict[str, int]]:
        """Activity counters for metrics: {source: {event: count}}."""
        ...

    def progress(self) -> SourceProgress: ...
