"""Every relative link and repository path in README.md and docs/ exists.

A doc naming a file the tree no longer has misleads quietly, and the README's claims cite
tests by path: after a move, this lists each stale reference as file:line. Checked:

- markdown links and images, `[text](target)` and `[label]: target`, outside code blocks:
  the file or directory relative to the page, and its `#anchor` among the target's
  headings (GitHub's slugs);
- repository paths anywhere in the text (prose, inline code, code blocks), from the
  repository root: `tests/...`, `ebpflb/...`, `lab/...`, `bpf/...`, `deploy/...`,
  `scripts/...`, `docs/...`, `examples/...`, `vagrant/...`, `.ci/...`; a glob must match
  something; `path.py::name` must define `name` (a test, a class);
- dotted modules, `ebpflb.x.y` and `lab.x.y` (`python -m ebpflb.datapath.probes`): the
  module, and at most one attribute of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest


def _repository_root() -> Path:
    # Found by walking up, so the test can move into a sub-folder of tests/unit.
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file() and (parent / "README.md").is_file():
            return parent
    raise RuntimeError(f"no repository root above {__file__}")


ROOT = _repository_root()

PREFIXES = ("tests", "ebpflb", "lab", "bpf", "deploy", "scripts", "docs", "examples", "vagrant")
# Written by runs, not kept in the tree.
GENERATED = (".ci/out/",)

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
INLINE_CODE = re.compile(r"`[^`]*`")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
PATH = re.compile(
    r"(?<![\w./-])((?:\.ci|" + "|".join(PREFIXES) + r")/[\w.*/-]*)((?:::[\w\[\].-]+)*)"
)
MODULE = re.compile(r"(?<![\w./-])((?:ebpflb|lab)(?:\.[A-Za-z_]\w*)+)")


@dataclass(frozen=True)
class Problem:
    page: str
    line: int
    reference: str
    why: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.reference}: {self.why}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_fence = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        found.update(HTML_ID.findall(line))
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def _check_link(root: Path, page: Path, target: str) -> str | None:
    if SCHEME.match(target) or target.startswith("//"):
        return None  # a URL: not the tree's to check
    path_part, _, anchor = target.partition("#")
    resolved = (page.parent / path_part).resolve() if path_part else page
    if path_part and not resolved.exists():
        return "no such file or directory"
    if path_part and not resolved.is_relative_to(root):
        return "outside the repository"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"no heading #{anchor} in {resolved.relative_to(root).as_posix()}"
    return None


def _defines(source: Path, name: str) -> bool:
    pattern = rf"^\s*(?:async\s+def|def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*[:=]"
    return re.search(pattern, source.read_text(), re.M) is not None


def _check_path(root: Path, path: str, names: str) -> str | None:
    path = path.rstrip(".")
    if path.startswith(GENERATED):
        return None
    if any(c in path for c in "*?"):
        return None if any(root.glob(path)) else "the pattern matches no file"
    if not (root / path).exists():
        return "no such file or directory"
    for name in filter(None, names.split("::")):
        name = name.split("[")[0]  # a parameter id names a case, not a definition
        if not (root / path).is_file() or not _defines(root / path, name):
            return f"{name} is not defined there"
    return None


def _check_module(root: Path, dotted: str) -> str | None:
    parts = dotted.split(".")
    for end in range(len(parts), 1, -1):
        base = root.joinpath(*parts[:end])
        for source in (base.with_suffix(".py"), base / "__init__.py"):
            if source.is_file():
                rest = parts[end:]
                if not rest:
                    return None
                if len(rest) == 1 and _defines(source, rest[0]):
                    return None
                return f"{'.'.join(rest)} is not defined in {'.'.join(parts[:end])}"
    return "no such module"


def check_page(root: Path, page: Path) -> list[Problem]:
    problems = []
    name = page.relative_to(root).as_posix()
    in_fence = False
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        fence = FENCE.match(line)
        if fence:
            in_fence = not in_fence
        elif not in_fence:
            prose = INLINE_CODE.sub("", line)
            targets = [m.group(1) for m in LINK.finditer(prose)]
            targets += [m.group(1) for m in REFERENCE.finditer(prose)]
            for target in targets:
                why = _check_link(root, page, target)
                if why:
                    problems.append(Problem(name, number, f"[link] {target}", why))
        for match in PATH.finditer(line):
            if line[: match.start()].endswith(("](", "](<")):
                continue  # a link target: checked above, relative to the page
            why = _check_path(root, match.group(1), match.group(2))
            if why:
                problems.append(Problem(name, number, match.group(0).rstrip("."), why))
        for match in MODULE.finditer(line):
            why = _check_module(root, match.group(1))
            if why:
                problems.append(Problem(name, number, match.group(1), why))
    return problems


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def test_every_link_and_path_in_the_readme_and_docs_exists() -> None:
    assert (ROOT / "docs").is_dir()
    problems = [p for page in pages(ROOT) for p in check_page(ROOT, page)]
    assert not problems, "stale references:\n" + "\n".join(map(str, problems))


def test_the_kernel_table_target_writes_into_a_page_with_its_markers() -> None:
    """`make kernel-table` rewrites what lies between two markers in the page it names."""
    target = re.search(r"kernels table --readme (\S+)", (ROOT / "Makefile").read_text())
    assert target, "no `... kernels table --readme PAGE` in the Makefile's kernel-table target"
    text = (ROOT / target.group(1)).read_text()
    begin, end = text.find("<!-- kernel-matrix:begin"), text.find("<!-- kernel-matrix:end -->")
    assert 0 <= begin < end, f"{target.group(1)}: the kernel-matrix markers are missing"


# The checker itself, on a tree of its own: each kind of reference, good and broken.


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_a.py").write_text(
        "import pytest\n\ndef test_one() -> None:\n    pass\n\nclass TestGroup:\n    pass\n"
    )
    (tmp_path / "ebpflb" / "datapath").mkdir(parents=True)
    (tmp_path / "ebpflb" / "__init__.py").write_text("")
    (tmp_path / "ebpflb" / "datapath" / "__init__.py").write_text("")
    (tmp_path / "ebpflb" / "datapath" / "probes.py").write_text("LIMIT = 3\n\ndef main():\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "usage.md").write_text("# Usage\n\n## Sync at scale\n\n## Tests\n")
    return tmp_path


def write_page(tree: Path, text: str) -> Path:
    page = tree / "docs" / "page.md"
    page.write_text(text)
    return page


def test_good_references_pass(tree: Path) -> None:
    page = write_page(
        tree,
        "# Page\n\n"
        "See [usage](usage.md#sync-at-scale), [here](#page), [up](../docs/usage.md) and\n"
        "[the web](https://example.com/x.md#nowhere); `tests/unit/test_a.py::test_one`,\n"
        "tests/unit/test_a.py::TestGroup, `tests/unit/test_*.py`, `tests/unit/`,\n"
        "`python -m ebpflb.datapath.probes`, `ebpflb.datapath.probes.LIMIT`, the pins at\n"
        "`/sys/fs/bpf/ebpflb-test` and `/run/lock/ebpflb.lock`, kube-proxy's\n"
        "pkg/proxy/iptables/proxier.go, results in `.ci/out/kernels/6.1/`.\n"
        "```sh\nmake test   # [not](a-link.md) a link inside a code block\n```\n",
    )
    assert check_page(tree, page) == []


@pytest.mark.parametrize(
    ("line", "reference", "why"),
    [
        ("[gone](gone.md)", "[link] gone.md", "no such file or directory"),
        (
            "[x](usage.md#no-such)",
            "[link] usage.md#no-such",
            "no heading #no-such in docs/usage.md",
        ),
        ("[x](#nowhere)", "[link] #nowhere", "no heading #nowhere in docs/page.md"),
        ("![plot](bench/plot.png)", "[link] bench/plot.png", "no such file or directory"),
        ("[r]: ../missing.md", "[link] ../missing.md", "no such file or directory"),
        ("see `tests/unit/test_b.py`.", "tests/unit/test_b.py", "no such file or directory"),
        (
            "tests/unit/test_a.py::test_two[tc]",
            "tests/unit/test_a.py::test_two[tc]",
            "test_two is not defined there",
        ),
        ("`tests/kernel/test_*.py`", "tests/kernel/test_*.py", "the pattern matches no file"),
        ("`ebpflb/sources/`", "ebpflb/sources/", "no such file or directory"),
        ("`python -m ebpflb.bench.sync`", "ebpflb.bench.sync", "no such module"),
        (
            "`ebpflb.datapath.probes.GONE`",
            "ebpflb.datapath.probes.GONE",
            "GONE is not defined in ebpflb.datapath.probes",
        ),
    ],
)
def test_each_broken_reference_is_named_with_its_line(
    tree: Path, line: str, reference: str, why: str
) -> None:
    page = write_page(tree, f"# Page\n\nfine\n{line}\n")
    assert check_page(tree, page) == [Problem("docs/page.md", 4, reference, why)]


def test_duplicate_headings_get_numbered_anchors_and_code_blocks_have_none(tree: Path) -> None:
    page = write_page(
        tree,
        "# Page\n\n## Tests\n\n## Tests\n\n```sh\n# not a heading\n```\n"
        "[a](#tests) [b](#tests-1) [c](#not-a-heading)\n",
    )
    assert [p.reference for p in check_page(tree, page)] == ["[link] #not-a-heading"]


def test_slugs_follow_github() -> None:
    assert slug("ebpflb bench compare: ebpflb against kube-proxy") == (
        "ebpflb-bench-compare-ebpflb-against-kube-proxy"
    )
    assert slug("Affinity and Local policies (--mix affinity,local)") == (
        "affinity-and-local-policies---mix-affinitylocal"
    )
    assert slug("iptables-nft up to 20,000 services") == "iptables-nft-up-to-20000-services"
    assert slug("`ebpflb explain`") == "ebpflb-explain"
    assert slug("Test VMs (vagrant/)") == "test-vms-vagrant"
