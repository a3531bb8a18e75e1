"""What a source of Services and EndpointSlices delivers to the agent.

Sources (manifest files, the Kubernetes API) hand raw objects, in the API's JSON shape, to
an ObjectSink; translation and change tracking happen behind it, once for every source.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
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
