"""rich and matplotlib are the `bench` extra's: only the bench's renderer and plot import
them (lazily, behind lab.bench.extras), so the agent runs without them."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests import REPO

EXTRA_MODULES = ("rich", "matplotlib")


def importers_of(module: str) -> set[str]:
    found = set()
    for path in [*(REPO / "ebpflb").rglob("*.py"), *(REPO / "lab").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            if any(n == module or n.startswith(f"{module}.") for n in names):
                found.add(path.relative_to(REPO).as_posix())
    return found


def test_only_the_renderer_and_the_plot_import_the_extra() -> None:
    assert importers_of("rich") == {"lab/bench/render.py"}
    assert importers_of("matplotlib") == {"lab/bench/plot.py"}


def test_the_agent_and_the_cli_load_without_the_extra() -> None:
    # A fresh interpreter where importing rich or matplotlib fails.
    code = (
        "import sys\n"
        "sys.modules.update(rich=None, matplotlib=None)\n"
        "import ebpflb.app, ebpflb.cli\n"
        "from lab.bench import command, render, plot\n"
        "ebpflb.cli.build_parser().parse_args(['bench', 'compare', '--quick'])\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
