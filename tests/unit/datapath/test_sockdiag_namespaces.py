"""Where the agent looks for connected UDP sockets to destroy: every network namespace a
visible process is in, and those only mounted (a pod's, when the agent has no hostPID)."""

from __future__ import annotations

import os
from pathlib import Path

from ebpflb.datapath.syscall.sockdiag import network_namespaces


def namespace_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    return path


def test_mounted_namespaces_count_once_each_next_to_the_processes(tmp_path: Path) -> None:
    proc, mounts = tmp_path / "proc", tmp_path / "netns"
    host = namespace_file(proc / "1" / "ns" / "net")
    os.link(host, namespace_file(proc / "7" / "ns" / "x").parent / "net")  # same namespace
    namespace_file(proc / "self" / "ns" / "net")  # not a PID: skipped
    pod = namespace_file(mounts / "cni-1234")
    os.link(host, mounts / "host-alias")  # the host's, mounted as well: counted once
    found = network_namespaces(proc, (mounts, tmp_path / "missing"))
    assert sorted(found.values()) == sorted([host, pod])


def test_without_mounts_only_the_visible_processes_namespaces(tmp_path: Path) -> None:
    host = namespace_file(tmp_path / "proc" / "1" / "ns" / "net")
    assert list(network_namespaces(tmp_path / "proc", ()).values()) == [host]
