"""The wheel is the product: built from this checkout, installed into a fresh virtual
environment outside it (with Debian's bcc made visible as scripts/setup.sh does), its
`ebpflb` compiles the C sources the wheel carries, attaches them and translates a
ClusterIP for a client in a test namespace."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from lab.harness.netns import Cgroup, Topology
from tests import REPO
from tests.kernel.conftest import PODS, served_by

DEBIAN_PYTHON = "/usr/bin/python3"
WEB = "10.96.0.10:80"


def sh(argv: list[str], cwd: Path, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv[:4]} failed: {done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout's pyproject.toml, from a copy of what the image
    build copies (deploy/Containerfile): an in-tree build would pack whatever an earlier
    build left in build/ (setuptools never removes files from it)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "ebpflb", source / "ebpflb", symlinks=True, ignore=ignore)
    shutil.copytree(REPO / "bpf", source / "bpf", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work)]
    sh([*pip_wheel, str(source)], source)
    (built,) = work.glob("ebpflb-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path) -> Path:
    """A venv outside the checkout holding the wheel and its dependencies; its bin/."""
    work = wheel.parent
    venv = work / "venv"
    sh([DEBIAN_PYTHON, "-m", "venv", str(venv)], work)
    # Debian's bcc, and nothing else of Debian's site-packages (scripts/setup.sh).
    purelib = sh(
        [
            str(venv / "bin/python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        work,
    ).strip()
    bcc = sh(
        [DEBIAN_PYTHON, "-c", "import bcc, os; print(os.path.dirname(bcc.__file__))"], work
    ).strip()
    (venv / "debian-bcc").mkdir()
    (venv / "debian-bcc" / "bcc").symlink_to(bcc)
    Path(purelib, "debian-bcc.pth").write_text(f"{venv / 'debian-bcc'}\n")
    sh([str(venv / "bin/pip"), "install", "-q", "--disable-pip-version-check", str(wheel)], work)
    return venv / "bin"


def test_wheel_holds_the_agent_alone(wheel: Path) -> None:
    """The bench, the test harness, the kernel matrix and the demo are the lab's (lab/):
    the wheel (and so the image) carries the agent's package and its C sources only."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/", 1)[0] for name in names}
    # The wheel is platform-tagged (the Maglev fill extension): its dist-info folder is
    # named by distribution and version alone, the wheel's first two name fields.
    distribution, version = wheel.name.split("-")[:2]
    assert tops == {"ebpflb", f"{distribution}-{version}.dist-info"}, tops
    packages = {name.rsplit("/", 1)[0] for name in names if name.endswith(".py")}
    assert {"ebpflb/cli", "ebpflb/sync", "ebpflb/datapath/maps"} <= packages
    assert not {p for p in packages if p.startswith(("ebpflb/bench", "ebpflb/testing"))}
    assert "ebpflb/demo.py" not in names
    assert not [n for n in names if n.endswith(".c") and not n.startswith("ebpflb/bpf/")]


def test_wheel_carries_the_c_sources_and_finds_them_as_package_data(installed: Path) -> None:
    where = sh(
        [
            str(installed / "python"),
            "-c",
            "import ebpflb.datapath.programs.loader as l; print(l.BPF_DIR)",
        ],
        installed,
    )
    bpf_dir = Path(where.strip())
    assert bpf_dir.is_relative_to(installed.parent), bpf_dir  # inside the venv, not REPO
    shipped = sorted(p.relative_to(bpf_dir).as_posix() for p in bpf_dir.rglob("*.[ch]"))
    in_repo = sorted(p.relative_to(REPO / "bpf").as_posix() for p in (REPO / "bpf").rglob("*.[ch]"))
    assert shipped == in_repo


def test_installed_agent_translates_a_clusterip(
    installed: Path, topology: Topology, cgroup: Cgroup, bpffs: Path, manifests: Path
) -> None:
    agent = subprocess.Popen(
        [
            str(installed / "ebpflb"),
            "run",
            "--manifests",
            str(manifests),
            "--bpffs",
            str(bpffs),
            "--cgroup",
            str(cgroup.path),
            "--interfaces=",
            "--pod-interfaces=",  # in this namespace: never the machine's interfaces
            "--conntrack-sysctls=false",  # nor its sysctls
            "--metrics-bind-address=",
        ],
        cwd=installed,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # synced: the frontend is in the pinned maps
            dump = subprocess.run(
                [str(installed / "ebpflb"), "maps", "dump", "--json", "--bpffs", str(bpffs)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if dump.returncode == 0 and any(
                s["frontend"] == f"{WEB}/TCP" and s["backends"]
                for s in json.loads(dump.stdout)["services"]
            ):
                break
            if agent.poll() is not None or time.monotonic() > deadline:
                agent.kill()
                pytest.fail(f"installed agent did not sync: {agent.communicate()[1][-3000:]}")
            time.sleep(0.3)
        counts = served_by(topology.requests(topology.node_ns, "tcp", WEB, 60, cgroup))
        assert set(counts) == set(PODS)
    finally:
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
        if agent.stderr:
            agent.stderr.close()
