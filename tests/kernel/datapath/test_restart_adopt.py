"""Programs pinned next to the maps, keyed by their build hash: a restarted agent whose
programs are unchanged adopts them (no compile, no load: the same program ids stay
attached), one whose build changed compiles in a child, attaches the new programs next to
the old, detaches those and re-pins; translation never stops either way, and the agent
process never has libbcc or LLVM mapped."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ebpflb.datapath.maps import pins
from ebpflb.datapath.programs import loader, progcache
from ebpflb.datapath.syscall import bpfsys
from lab.harness.agentproc import AgentProcess
from lab.harness.connload import Load
from lab.harness.netns import Cgroup, Topology
from tests.kernel.conftest import PODS, AgentFactory, headers_here, programs_but_headers

pytestmark = pytest.mark.kernel

WEB = "10.96.0.10:80"
COMPILER_LIBRARIES = ("libbcc", "libLLVM", "libclang")


def attached_ids(cgroup: Path) -> dict[str, set[int]]:
    """Program ids attached to each socket-LB hook of `cgroup`."""
    fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return {
            hook.name: set(bpfsys.prog_query(fd, hook.attach_type, str(cgroup)))
            for hook in loader.SockHook
        }
    finally:
        os.close(fd)


def program_pins(bpffs: Path) -> set[str]:
    return {p.name for p in bpffs.iterdir() if pins.PROGRAM_PIN.match(p.name)}


def compiler_libraries(agent: AgentProcess) -> list[str]:
    """Mapped files of the agent process that belong to BCC or LLVM."""
    maps = Path(f"/proc/{agent.proc.pid}/maps").read_text().splitlines()
    return sorted(
        {line.split()[-1] for line in maps if any(lib in line for lib in COMPILER_LIBRARIES)}
    )


def test_a_restart_adopts_the_pinned_programs_without_compiling(
    topology: Topology,
    cgroup: Cgroup,
    bpffs: Path,
    manifests: Path,
    start_agent: AgentFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    record_property: Any,
) -> None:
    store = tmp_path / "store"
    monkeypatch.setenv(progcache.CACHE_ENV, str(store))
    first = start_agent("--manifests", str(manifests))
    assert first.status()["programs"]["origin"] == {"socket_lb": "compiled"}
    assert compiler_libraries(first) == []  # it compiled, in a child
    before = attached_ids(cgroup.path)
    pinned = program_pins(bpffs)
    assert len(pinned) == len(loader.SockHook)
    # With the store emptied, a compile would leave an entry and a load would need one.
    for entry in store.iterdir():
        entry.unlink()

    load = Load(topology, topology.node_ns, cgroup, WEB, seconds=5, rate=300)
    first.stop()
    second = start_agent("--manifests", str(manifests))
    result = load.result()

    status = second.status()
    assert programs_but_headers(status) == {
        "replaced_previous": 0,
        "origin": {"socket_lb": "adopted"},
    }
    assert attached_ids(cgroup.path) == before  # the very programs, never detached
    assert program_pins(bpffs) == pinned
    assert list(store.iterdir()) == []  # nothing compiled
    assert compiler_libraries(second) == []
    first_sync = status["sync"]["first"]
    assert (first_sync["added"], first_sync["updated"], first_sync["removed"]) == (0, 0, 0)
    record_property("adopt_seconds", status["compile_seconds"]["socket_lb"])
    record_property("restart_to_ready_seconds", status["phases"]["first_sync"])
    assert result["failed"] == 0, result["failures"]
    assert result["ok"] == result["attempted"] > 1000
    assert set(result["servers"]) == set(PODS)


def test_a_changed_build_compiles_then_replaces_the_programs_without_a_gap(
    topology: Topology,
    cgroup: Cgroup,
    bpffs: Path,
    manifests: Path,
    start_agent: AgentFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = tmp_path / "store"
    monkeypatch.setenv(progcache.CACHE_ENV, str(store))
    first = start_agent("--manifests", str(manifests))
    before = attached_ids(cgroup.path)
    old_pins = program_pins(bpffs)

    load = Load(topology, topology.node_ns, cgroup, WEB, seconds=6, rate=300)
    first.stop()
    # Another flow hash seed is another -D flag: another build of the same source.
    second = start_agent("--manifests", str(manifests), "--hash-seed", "another-seed")
    result = load.result()

    status = second.status()
    assert programs_but_headers(status) == {
        "replaced_previous": len(loader.SockHook),
        "origin": {"socket_lb": "compiled"},
    }
    assert status["programs"]["headers"] == {"socket_lb": headers_here()}
    after = attached_ids(cgroup.path)
    assert all(len(ids) == 1 for ids in after.values())  # the new ones only
    # /status names exactly the programs now attached, by the ids bpftool shows.
    assert set(status["programs"]["ids"].values()) == set().union(*after.values())
    assert not set().union(*after.values()) & set().union(*before.values())
    new_pins = program_pins(bpffs)
    assert len(new_pins) == len(loader.SockHook) and not new_pins & old_pins
    assert len(list(store.glob("*.json"))) == 2  # both builds
    assert compiler_libraries(second) == []
    assert result["failed"] == 0, result["failures"]
    assert result["ok"] == result["attempted"] > 1000
    assert set(result["servers"]) == set(PODS)

    # And back: the first build's bytecode is in the store, loaded without a compile.
    second.stop()
    third = start_agent("--manifests", str(manifests))
    assert third.status()["programs"]["origin"] == {"socket_lb": "loaded"}
    assert program_pins(bpffs) != new_pins
