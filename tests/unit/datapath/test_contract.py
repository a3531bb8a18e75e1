"""The C<->Python contract without a kernel: bpf/lib/consts.h, structs.h and maps.h, parsed
here, against ebpflb/datapath/contract/. Any constant, flag, counter index, struct field
(name, order, offset, size, byte order) or map (name, type, key, value, max_entries, flags)
that differs between the two sides fails a test."""

from __future__ import annotations

import ast
import ctypes as ct
import dataclasses
import operator
import re

import pytest

from ebpflb.config import Config
from ebpflb.datapath import contract
from tests import REPO

LIB = REPO / "bpf" / "lib"

# ---- a small parser for the subset of C the headers use ----------------------------------

SCALARS = {"char": 1, "__u8": 1, "__u16": 2, "__be16": 2, "__u32": 4, "__be32": 4, "__u64": 8}
CTYPES = {1: ct.c_uint8, 2: ct.c_uint16, 4: ct.c_uint32, 8: ct.c_uint64}


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", "", text)


def parse_defines(text: str) -> tuple[dict[str, str], set[str]]:
    """({macro: replacement}, the macros guarded by #ifndef: the overridable ones)."""
    defines: dict[str, str] = {}
    guarded: set[str] = set()
    pending: str | None = None
    for line in strip_comments(text).splitlines():
        line = line.strip()
        if m := re.fullmatch(r"#\s*ifndef\s+(\w+)", line):
            pending = m.group(1)
        elif m := re.fullmatch(r"#\s*define\s+(\w+)\s+(.+)", line):
            name, value = m.group(1), m.group(2).strip()
            defines[name] = value
            if name == pending:
                guarded.add(name)
        elif line.startswith("#endif"):
            pending = None
    return defines, guarded


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.floordiv,  # C integer division
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitOr: operator.or_,
    ast.BitAnd: operator.and_,
}


def evaluate(expr: str, macros: dict[str, str]) -> int:
    """An integer constant expression: numbers (U/ULL suffixes), macros, + - * / << >> | &."""
    for _ in range(20):  # expand macros (nested) until none is left
        expanded = re.sub(r"\b[A-Z_][A-Z0-9_]*\b", lambda m: f"({macros[m.group()]})", expr)
        if expanded == expr:
            break
        expr = expanded
    expr = re.sub(r"\b(0x[0-9a-fA-F]+|\d+)[uUlL]+\b", r"\1", expr)

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return int(_OPERATORS[type(node.op)](value(node.left), value(node.right)))
        raise ValueError(f"not a constant expression: {ast.dump(node)}")

    return value(ast.parse(expr.strip(), mode="eval").body)


@dataclasses.dataclass(frozen=True)
class CField:
    name: str
    type: str
    offset: int
    size: int


