"""`--config FILE`: an agent's options read from a YAML file (deploy/ mounts it from a
ConfigMap), with the flags given on the command line overriding it.

The file maps option names, spelled as on the command line without the dashes
(`ct-max: 262144`), to values. Its schema is the `ebpflb run` parser itself: every key must
name one of its options and every value goes through that option's own type and choices,
so the file and the flags cannot disagree on a name, a type or a check. A command with
fewer options (`ebpflb cleanup`) reads the keys it has and leaves the others, so one file
serves both. Anything else is refused with an error naming the file and the key: an
unknown key (with the nearest option name), a value of the wrong YAML type (`ct-max: "1k"`,
`interfaces: 3`), a value the option's type rejects.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import yaml

from ebpflb.errors import ConfigError

# Option types whose value may also be written as a YAML list (joined with commas).
ListType = Callable[[str], Any]


def read(path: Path) -> dict[str, Any]:
    """The file's mapping of option names to values; an empty file is an empty mapping."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"config {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path}: not YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config {path}: must be a mapping of option names to values, not a {_yaml_type(data)}"
        )
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"config {path}: key {key!r} is not an option name")
    return data


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """A parser's long options by name without dashes ("ct-max"); help and --config are
    not settable from a file."""
    found = {}
    for action in parser._actions:  # argparse has no public list of a parser's actions
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        for flag in action.option_strings:
            if flag.startswith("--") and flag != "--config":
                found[flag[2:]] = action
    return found


def defaults(
    path: Path,
    schema: Mapping[str, argparse.Action],
    accepted: Collection[str],
    list_types: Collection[ListType] = (),
) -> dict[str, Any]:
    """The file's values as parser defaults (dest -> converted value) for the options in
    `accepted`; every key is checked against `schema` (the run parser's options)."""
    values = {}
    for key, raw in read(path).items():
        action = schema.get(key)
        if action is None:
            near = difflib.get_close_matches(key, list(schema), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            if key == "config":
                hint = " (a config file cannot name another)"
            raise ConfigError(f"config {path}: unknown key {key!r}{hint}")
        if key in accepted:
            values[action.dest] = convert(path, key, action, raw, list_types)
    return values


def parse_bool(text: str) -> bool:
    """A boolean option's value, as kube-proxy's flags take it (--flag=false)."""
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(
        text.strip().lower()
    )
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return value


def convert(
    path: Path,
    key: str,
    action: argparse.Action,
    raw: object,
    list_types: Collection[ListType] = (),
) -> Any:
    """One value, checked against its option as argparse would check the flag's text."""
    where = f"config {path}: {key}"
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(raw, bool):
            raise ConfigError(f"{where}: must be true or false, not {_describe(raw)}")
        return raw if isinstance(action, argparse._StoreTrueAction) else not raw
    kind = action.type
    if kind is parse_bool and isinstance(raw, bool):
        return raw
    if raw is None or isinstance(raw, bool | dict):
        raise ConfigError(f"{where}: must be {_expected(kind, list_types)}, not {_describe(raw)}")
    if isinstance(raw, list):
        if kind not in list_types or not all(isinstance(item, str) for item in raw):
            raise ConfigError(
                f"{where}: must be {_expected(kind, list_types)}, not {_describe(raw)}"
            )
        text = ",".join(raw)
    elif kind is int:
        if not isinstance(raw, int):
            raise ConfigError(f"{where}: must be an integer, not {_describe(raw)}")
        text = str(raw)
    elif kind is float:
        if not isinstance(raw, int | float):
            raise ConfigError(f"{where}: must be a number, not {_describe(raw)}")
        text = str(raw)
    elif not isinstance(raw, str):
        raise ConfigError(f"{where}: must be {_expected(kind, list_types)}, not {_describe(raw)}")
    else:
        text = raw
    try:
        value = kind(text) if callable(kind) else text
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(str(getattr(c, "value", c)) for c in action.choices)
        raise ConfigError(f"{where}: {raw!r} is not one of {choices}")
    return value


def _expected(kind: object, list_types: Collection[ListType]) -> str:
    if kind is int:
        return "an integer"
    if kind is float:
        return "a number"
    if kind in list_types:
        return "a string or a list of strings"
    return "a string"


def _yaml_type(value: object) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "mapping",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _describe(value: object) -> str:
    kind = _yaml_type(value)
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} ({value!r})"
