"""The bytecode store (progcache.py): BCC's bytecode, compiled in a child process, loads
as the very programs BCC compiled (the kernel's tag, a hash of the instructions without map
fds, is equal), on the pinned maps or on maps it creates and pins itself in a new pin
directory, without compiling again; and an agent started from the store translates."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ebpflb.config import Config, XdpMode
from ebpflb.datapath import contract
from ebpflb.datapath.maps import pins
from ebpflb.datapath.programs import compiler, loader, progcache, programset
from ebpflb.datapath.syscall import bpfsys
from lab.harness.agentproc import cleanup_datapath
from lab.harness.netns import Cgroup, Topology
from tests.kernel.conftest import PODS, AgentFactory, headers_here, programs_but_headers, served_by

pytestmark = pytest.mark.kernel

WEB = "10.96.0.10:80"


@pytest.fixture
def pin_dirs() -> Iterator[list[Path]]:
    made: list[Path] = []
    try:
        yield made
    finally:
        for path in made:
            if path.exists():
                for pin in path.iterdir():
                    pin.unlink()
                path.rmdir()


def _config(pin_dirs: list[Path]) -> Config:
    path = Path("/sys/fs/bpf") / f"ebpflb-cache-{uuid.uuid4().hex[:8]}"
    pin_dirs.append(path)
    return Config(
        bpffs_dir=path, slot_pool_size=4096, maglev_max_table_size=1021, xdp=XdpMode.NATIVE
    )


def _tags(lb: loader.SocketLB | loader.NodePortLB) -> dict[str, str]:
    if isinstance(lb, loader.SocketLB):
        fds = lb.program_fds()
    else:
        fds = {name: lb.program_fd(name) for name in (lb.INGRESS, lb.EGRESS, lb.XDP)}
    return {name: bpfsys.prog_info(fd, name).tag for name, fd in fds.items()}


def test_stored_bytecode_loads_the_compiled_programs_on_old_or_new_pins(
    pin_dirs: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(progcache.CACHE_ENV, str(tmp_path / "cache"))
    features = loader.Features(set_retval=False)
    first = _config(pin_dirs)
    compiled = {}
    for kind in (loader.SocketLB, loader.NodePortLB):
        lb = kind(first, features)
        assert lb.origin is programset.Origin.COMPILED
        compiled.update(_tags(lb))
        lb.close()
    assert len(list((tmp_path / "cache").glob("*.json"))) == 3  # sock_lb, nodeport, xdp
    # BCC in this process, for the reference: the child's bytecode is what it compiles.
    flags = contract.cflags(first) + features.cflags()
    bpf = compiler.compile_program(loader.BPF_DIR / "sock_lb.c", flags)
    reference = bpf.load_func(b"ebpflb_connect4", 18, attach_type=10)
    assert bpfsys.prog_info(reference.fd).tag == compiled["ebpflb_connect4"]
    bpf.cleanup()

    def no_compiler(*args: object) -> None:
        raise AssertionError(f"compiled despite the store: {args}")

    monkeypatch.setattr(programset, "compile_in_child", no_compiler)
    fresh = _config(pin_dirs)  # no pins yet: the store's entry creates the maps
    for config in (first, fresh):
        for kind in (loader.SocketLB, loader.NodePortLB):
            lb = kind(config, features)
            try:
                # Never attached, so never pinned: loaded again, not adopted.
                assert lb.origin is programset.Origin.LOADED
                assert _tags(lb) == {k: compiled[k] for k in _tags(lb)}
            finally:
                lb.close()
        expected = pins.expected_map_layout(config)
        pinned = {p.name: pins.pinned_layout(p) for p in config.bpffs_dir.iterdir()}
        assert set(pinned) == set(expected)
        for name, layout in pinned.items():  # a growable map: its initial size
            assert layout is not None and pins.compatible(name, layout, expected[name]), name


def test_an_agent_started_from_the_store_translates(
    topology: Topology,
    cgroup: Cgroup,
    bpffs: Path,
    manifests: Path,
    start_agent: AgentFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(progcache.CACHE_ENV, str(tmp_path / "cache"))
    first = start_agent("--manifests", str(manifests))  # compiles, fills the store
    assert first.status()["programs"]["origin"] == {"socket_lb": "compiled"}
    first.stop()
    assert list((tmp_path / "cache").glob("*.json"))
    # Without the pinned programs (and maps), the next start loads the stored bytecode.
    assert cleanup_datapath(bpffs, cgroup.path).returncode == 0
    agent = start_agent("--manifests", str(manifests))
    assert programs_but_headers(agent.status()) == {
        "replaced_previous": 0,
        "origin": {"socket_lb": "loaded"},
    }
    # as the stored bytecode recorded it
    assert agent.status()["programs"]["headers"] == {"socket_lb": headers_here()}
    counts = served_by(topology.requests(topology.node_ns, "tcp", WEB, 60, cgroup))
    assert set(counts) == set(PODS)
