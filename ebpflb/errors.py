"""ebpflb's own error hierarchy.

Library exceptions (bcc, OSError from syscalls, kubernetes ApiException, yaml errors) are
wrapped where they enter ebpflb (``raise MapError(...) from exc``), so callers handle one
family and the CLI can print a one-line message for any ``EbpflbError``.
"""

from __future__ import annotations

import enum


class EbpflbError(Exception):
    """Base of every error ebpflb raises on purpose."""


class ConfigError(EbpflbError):
    """A command-line option or configuration value is invalid."""


class Fault(enum.Enum):
    """Why an object was rejected: the `reason` label of ebpflb_invalid_objects_total."""

    DECODE = "decode"  # a file that cannot be read as UTF-8 text
    PARSE = "parse"  # a document that is not YAML (or JSON), or repeats a key
    TYPE = "type"  # a field of the wrong JSON type (a string where a boolean belongs)
    VALUE = "value"  # the right type, but a value the API server would refuse
    MISSING = "missing"  # a required field is absent
    INTERNAL = "internal"  # an unexpected exception: a bug in ebpflb, contained all the same


class InvalidObjectError(EbpflbError):
    """A Service or EndpointSlice (or a manifest document) cannot be translated; the object
    is skipped, its last good version stays, others go on. `field` is the JSON path of the
    offending field, when there is one."""

    def __init__(
        self, kind: str, ref: str, reason: str, *, fault: Fault = Fault.VALUE, field: str = ""
    ) -> None:
        super().__init__(f"{kind} {ref}: {reason}")
        self.kind = kind
        self.ref = ref
        self.reason = reason
        self.fault = fault
        self.field = field


class ManifestError(EbpflbError):
    """A manifest file or document cannot be read or parsed."""


class PinDirBusyError(EbpflbError):
    """Another process (an agent, or `ebpflb cleanup`) holds the pin directory's lock."""

    def __init__(self, pin_dir: object, holder: str, waited: float | None = None) -> None:
        if waited is None:
            message = (
                f"pin directory {pin_dir} is in use by an ebpflb agent ({holder}): stop it"
                " first (`ebpflb cleanup` does not remove the pins of a running agent)"
            )
        else:
            message = (
                f"pin directory {pin_dir} is still locked by another ebpflb agent ({holder})"
                f" after waiting {waited:g}s: stop that agent, or wait longer with"
                " --lock-timeout"
            )
        super().__init__(message)
        self.pin_dir = pin_dir
        self.holder = holder


class DatapathError(EbpflbError):
    """Anything between the agent and the kernel's BPF subsystem."""


class KernelSetupError(DatapathError):
    """The machine lacks something the datapath needs (bpffs, cgroup v2, headers, root)."""


class BpfLoadError(DatapathError):
    """A BPF program failed to compile or was rejected by the verifier."""


class AttachError(DatapathError):
    """A program could not be attached to (or detached from) its hook."""


class MapError(DatapathError):
    """A BPF map operation failed."""


class MapFullError(MapError):
    """A map (or the Maglev slot pool) has no room; names the map and its limit."""

    def __init__(self, map_name: str, limit: int, needed_by: str) -> None:
        super().__init__(f"{map_name} is full (limit {limit}): cannot add {needed_by}")
        self.map_name = map_name
        self.limit = limit
        self.needed_by = needed_by


class MaglevError(EbpflbError):
    """Invalid input to Maglev table generation: a bad size, weight or seed, or more
    backends than the table has slots."""


class TableSizeError(MaglevError):
    """A frontend has more backends than its Maglev table may have slots (Maglev gives
    every backend a slot, so it needs M >= N). Names the limit, its value and the fix."""

    def __init__(self, backends: int, limit: int, what: str, fix: str) -> None:
        super().__init__(f"{backends} backends exceed the limit of {limit} ({what}): {fix}")
        self.backends = backends
        self.limit = limit


class NoPinsError(DatapathError):
    """No pinned ebpflb maps under the given bpffs directory."""


class SourceError(EbpflbError):
    """The source of Services and EndpointSlices (API server, manifests) failed."""
