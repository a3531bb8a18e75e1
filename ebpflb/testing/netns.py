"""Network namespaces, cgroups and processes for the demo and the kernel tests.

A topology is a "node" namespace with pod namespaces behind veth pairs, routed by /32
routes like many CNIs do. No namespace has a route out of the topology, so a packet that
ebpflb failed to translate (a ClusterIP) dies there instead of leaving the machine.

Processes enter a namespace with `nsenter --net` (not `ip netns exec`, which remounts /sys
and would hide bpffs and cgroup v2) and are moved into a cgroup before entering it, so the
cgroup's socket programs apply to them. Everything is removed by close(), which callers
run in a finally block.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebpflb.datapath.mounts import cgroup2_root

NODE_IP = "10.240.0.1"  # the node namespace's address (on lo)


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@dataclass
class Cgroup:
    """A cgroup v2 directory of our own (never the root) that clients are placed in."""

    path: Path

    @classmethod
    def create(cls, name: str) -> Cgroup:
        path = cgroup2_root() / name
        path.mkdir()
        return cls(path)

    def enter(self) -> None:
        """Move the calling process (used as a preexec_fn) into this cgroup."""
        (self.path / "cgroup.procs").write_text("0")

    def close(self) -> None:
        if not self.path.exists():
            return
        for pid in (self.path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)  # only our test processes live here
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        self.path.rmdir()


@dataclass
class Pod:
    name: str
    netns: str
    ip: str


@dataclass
class Topology:
    prefix: str
    node_ip: str = NODE_IP
    pods: dict[str, Pod] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    @classmethod
    def create(cls, prefix: str | None = None, node_ip: str = NODE_IP) -> Topology:
        topo = cls(prefix or f"elb{uuid.uuid4().hex[:6]}", node_ip)
        try:
            topo._add_namespace(topo.node_ns)
            sh("ip", "-n", topo.node_ns, "addr", "add", f"{node_ip}/32", "dev", "lo")
        except BaseException:
            topo.close()
            raise
        return topo

    @property
    def node_ns(self) -> str:
        return f"{self.prefix}-node"

    def _add_namespace(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")
        for key in ("all", "default", "lo"):
            sh("ip", "netns", "exec", name, "sysctl", "-qw", f"net.ipv4.conf.{key}.rp_filter=0")

    def add_pod(self, name: str, ip: str) -> Pod:
        netns = f"{self.prefix}-{name}"
        self._add_namespace(netns)
        host_if = f"v{self.prefix[-6:]}{len(self.pods)}"[:15]
        sh(
            "ip",
            "link",
            "add",
            host_if,
            "netns",
            self.node_ns,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            netns,
        )
        sh("ip", "-n", netns, "addr", "add", f"{ip}/32", "dev", "eth0")
        sh("ip", "-n", netns, "link", "set", "eth0", "up")
        sh("ip", "-n", self.node_ns, "link", "set", host_if, "up")
        # Pod -> node: on-link route to the node address only (no default route).
        sh("ip", "-n", netns, "route", "add", self.node_ip, "dev", "eth0")
        sh("ip", "-n", self.node_ns, "route", "add", f"{ip}/32", "dev", host_if)
        pod = Pod(name, netns, ip)
        self.pods[name] = pod
        return pod

    def spawn(
        self, netns: str, argv: Sequence[str], cgroup: Cgroup | None = None
    ) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{netns}", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=cgroup.enter if cgroup else None,
        )
        self.processes.append(proc)
        return proc

    def run(
        self, netns: str, argv: Sequence[str], cgroup: Cgroup | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["nsenter", f"--net=/run/netns/{netns}", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=cgroup.enter if cgroup else None,
        )

    def start_server(
        self, pod: Pod, *, tcp: Sequence[int] = (), udp: Sequence[int] = (), lifetime: float = 300
    ) -> subprocess.Popen[str]:
        argv = [
            sys.executable,
            "-m",
            "ebpflb.testing.echo",
            "serve",
            "--name",
            pod.name,
            "--lifetime",
            str(lifetime),
        ]
        argv += [a for p in tcp for a in ("--tcp", str(p))]
        argv += [a for p in udp for a in ("--udp", str(p))]
        proc = self.spawn(pod.netns, argv)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(
                f"server in {pod.netns} did not start: {proc.stderr.read() if proc.stderr else ''}"
            )
        return proc

    def requests(
        self,
        netns: str,
        mode: str,
        target: str,
        count: int,
        cgroup: Cgroup | None,
        *extra: str,
        timeout: float = 1.0,
    ) -> list[dict[str, Any]]:
        """Run `count` echo requests from `netns`; one result dict per request."""
        argv = [
            sys.executable,
            "-m",
            "ebpflb.testing.echo",
            mode,
            target,
            "--count",
            str(count),
            "--timeout",
            str(timeout),
            *extra,
        ]
        done = self.run(netns, argv, cgroup, timeout=30 + count * timeout)
        if done.returncode != 0:
            raise RuntimeError(f"client failed: {done.stderr}")
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]

    def close(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()
        self.processes.clear()
        for name in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.namespaces.clear()

    def __enter__(self) -> Topology:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