def parse_structs(text: str, macros: dict[str, str]) -> dict[str, list[CField]]:
    """Every `struct NAME { ... };` with its fields at naturally aligned offsets."""
    structs: dict[str, list[CField]] = {}
    for name, body in re.findall(r"struct\s+(\w+)\s*\{(.*?)\};", strip_comments(text), re.DOTALL):
        offset, found = 0, []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            m = re.fullmatch(r"((?:struct\s+)?\w+)\s+(\w+)\s*(?:\[(.+)\])?", decl)
            assert m, f"struct {name}: cannot parse {decl!r}"
            ctype, field, dim = m.groups()
            element = element_align = SCALARS[ctype]  # no struct nests another
            count = evaluate(dim, macros) if dim else 1
            offset = -(-offset // element_align) * element_align
            found.append(CField(field, ctype, offset, element * count))
            offset += element * count
        structs[name] = found
    return structs


def struct_size(fields: list[CField]) -> int:
    """Rounded up to the largest member's alignment (the structs hold scalars only)."""
    end = fields[-1].offset + fields[-1].size
    largest = max(SCALARS[f.type] for f in fields)
    return -(-end // largest) * largest


def split_args(text: str) -> list[str]:
    args, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            args.append(current.strip())
            current = ""
            continue
        depth += (char == "(") - (char == ")")
        current += char
    return [*args, current.strip()]


def parse_maps(text: str) -> dict[str, list[str]]:
    """name -> BPF_TABLE_PINNED's arguments."""
    found = {}
    for call in re.findall(r"BPF_TABLE_PINNED\((.*?)\);", strip_comments(text), re.DOTALL):
        args = split_args(" ".join(call.split()))
        found[args[3]] = args
    return found


# ---- the C side, once -------------------------------------------------------------------

DEFINES, GUARDED = parse_defines((LIB / "consts.h").read_text())
STRUCTS = parse_structs((LIB / "structs.h").read_text(), DEFINES)
MAPS = parse_maps((LIB / "maps.h").read_text())
# Every configurable size different, so a map following the wrong size is caught.
CONFIG = Config(
    max_services=1000,
    max_backends=2000,
    slot_pool_size=300000,
    rev_sk_max=4000,
    ct_max=5000,
    rnat_max=6000,
    src_range_max=7000,
)


def compiled_macros(config: Config) -> dict[str, str]:
    """consts.h as the compiler sees it with the agent's -D flags."""
    macros = dict(DEFINES)
    for flag in contract.cflags(config):
        name, _, value = flag.removeprefix("-D").partition("=")
        macros[name] = value
    return macros


# ---- constants, flags, counters ----------------------------------------------------------


def test_every_mirrored_constant_flag_and_counter_has_the_c_value() -> None:
    mirrored = contract.c_constants()
    prefixes = tuple(prefix for prefix, _ in contract.FAMILIES)
    in_c = {
        name: evaluate(value, DEFINES)
        for name, value in DEFINES.items()
        if name.startswith(prefixes) or name in mirrored
    }
    assert in_c == mirrored


def test_counters_fit_the_stats_array() -> None:
    assert max(contract.Counter) < contract.STAT_MAX


def test_the_overridable_sizes_are_exactly_the_ones_python_passes() -> None:
    passed = {define.macro for define in contract.DEFINES}
    assert set(GUARDED) == passed | set(contract.FEATURE_MACROS) | set(contract.VARIANT_MACROS)
    assert {f.removeprefix("-D").partition("=")[0] for f in contract.cflags(Config())} == passed


# The flow hash seed is derived from --hash-seed; C's default only lets a file compile alone.
@pytest.mark.parametrize(
    "define",
    [d for d in contract.DEFINES if d.macro != "EBPFLB_FLOW_HASH_SEED"],
    ids=lambda d: d.macro,
)
def test_c_defaults_are_the_configuration_defaults(define: contract.Define) -> None:
    default = define.value(Config())
    if isinstance(default, str):
        assert DEFINES[define.macro] == f'"{default}"'
    else:
        assert evaluate(DEFINES[define.macro], DEFINES) == default


# ---- structs -----------------------------------------------------------------------------


def test_every_struct_has_a_mirror() -> None:
    assert set(STRUCTS) == set(contract.STRUCTS)


@pytest.mark.parametrize("name", sorted(contract.STRUCTS))
def test_struct_fields_match(name: str) -> None:
    mirror = contract.STRUCTS[name]
    c_fields = STRUCTS[name]
    mine = [(f, getattr(mirror, f).offset, getattr(mirror, f).size) for f, *_ in mirror._fields_]
    assert mine == [(f.name, f.offset, f.size) for f in c_fields]
    assert ct.sizeof(mirror) == struct_size(c_fields)
    network = {f.name for f in c_fields if f.type.startswith("__be")}
    assert set(mirror._network_order_) == network  # type: ignore[attr-defined]


# ---- maps --------------------------------------------------------------------------------


def test_every_map_is_in_the_table() -> None:
    """A growable map is created by the agent (growable.py), not declared: the programs
    declare its ref map, whose type names it."""
    growable = {name.value for name in contract.GROWABLE}
    assert set(MAPS) == {name.value for name in contract.MapName} - growable
    for name, ref in contract.GROWABLE.items():
        assert MAPS[ref.value][0] == f'"array_of_maps${name.value}"'
        # An array inner map must say so to differ in size from its template (hash maps
        # may anyway, and refuse the flag).
        spec = contract.MAPS[name]
        assert bool(spec.flags & contract.BPF_F_INNER_MAP) == (spec.type is contract.MapType.ARRAY)
        assert (
            0 < contract.INITIAL_ENTRIES[name](Config()) < contract.MAPS[name].max_entries(Config())
        )


def c_type_matches(c_type: str, mine: contract.CType) -> bool:
    if c_type == "int":  # the key socket storage requires (a socket fd from user space)
        return mine is ct.c_int32
    if c_type.startswith("struct "):
        return contract.STRUCTS.get(c_type.split()[1]) is mine
    return mine is CTYPES[SCALARS[c_type]]


DECLARED = [name for name in contract.MapName if name not in contract.GROWABLE]


@pytest.mark.parametrize("name", DECLARED, ids=lambda m: m.value)
@pytest.mark.parametrize("config", [Config(), CONFIG], ids=["defaults", "distinct-sizes"])
def test_map_declaration_matches(name: contract.MapName, config: Config) -> None:
    spec = contract.MAPS[name]
    map_type, key, value, c_name, max_entries, path, *flags = MAPS[name.value]
    assert (map_type.partition("$")[0].rstrip('"'), c_name) == (f'"{spec.type.c_name}', name.value)
    assert c_type_matches(key, spec.key), f"key {key}"
    assert c_type_matches(value, spec.value), f"value {value}"
    assert evaluate(max_entries, compiled_macros(config)) == spec.max_entries(config)
    assert path == f'EBPFLB_PIN_DIR "/{name.value}"'
    names = [n.strip() for arg in flags for n in arg.split("|")]
    assert sum(contract.MAP_FLAG_NAMES[n] for n in names) == spec.flags


# ---- the parser itself -------------------------------------------------------------------


def test_the_parser_reads_what_the_headers_use() -> None:
    macros = {"A": "(1 << 3)", "B": "(A | 1)", "N": "8"}
    assert evaluate("B", macros) == 9
    assert evaluate("N / 2", macros) == 4
    assert evaluate("0x10U + 3ULL", macros) == 19
    structs = parse_structs("struct s { __u8 a; __be32 b; /* c */ __u16 c[N]; };", {"N": "3"})
    assert [(f.name, f.offset, f.size) for f in structs["s"]] == [
        ("a", 0, 1),
        ("b", 4, 4),
        ("c", 8, 6),
    ]
    assert struct_size(structs["s"]) == 16


@pytest.mark.parametrize("name", list(contract.MapName), ids=str)
def test_map_names_fit_the_kernels_object_name(name: contract.MapName) -> None:
    # BPF_OBJ_NAME_LEN is 16 with the NUL: a longer name is cut in the kernel's map info,
    # and then no longer matches its pin (the program cache compares the two).
    assert len(name.value) <= 15, name.value
