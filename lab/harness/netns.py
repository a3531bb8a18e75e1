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

from ebpflb.datapath.syscall.mounts import cgroup2_root

NODE_IP = "10.240.0.1"  # the node namespace's address (on lo)


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def remove_cgroup_dir(path: Path, tries: int = 50) -> None:
    """rmdir a cgroup, retrying while the kernel still counts exiting processes in it;
    the last attempt's OSError propagates."""
    for _ in range(tries - 1):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    path.rmdir()


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
        remove_cgroup_dir(self.path)


@dataclass
class Pod:
    name: str
    netns: str
    ip: str
    ip6: str | None = None  # its IPv6 address in a dual-stack Cluster


def _sysctl(netns: str, *settings: str) -> None:
    # `ip netns exec` is fine here: sysctl needs only the namespace's /proc/sys/net.
    sh("ip", "netns", "exec", netns, "sysctl", "-qw", *settings)


@dataclass
class Namespaces:
    """Network namespaces and the processes started in them, removed together."""

    prefix: str
    namespaces: list[str] = field(default_factory=list)
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    def add_namespace(self, name: str, *, forwarding: bool = False) -> str:
        netns = f"{self.prefix}-{name}"
        sh("ip", "netns", "add", netns)
        self.namespaces.append(netns)
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        settings = [f"net.ipv4.conf.{key}.rp_filter=0" for key in ("all", "default", "lo")]
        # No duplicate address detection: an IPv6 address is usable the moment it is added
        # (links made later inherit `default`).
        settings += [f"net.ipv6.conf.{key}.accept_dad=0" for key in ("all", "default")]
        if forwarding:
            # A node routes; it must not tell clients to go around it.
            settings += [
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.send_redirects=0",
                "net.ipv4.conf.default.send_redirects=0",
                "net.ipv6.conf.all.forwarding=1",
            ]
        _sysctl(netns, *settings)
        return netns

    def link(self, ns_a: str, if_a: str, ns_b: str, if_b: str) -> None:
        """A veth pair: if_a in ns_a, if_b in ns_b, both up."""
        sh(
            "ip",
            "link",
            "add",
            if_a,
            "netns",
            ns_a,
            "type",
            "veth",
            "peer",
            "name",
            if_b,
            "netns",
            ns_b,
        )
        sh("ip", "-n", ns_a, "link", "set", if_a, "up")
        sh("ip", "-n", ns_b, "link", "set", if_b, "up")

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
        self,
        pod: Pod,
        *,
        tcp: Sequence[int] = (),
        udp: Sequence[int] = (),
        lifetime: float = 300,
        ipv6: bool = False,
    ) -> subprocess.Popen[str]:
        argv = [
            sys.executable,
            "-m",
            "lab.harness.echo",
            "serve",
            "--name",
            pod.name,
            "--lifetime",
            str(lifetime),
        ]
        argv += [a for p in tcp for a in ("--tcp", str(p))]
        argv += [a for p in udp for a in ("--udp", str(p))]
        argv += ["--ipv6"] if ipv6 else []
        proc = self.spawn(pod.netns, argv)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"server in {pod.netns} did not start: {err}")
        return proc

    def echo(
        self,
        netns: str,
        mode: str,
        target: str,
        *extra: str,
        cgroup: Cgroup | None = None,
        timeout: float = 120,
    ) -> list[dict[str, Any]]:
        """Run the echo client in `netns`; its JSON output lines."""
        argv = [sys.executable, "-m", "lab.harness.echo", mode, target, *extra]
        done = self.run(netns, argv, cgroup, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"client failed: {done.stderr}")
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]

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
        return self.echo(
            netns,
            mode,
            target,
            "--count",
            str(count),
            "--timeout",
            str(timeout),
            *extra,
            cgroup=cgroup,
            timeout=30 + count * timeout,
        )

    def offload(self, netns: str, ifname: str, on: bool) -> None:
        """Checksum offload of one interface (off: senders compute complete checksums)."""
        state = "on" if on else "off"
        sh("ip", "netns", "exec", netns, "ethtool", "-K", ifname, "tx", state, "rx", state)

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

    def __enter__(self) -> Namespaces:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Topology(Namespaces):
    """One node namespace with pods behind it: enough for socket-LB (ClusterIP)."""

    node_ip: str = NODE_IP
    pods: dict[str, Pod] = field(default_factory=dict)

    @classmethod
    def create(cls, prefix: str | None = None, node_ip: str = NODE_IP) -> Topology:
        topo = cls(prefix or f"elb{uuid.uuid4().hex[:6]}", node_ip=node_ip)
        try:
            topo.add_namespace("node")
            sh("ip", "-n", topo.node_ns, "addr", "add", f"{node_ip}/32", "dev", "lo")
        except BaseException:
            topo.close()
            raise
        return topo

    @property
    def node_ns(self) -> str:
        return f"{self.prefix}-node"

    def add_pod(self, name: str, ip: str) -> Pod:
        netns = self.add_namespace(name)
        host_if = f"v{self.prefix[-6:]}{len(self.pods)}"[:15]
        self.link(self.node_ns, host_if, netns, "eth0")
        sh("ip", "-n", netns, "addr", "add", f"{ip}/32", "dev", "eth0")
        # Pod -> node: on-link route to the node address only (no default route).
        sh("ip", "-n", netns, "route", "add", self.node_ip, "dev", "eth0")
        sh("ip", "-n", self.node_ns, "route", "add", f"{ip}/32", "dev", host_if)
        pod = Pod(name, netns, ip)
        self.pods[name] = pod
        return pod


def attach_xdp_pass(namespaces: Namespaces, netns: str, ifnames: Sequence[str]) -> None:
    """An XDP_PASS program on veth ends in `netns`: a veth drops the frames its peer sends
    with XDP_TX or XDP_REDIRECT unless its own end runs an XDP program. The attachment
    outlives the loading process and goes with the namespace."""
    code = (
        "import sys\nfrom bcc import BPF\n"
        "b = BPF(text=b'int wire_pass(struct xdp_md *ctx) { return XDP_PASS; }')\n"
        "fn = b.load_func(b'wire_pass', BPF.XDP)\n"
        "for port in sys.argv[1:]:\n    BPF.attach_xdp(port, fn, 0)\n"
    )
    done = namespaces.run(netns, [sys.executable, "-c", code, *ifnames])
    if done.returncode != 0:
        raise RuntimeError(f"XDP on {', '.join(ifnames)} in {netns} failed: {done.stderr}")
