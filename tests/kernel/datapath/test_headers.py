"""A node without kernel headers: the agent compiles its programs with a tree of its own
and serves a ClusterIP, with /lib/modules/<release> and /usr/src empty for it (a private
mount namespace, lab/harness/mountns.py), no stored bytecode and fresh pins, so the
programs really are compiled at its start.

- bundled: the tree the image ships, built here by scripts/bundle-headers.sh from
  Debian's headers packages (the image's build runs the same script);
- kheaders: the kernel's /sys/kernel/kheaders.tar.xz, which this kernel does not have
  (CONFIG_IKHEADERS is off), stood in for by an archive of that tree laid out as kheaders
  is (./include, ./arch/<arch>/include) and named by EBPFLB_KHEADERS; it is extracted into
  a private directory that is gone once the agent exits;
- neither: the agent stops at start-up, before anything is attached.

Which tree is found in what order, and the extraction's safety, are
tests/unit/datapath/test_headers.py's.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab.harness.agentproc import AgentProcess
from lab.harness.mountns import hiding
from lab.harness.netns import Cgroup, Topology
from tests import REPO
from tests.kernel.conftest import PODS, served_by

pytestmark = pytest.mark.kernel

WEB = "10.96.0.10:80"
NO_HOST_HEADERS = [f"/lib/modules/{platform.release()}", "/usr/src"]


@pytest.fixture(scope="module")
def bundled_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's header tree, made the image's way (outside the hidden directories)."""
    tree = tmp_path_factory.mktemp("headers") / "kernel-headers"
    subprocess.run(
        [str(REPO / "scripts/bundle-headers.sh"), str(tree)],
        check=True,
        capture_output=True,
        text=True,
    )
    return tree


Start = Callable[[dict[str, str]], AgentProcess]


@pytest.fixture
def start_without_host_headers(
    manifests: Path, bpffs: Path, cgroup: Cgroup, tmp_path: Path
) -> Iterator[Start]:
    """Start the agent on examples/ with /lib/modules/<release> and /usr/src empty for it,
    no stored bytecode, and `env` added; every agent started is stopped."""
    for hidden in NO_HOST_HEADERS:
        assert Path(hidden).is_dir(), f"{hidden}: the test hides it, so it must exist"
    agents: list[AgentProcess] = []

    def start(env: dict[str, str]) -> AgentProcess:
        agent = AgentProcess(
            ["--manifests", str(manifests), "--bpffs", str(bpffs), "--cgroup", str(cgroup.path)],
            log_file=tmp_path / f"agent{len(agents)}.log",
            preexec_fn=hiding(NO_HOST_HEADERS),
            # No stored bytecode to fall back on: the programs are compiled now.
            env={"EBPFLB_PROGRAM_CACHE": "", **env},
        )
        agents.append(agent)
        return agent

    try:
        yield start
    finally:
        for agent in agents:
            agent.stop()


def serves_the_clusterip(
    agent: AgentProcess, topology: Topology, cgroup: Cgroup
) -> dict[str, object]:
    agent.wait_ready()
    counts = served_by(topology.requests(topology.node_ns, "tcp", WEB, 30, cgroup))
    assert set(counts) == set(PODS)
    programs: dict[str, object] = agent.status()["programs"]
    assert programs["origin"] == {"socket_lb": "compiled"}, programs
    return programs


def test_compiles_with_the_bundled_tree_when_the_node_has_none(
    bundled_tree: Path, start_without_host_headers: Start, topology: Topology, cgroup: Cgroup
) -> None:
    agent = start_without_host_headers({"EBPFLB_BUNDLED_HEADERS": str(bundled_tree)})
    programs = serves_the_clusterip(agent, topology, cgroup)
    release = (bundled_tree / "include/generated/utsrelease.h").read_text().split('"')[1]
    assert programs["headers"] == {"socket_lb": f"bundled {bundled_tree} ({release})"}


def test_compiles_with_kheaders_extracted_privately_and_removes_them(
    bundled_tree: Path,
    start_without_host_headers: Start,
    topology: Topology,
    cgroup: Cgroup,
    tmp_path: Path,
) -> None:
    archive = tmp_path / "kheaders.tar.xz"
    subprocess.run(
        ["tar", "-C", str(bundled_tree), "-cJf", str(archive), "./include", "./arch"],
        check=True,
        env={**os.environ, "XZ_OPT": "-0"},  # fast: the archive only lives for this test
    )
    agent = start_without_host_headers(
        {"EBPFLB_BUNDLED_HEADERS": str(tmp_path / "none"), "EBPFLB_KHEADERS": str(archive)}
    )
    programs = serves_the_clusterip(agent, topology, cgroup)
    shown = programs["headers"]["socket_lb"]  # type: ignore[index]
    source, extracted, _release = str(shown).split(" ", 2)
    assert source == "kheaders"
    assert Path(extracted).name.startswith("ebpflb-kheaders-")
    assert (Path(extracted).stat().st_mode & 0o777) == 0o700
    agent.stop()
    assert not Path(extracted).exists()


def test_without_any_tree_the_agent_stops_before_attaching(
    start_without_host_headers: Start, cgroup: Cgroup, tmp_path: Path
) -> None:
    agent = start_without_host_headers(
        {
            "EBPFLB_BUNDLED_HEADERS": str(tmp_path / "none"),
            "EBPFLB_KHEADERS": str(tmp_path / "none.tar.xz"),
        }
    )
    assert agent.proc.wait(timeout=60) != 0
    attached = subprocess.run(
        ["bpftool", "cgroup", "show", str(cgroup.path)], capture_output=True, text=True
    )
    assert "connect4" not in attached.stdout, attached.stdout
