"""Strict reads of API-shaped JSON, typed as the API server's OpenAPI schema types it.

Translation gets plain JSON values from two places: the API server (validated) and YAML
files (not validated at all; YAML is loose besides: `yes` is a boolean, `2020-01-01` a
date). Every field ebpflb reads goes through a `Reader`, so a wrong type is an
InvalidObjectError naming the object and the field's JSON path, never an AttributeError
deep inside translation, nor a wrong meaning: `ready: "false"` is a non-empty string,
truthy to Python, and invalid to the API server. null counts as absent, as in the API.
Fields ebpflb does not read are not looked at (the API server prunes unknown ones too).
"""

from __future__ import annotations

import reprlib
import socket
from collections.abc import Mapping, Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from types import MappingProxyType
from typing import Any, NoReturn

from ebpflb.errors import Fault, InvalidObjectError
from ebpflb.model import IPAddress, NamespacedName

EMPTY: Mapping[Any, Any] = MappingProxyType({})
_SHOWN = 40  # characters of a rejected value quoted in the message
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, _SHOWN, _SHOWN


def json_type(value: Any) -> str:
    """The JSON name of a value's type, as an error message says it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__  # YAML's dates, bytes, sets: no JSON type at all


def show(value: Any) -> str:
    """A bounded quote of a value for a log line: a rejected value may be megabytes, or
    nested deeper than repr() can go."""
    text = _REPR.repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


class Reader:
    """Typed reads of one object's fields; every failure names the object and the field."""

    __slots__ = ("kind", "ref")

    def __init__(self, kind: str, ref: str) -> None:
        self.kind = kind
        self.ref = ref

    def fail(self, field: str, detail: str, fault: Fault = Fault.VALUE) -> NoReturn:
        raise InvalidObjectError(self.kind, self.ref, f"{field} {detail}", fault=fault, field=field)

    def wrong_type(self, field: str, value: Any, expected: str) -> NoReturn:
        self.fail(field, f"must be {expected}, not {json_type(value)} {show(value)}", Fault.TYPE)

    def mapping(self, value: Any, field: str) -> Mapping[Any, Any]:
        """An object; EMPTY when absent."""
        if value is None:
            return EMPTY
        if type(value) is dict or isinstance(value, Mapping):
            return value
        self.wrong_type(field, value, "an object")

    def array(self, value: Any, field: str, max_items: int | None = None) -> Sequence[Any]:
        """An array (at most `max_items` long where the API says so); () when absent."""
        if value is None:
            return ()
        if not isinstance(value, (list, tuple)):
            self.wrong_type(field, value, "an array")
        if max_items is not None and len(value) > max_items:
            self.fail(field, f"has {len(value)} items, more than the API's {max_items}")
        return value

    def string(self, value: Any, field: str) -> str:
        """A string; "" when absent (the API's JSON omits empty strings)."""
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        self.wrong_type(field, value, "a string")

    def boolean(self, value: Any, field: str) -> bool | None:
        if value is None or type(value) is bool:
            return value
        self.wrong_type(field, value, "a boolean")

    def integer(self, value: Any, field: str) -> int | None:
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        self.wrong_type(field, value, "an integer")

    def port(self, value: Any, field: str, *, zero: bool = False) -> int | None:
        """A port number in 1-65535; None when absent, and for 0 where `zero` allows it
        (an unallocated nodePort or healthCheckNodePort is 0 in the API)."""
        number = self.integer(value, field)
        if number is None or (zero and number == 0):
            return None
        if not 1 <= number <= 65535:
            self.fail(field, f"{number!r} is not a port in 1-65535")
        return number

    def strings(self, value: Any, field: str) -> Sequence[str]:
        """An array of strings; () when absent."""
        found = self.array(value, field)
        for i, text in enumerate(found):
            if not isinstance(text, str):
                self.wrong_type(f"{field}[{i}]", text, "a string")
        return found

    def ip(self, text: str, field: str) -> IPAddress:
        """The IPv4 or IPv6 address `text` is; any other text is invalid. inet_pton is as
        strict as the API server's parser (no leading zeros, no zone)."""
        address: IPAddress | None = parse_ipv4(text)
        if address is None:
            address = parse_ipv6(text)
        if address is None:
            self.fail(field, f"{show(text)} is not an IP address")
        return address

    def addresses(
        self, texts: Sequence[str], field: str, *, single: bool = False
    ) -> tuple[IPAddress, ...]:
        """The addresses `texts` hold, both families. `field` names the array, or with
        `single` the one field `texts` holds."""
        return tuple(
            self.ip(text, field if single else f"{field}[{i}]") for i, text in enumerate(texts)
        )

    def cidr(self, text: str, field: str) -> IPv4Network | IPv6Network:
        """ADDRESS/PREFIX of either family (surrounding spaces allowed: kube-proxy trims
        them), host bits cleared. As strict as the API server: a bare address or a netmask
        is not a CIDR."""
        address, slash, prefix = text.strip().partition("/")
        length = int(prefix) if prefix.isascii() and prefix.isdigit() and len(prefix) <= 3 else -1
        if slash and 0 <= length <= 32 and (v4 := parse_ipv4(address)) is not None:
            return IPv4Network((v4, length), strict=False)
        if slash and 0 <= length <= 128 and (v6 := parse_ipv6(address)) is not None:
            return IPv6Network((v6, length), strict=False)
        self.fail(field, f"{show(text)} is not a CIDR")


def parse_ipv4(text: str) -> IPv4Address | None:
    """IPv4Address(text), or None when `text` is not an IPv4 address. inet_pton is as strict
    (four decimal octets, no leading zeros) and five times faster than ipaddress's parser,
    which 300,000 endpoint addresses would otherwise go through at start."""
    try:
        return IPv4Address(socket.inet_pton(socket.AF_INET, text))
    except (OSError, ValueError):  # ValueError: an embedded NUL, a lone surrogate
        return None


def parse_ipv6(text: str) -> IPv6Address | None:
    """IPv6Address(text), or None when `text` is not an IPv6 address (inet_pton: no zone)."""
    try:
        return IPv6Address(socket.inet_pton(socket.AF_INET6, text))
    except (OSError, ValueError):
        return None


def identify(obj: Any, kind: str) -> tuple[NamespacedName, Reader, Mapping[Any, Any]]:
    """(namespace/name, a Reader naming it, metadata) of an object, read strictly: an object
    without a name cannot be tracked, so it is invalid. The namespace defaults to
    "default", as kubectl's does for a manifest without one."""
    r = Reader(kind, "?")
    if not isinstance(obj, Mapping):
        r.wrong_type("(the object)", obj, "an object")
    meta = r.mapping(obj.get("metadata"), "metadata")
    namespace = r.string(meta.get("namespace"), "metadata.namespace") or "default"
    r.ref = f"{namespace}/?"
    name = r.string(meta.get("name"), "metadata.name")
    if not name:
        r.fail("metadata.name", "is missing", Fault.MISSING)
    ref = NamespacedName(namespace, name)
    r.ref = str(ref)
    return ref, r, meta


def labels(reader: Reader, meta: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """metadata.labels: an object of strings (null values read as "", as the API does)."""
    found = reader.mapping(meta.get("labels"), "metadata.labels")
    for key, value in found.items():
        if value is not None and not isinstance(value, str):
            reader.wrong_type(f"metadata.labels[{show(key)}]", value, "a string")
    return found
