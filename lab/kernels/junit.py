"""JUnit files of the matrix: reading a kernel's outcome, a stand-in for a guest that gave
none, one merged file for CI, and the summary table."""

from __future__ import annotations

import enum
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class Outcome(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"  # a failure or an error
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class Case:
    """One test case: its pytest node id (file::name) and outcome."""

    nodeid: str
    outcome: Outcome
    message: str = ""


def nodeid(case: ET.Element) -> str:
    """pytest's node id from a <testcase>: classname "tests.kernel.test_x" (or
    "tests.kernel.test_x.TestClass") and name "test_y[param]"."""
    classname = case.get("classname", "")
    name = case.get("name", "")
    parts = classname.split(".")
    # The module is the last dotted part starting with "test_"; anything after is a class.
    modules = [i for i, p in enumerate(parts) if p.startswith("test_")]
    if not modules:
        return f"{classname}::{name}"
    last = modules[0]
    path = "/".join(parts[: last + 1]) + ".py"
    return "::".join([path, *parts[last + 1 :], name])


def read_cases(path: Path) -> list[Case]:
    root = ET.parse(path).getroot()
    cases = []
    for case in root.iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            outcome, message = Outcome.FAILED, problem.get("message", "")
        elif skipped is not None:
            outcome, message = Outcome.SKIPPED, skipped.get("message", "")
        else:
            outcome, message = Outcome.PASSED, ""
        cases.append(Case(nodeid(case), outcome, message))
    return cases


@dataclass(frozen=True, slots=True)
class KernelResult:
    """What one kernel's run produced, as the summary and CI see it."""

    kernel: str  # the line, "5.10"
    release: str  # uname -r, "5.10.0-46-amd64"
    cases: tuple[Case, ...]
    seconds: float
    cpu_seconds: float = 0.0  # the VM's CPU time (its wall time on a core of its own)
    excluded: int = 0
    problem: str = ""  # why the run as a whole failed (no guest result, timeout, ...)

    def count(self, outcome: Outcome) -> int:
        return sum(1 for c in self.cases if c.outcome is outcome)

    @property
    def ok(self) -> bool:
        return not self.problem and self.count(Outcome.FAILED) == 0 and bool(self.cases)


def progress_from_console(console: str) -> str:
    """How far a guest killed before it wrote JUnit got, from pytest's -v lines on its
    console: the counts so far and the test that was running."""
    counts = dict.fromkeys(("PASSED", "FAILED", "ERROR", "SKIPPED"), 0)
    running = ""
    for text in console.splitlines():
        words = text.split()
        if not words or not words[0].startswith("tests/"):
            continue
        outcome = next((w for w in words[1:] if w in counts), "")
        if outcome:
            counts[outcome] += 1
            running = ""
        else:
            running = words[0]
    done = ", ".join(f"{n} {k.lower()}" for k, n in counts.items() if n)
    return f"before the kill: {done or 'no test finished'}; running: {running or '-'}"


def missing_result(kernel: str, problem: str) -> str:
    """A JUnit file standing for a guest that reported nothing: one failed case saying why,
    so a reader of the JUnit files alone sees the kernel failed."""
    suite = ET.Element("testsuite", name=f"kernel-{kernel}", tests="1", failures="1")
    case = ET.SubElement(suite, "testcase", classname="kernel_matrix", name=f"boot_{kernel}")
    ET.SubElement(case, "failure", message=problem).text = problem
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def merge(files: Sequence[tuple[str, Path]]) -> str:
    """One <testsuites> from per-kernel JUnit files; every suite is renamed kernel-<line> and
    every case's classname gets the kernel as its first part, so the same test on two kernels
    stays two cases."""
    merged = ET.Element("testsuites")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for kernel, path in files:
        root = ET.parse(path).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        for suite in suites:
            suite.set("name", f"kernel-{kernel}")
            for case in suite.iter("testcase"):
                case.set("classname", f"{kernel}.{case.get('classname', '')}")
            for key in totals:
                totals[key] += int(suite.get(key, "0"))
            merged.append(suite)
    for key, value in totals.items():
        merged.set(key, str(value))
    return ET.tostring(merged, encoding="unicode", xml_declaration=True) + "\n"


def summary_rows(results: Sequence[KernelResult]) -> list[dict[str, object]]:
    """The summary as data (summary.json, read by the README table)."""
    return [
        {
            "kernel": r.kernel,
            "release": r.release,
            "passed": r.count(Outcome.PASSED),
            "failed": r.count(Outcome.FAILED),
            "skipped": r.count(Outcome.SKIPPED),
            "excluded": r.excluded,
            "minutes": round(r.seconds / 60, 1),
            "cpu_minutes": round(r.cpu_seconds / 60, 1),
            "ok": r.ok,
            "problem": r.problem,
        }
        for r in results
    ]


def summary(results: Sequence[KernelResult]) -> str:
    """The table printed at the end of a matrix run."""
    header = (
        "kernel",
        "release",
        "passed",
        "failed",
        "skipped",
        "excluded",
        "minutes",
        "cpu-min",
        "result",
    )
    rows = [header]
    for r in results:
        rows.append(
            (
                r.kernel,
                r.release or "-",
                str(r.count(Outcome.PASSED)),
                str(r.count(Outcome.FAILED)),
                str(r.count(Outcome.SKIPPED)),
                str(r.excluded),
                f"{r.seconds / 60:.1f}",
                f"{r.cpu_seconds / 60:.1f}",
                "ok" if r.ok else (r.problem or "FAILED"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    numeric = {2, 3, 4, 5, 6, 7}

    def line(row: Sequence[str]) -> str:
        cells = [
            row[i].rjust(widths[i]) if i in numeric else row[i].ljust(widths[i])
            for i in range(len(widths))
        ]
        return "  ".join([*cells, row[-1]]).rstrip()

    return "\n".join(line(row) for row in rows) + "\n"
