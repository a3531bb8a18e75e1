"""The architecture's import boundaries: only the datapath adapter talks to BCC, only the
Kubernetes source to the kubernetes client (everything else is testable without either)."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests import REPO

PACKAGE = REPO / "ebpflb"


def importers_of(module: str) -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            if any(n == module or n.startswith(f"{module}.") for n in names):
                found.add(path.relative_to(PACKAGE.parent).as_posix())
    return found


def test_only_the_kubernetes_source_imports_kubernetes() -> None:
    assert importers_of("kubernetes") == {"ebpflb/k8s/sources/kubernetes.py"}


def test_the_package_never_imports_scapy() -> None:
    """scapy is a test dependency (the packet tests build frames with it), not the agent's."""
    assert importers_of("scapy") == set()


def test_the_package_never_imports_a_jit() -> None:
    """The Maglev fill loop is C built at install (issue 22): no numba, no second LLVM."""
    assert importers_of("numba") == importers_of("llvmlite") == set()


def test_only_the_compiler_imports_bcc() -> None:
    """The agent loads, attaches and reads maps with raw bpf(2) calls (bpfsys.py); importing
    bcc maps libbcc and LLVM into a process, so only the compile step does, in a child
    process of its own (compiler.py)."""
    assert importers_of("bcc") == {"ebpflb/datapath/programs/compiler.py"}


def test_the_agent_start_imports_neither_the_lab_nor_unused_kubernetes_parts() -> None:
    """What `ebpflb run --kubeconfig` imports before it lists anything (a restart waits for
    it): the command line, the agent and the Kubernetes source, without the lab (the
    bench's `ebpflb bench` verb imports it when it runs) or the kubernetes sub-packages the
    source does not use; its client still works."""
    code = (
        "import sys\n"
        "import ebpflb.cli, ebpflb.app\n"
        "from ebpflb.k8s.sources.kubernetes import ApiConfig\n"
        "ApiConfig.from_host('http://127.0.0.1:1')._new_client()\n"
        "unwanted = ('lab', 'kubernetes.dynamic', 'kubernetes.stream', 'jsonschema')\n"
        "below = tuple(f'{u}.' for u in unwanted)\n"
        "print(','.join(m for m in sys.modules if m in unwanted or m.startswith(below)))\n"
    )
    argv = [sys.executable, "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ""
