"""The upstream e2e rows (lab/e2e/upstream.py) and their ports (tests/kernel/e2e) in step,
and docs/e2e.md's table generated from JUnit reports."""

from __future__ import annotations

import importlib
import inspect
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from types import FunctionType

from _pytest.mark.structures import Mark, ParameterSet

from lab.e2e import table
from lab.e2e.upstream import ROWS, Row
from lab.kernels.junit import Outcome
from tests import REPO

E2E_TESTS = REPO / "tests" / "kernel" / "e2e"


def _upstream(marks: list[Mark]) -> list[str]:
    return [str(m.args[0]) for m in marks if m.name == "upstream"]


def ported() -> Iterator[tuple[str, list[str]]]:
    """(test id, the upstream names it carries) for every test of tests/kernel/e2e; a
    parametrized test yields one id per parameter set."""
    for path in sorted(E2E_TESTS.glob("test_*.py")):
        module = importlib.import_module(f"tests.kernel.e2e.{path.stem}")
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if not name.startswith("test_") or function.__module__ != module.__name__:
                continue
            assert isinstance(function, FunctionType)
            marks: list[Mark] = list(getattr(function, "pytestmark", []))
            own = _upstream(marks)
            params = [p for m in marks if m.name == "parametrize" for p in m.args[1]]
            sets = [p for p in params if isinstance(p, ParameterSet)]
            if not sets:
                yield f"{path.stem}::{name}", own
            for index, param in enumerate(params):
                extra = _upstream(list(param.marks)) if isinstance(param, ParameterSet) else []
                yield f"{path.stem}::{name}[{index}]", own + extra


def test_every_e2e_test_names_one_ported_row_and_every_ported_row_has_a_test() -> None:
    rows = {row.name: row for row in ROWS}
    assert len(rows) == len(ROWS), "an upstream test listed twice"
    covered: set[str] = set()
    for test, names in ported():
        assert len(names) == 1, f"{test} names {len(names)} upstream tests: {names}"
        (name,) = names
        assert name in rows, f"{test} names {name!r}, which lab/e2e/upstream.py does not list"
        assert rows[name].ported, f"{test} ports {name!r}, which the rows call 'not yet'"
        covered.add(name)
    missing = [row.name for row in ROWS if row.ported and row.name not in covered]
    assert not missing, f"rows without a test: {missing}"


def test_rows_name_their_source_and_never_both_differ_and_wait() -> None:
    for row in ROWS:
        assert row.source in {"service.go", "conntrack.go", "networking.go", "kube_proxy.go"}
        assert row.name.startswith("[sig-network] "), row.name
        assert not (row.differs and row.not_yet), row.name


def _junit(path: Path, cases: list[tuple[str, str, str, int]]) -> Path:
    """A pytest-style JUnit file: (classname, test name, outcome, index of the row of ROWS
    it names; -1: none)."""
    suite = ET.Element("testsuite")
    for classname, name, outcome, row in cases:
        case = ET.SubElement(suite, "testcase", classname=classname, name=name)
        if row >= 0:
            props = ET.SubElement(case, "properties")
            ET.SubElement(props, "property", name="upstream", value=ROWS[row].name)
        if outcome == "failed":
            ET.SubElement(case, "failure", message="boom")
        elif outcome == "skipped":
            ET.SubElement(case, "skipped", message="no")
    path.write_text(ET.tostring(suite, encoding="unicode"))
    return path


def test_the_table_comes_from_the_reports(tmp_path: Path) -> None:
    e2e = "tests.kernel.e2e.test_a"
    host = _junit(
        tmp_path / "host.xml",
        [
            (e2e, "test_one[socket-lb]", "passed", 0),
            (e2e, "test_one[per-packet]", "failed", 0),
            (e2e, "test_two", "failed", 1),  # no pod client: no per-packet case
            (e2e, "test_three[per-packet-tcp]", "passed", 2),  # its socket-LB case absent
            ("tests.kernel.other.test_b", "test_four", "passed", -1),  # no upstream name
        ],
    )
    kernels = tmp_path / "kernels"
    (kernels / "6.1").mkdir(parents=True)
    _junit(kernels / "6.1" / "junit.xml", [(e2e, "test_one[socket-lb]", "skipped", 0)])
    columns = table.load_columns(host, kernels)
    assert [c.label.split(" ")[0] for c in columns] == ["host", "host,", "5.10", "6.1"]
    assert [c.ran for c in columns] == [True, True, False, True]
    first, second, third = ROWS[0], ROWS[1], ROWS[2]
    assert [table.result(first, c) for c in columns] == [
        "passed",
        "**failed** (1 of 1)",
        "not run",
        "**skipped** (1 of 1)",
    ]
    assert [table.result(second, c) for c in columns[:2]] == ["**failed** (1 of 1)", "-"]
    assert [table.result(third, c) for c in columns[:2]] == ["not run", "passed"]
    # One name for both paths' cases; the path parameter dropped, the others kept.
    assert table.test_names(first, columns) == "`test_a::test_one`"
    assert table.test_names(third, columns) == "`test_a::test_three[tcp]`"
    waiting = Row("service.go", "[sig-network] x", not_yet="needs y")
    assert table.result(waiting, columns[0]) == "not yet"
    assert table.notes(waiting) == "not yet: needs y"
    rendered = table.render(columns, [first, waiting])
    assert "1 of 2 upstream tests ported" in rendered
    assert rendered.count("\n|") == 3  # header rule and two rows


def test_a_case_is_per_packet_by_its_ids_parameter() -> None:
    def case(nodeid: str) -> table.E2ECase:
        return table.E2ECase(ROWS[0].name, nodeid, Outcome.PASSED)

    assert table.is_per_packet(case("tests/kernel/e2e/test_a.py::t[per-packet]"))
    assert table.is_per_packet(case("tests/kernel/e2e/test_a.py::t[per-packet-pod-udp]"))
    assert not table.is_per_packet(case("tests/kernel/e2e/test_a.py::t[socket-lb]"))
    assert not table.is_per_packet(case("tests/kernel/e2e/test_per-packet.py::t"))
    assert table.without_path("t[socket-lb-pod-udp]") == "t[pod-udp]"
    assert table.without_path("t[per-packet]") == "t"


def test_the_doc_holds_the_generated_table_between_its_markers() -> None:
    text = (REPO / "docs" / "e2e.md").read_text()
    start, end = text.index(table.BEGIN), text.index(table.END)
    generated = text[start:end]
    for row in ROWS:
        assert row.name.removeprefix("[sig-network] ") in generated, row.name
    assert table.replace_between_markers(text, "X\n").count("X\n") == 1
