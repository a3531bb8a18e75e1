"""The bench's records as JSON and back: the only code that knows the JSON shape.

A report is one object: {"kind": "compare" | "maglev" | "sync" | "bulk" | "pps", "schema": 2,
...fields}.
Fields are the records' own, nested as the dataclasses nest; enums are their values,
tuples are lists. Decoding follows the records' type hints and names the exact place of
anything malformed (a missing field, a string where a number belongs, an unknown key).
Reports without "kind" are the dict-shaped ones saved before the records existed
(schema 1): legacy.py converts them first.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from lab.bench.records import ReportError, legacy
from lab.bench.records.bulk import BulkRun
from lab.bench.records.compare import CompareRun
from lab.bench.records.maglev import MaglevRun
from lab.bench.records.pps import PpsRun
from lab.bench.records.sync import SyncRun

SCHEMA = 2
Report = CompareRun | MaglevRun | SyncRun | BulkRun | PpsRun
KINDS: dict[str, type[Report]] = {
    cls.KIND: cls for cls in (CompareRun, MaglevRun, SyncRun, BulkRun, PpsRun)
}
T = TypeVar("T")


def encode(value: object) -> Any:
    """A record (or any value inside one) as plain JSON data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [encode(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): encode(item) for key, item in value.items()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"not a record value: {value!r}")


def decode(cls: type[T], data: object, where: str = "report") -> T:
    """`data` (parsed JSON) as a `cls` record; ReportError names what does not fit."""
    return typing.cast(T, _decode(cls, data, where))


def _fail(where: str, expected: str, data: object) -> ReportError:
    return ReportError(f"{where}: expected {expected}, got {json.dumps(data)[:80]}")


def _decode(tp: Any, data: object, where: str) -> object:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]  # only `X | None` in records
        return _decode(inner, data, where)
    if origin is Literal:
        if data not in args:
            raise _fail(where, " or ".join(json.dumps(a) for a in args), data)
        return data
    if origin is tuple:
        if not isinstance(data, list):
            raise _fail(where, "a list", data)
        return tuple(_decode(args[0], item, f"{where}[{i}]") for i, item in enumerate(data))
    if origin in (dict, Mapping):
        if not isinstance(data, dict):
            raise _fail(where, "an object", data)
        return {str(k): _decode(args[1], item, f"{where}.{k}") for k, item in data.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _decode_record(tp, data, where)
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(data)
        except ValueError:
            raise _fail(where, " or ".join(json.dumps(m.value) for m in tp), data) from None
    if tp is bool:
        if not isinstance(data, bool):
            raise _fail(where, "true or false", data)
        return data
    if tp is int:
        if not isinstance(data, int) or isinstance(data, bool):
            raise _fail(where, "an integer", data)
        return data
    if tp is float:
        if not isinstance(data, int | float) or isinstance(data, bool):
            raise _fail(where, "a number", data)
        return float(data)
    if tp is str:
        if not isinstance(data, str):
            raise _fail(where, "a string", data)
        return data
    raise TypeError(f"{where}: no JSON form for {tp!r}")


def _decode_record(cls: type[Any], data: object, where: str) -> object:
    if not isinstance(data, dict):
        raise _fail(where, f"an object ({cls.__name__})", data)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ReportError(f"{where}: unknown field {unknown[0]!r} ({cls.__name__})")
    hints = get_type_hints(cls)
    values = {}
    for name, f in fields.items():
        if name in data:
            values[name] = _decode(hints[name], data[name], f"{where}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ReportError(f"{where}: missing field {name!r} ({cls.__name__})")
    return cls(**values)


# ---- whole reports ------------------------------------------------------------------------


def to_json(report: Report) -> str:
    return json.dumps({"kind": report.KIND, "schema": SCHEMA, **encode(report)}, indent=2)


def from_json(data: object, where: str = "report") -> Report:
    if not isinstance(data, dict):
        raise _fail(where, "an object", data)
    if "kind" not in data:
        data = legacy.upgrade(data, where)
    body = {k: v for k, v in data.items() if k not in ("kind", "schema")}
    kind, schema = data["kind"], data.get("schema")
    if kind not in KINDS:
        raise _fail(f"{where}.kind", " or ".join(json.dumps(k) for k in KINDS), kind)
    if schema != SCHEMA:
        raise ReportError(f"{where}: schema {schema!r}; this ebpflb reads {SCHEMA} (and 1)")
    return decode(KINDS[kind], body, where)


def save(report: Report, path: Path) -> None:
    path.write_text(to_json(report) + "\n")


def load(path: Path) -> Report:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ReportError(f"{path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ReportError(f"{path}: not JSON ({exc})") from exc
    return from_json(data, str(path))
