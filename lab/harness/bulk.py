"""Bulk TCP between namespaces with iperf3 (Debian's), for the bulk-transfer kernel test
and `ebpflb bench bulk`: a bounded server, one transfer of a fixed size either way, and
the offloads a real NIC has (GRO on).

A transfer moves a byte count rather than running for a time, so a stalled path (the
0.13 Mbit/s of bulk TCP through a NodePort when GRO aggregates were dropped) fails by its
timeout instead of reporting a small number.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass

from lab.harness.agentproc import TIMEOUT_SCALE
from lab.harness.netns import Namespaces, sh

IPERF3 = "iperf3"
# Waits, multiplied by EBPFLB_TEST_TIMEOUT_SCALE: under emulation (the kernel matrix) and
# a machine busy with other tests, iperf3 starts and connects many times slower.
SERVER_START_S = 10.0
CONNECT_TIMEOUT_S = 5.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class BulkError(RuntimeError):
    """A transfer did not complete: iperf3's own error, or its timeout."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """One completed iperf3 transfer, as its JSON report gives it."""

    sent: int  # bytes the sender wrote
    received: int  # bytes the receiver read while it measured
    seconds: float  # the receiver's measuring time
    retransmits: int  # the sender's TCP retransmissions

    @property
    def gbit_s(self) -> float:
        return self.received * 8 / self.seconds / 1e9

    def size_for(self, seconds: float, at_least: int) -> int:
        """Bytes that take `seconds` at this transfer's rate (never below at_least)."""
        return max(at_least, int(self.received / self.seconds * seconds))


def available() -> bool:
    return shutil.which(IPERF3) is not None


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the process that started it ends (a crashed
    test leaves no server behind; iperf3 has no lifetime option of its own)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def start_server(namespaces: Namespaces, netns: str, port: int) -> None:
    """An iperf3 server on `port` (both families) in `netns`, ended by the namespaces'
    close() (nsenter execs iperf3 itself, so that kill reaches it) or with this process;
    returns once it listens (seen by `ss`, not by its output). Its reports go nowhere: an
    iperf3 server given a --logfile reopens it for every test and exits once the file is
    gone, which refused every transfer after the first."""
    argv = [IPERF3, "-s", "-p", str(port)]
    proc = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{netns}", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=_die_with_parent,
    )
    namespaces.processes.append(proc)
    deadline = time.monotonic() + SERVER_START_S * TIMEOUT_SCALE
    while time.monotonic() < deadline and proc.poll() is None:
        if _listening(netns, port):
            return
        time.sleep(0.05)
    raise BulkError(f"iperf3 server on port {port} in {netns} did not start")


def _listening(netns: str, port: int) -> bool:
    shown = subprocess.run(
        ["ip", "netns", "exec", netns, "ss", "-Hltn", f"sport = :{port}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return bool(shown.stdout.strip())


def transfer(
    namespaces: Namespaces,
    netns: str,
    host: str,
    port: int,
    *,
    size: int | None = None,
    seconds: int | None = None,
    reverse: bool = False,
    timeout: float = 120.0,
) -> Transfer:
    """Move `size` bytes (or send for whole `seconds`: iperf3 reads -t as an integer, 0
    meaning forever) from `netns` to host:port (reverse: from the server to `netns`)."""
    if size is None and (seconds is None or seconds < 1):
        raise ValueError(f"transfer: a size or at least 1 second, not {seconds!r}")
    amount = ["-n", str(size)] if size is not None else ["-t", str(seconds)]
    connect_ms = str(int(CONNECT_TIMEOUT_S * TIMEOUT_SCALE * 1000))
    argv = [IPERF3, "-c", host, "-p", str(port), *amount, "-J", "--connect-timeout", connect_ms]
    timeout *= TIMEOUT_SCALE
    if reverse:
        argv.append("-R")
    try:
        done = namespaces.run(netns, argv, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        what = f"{size} bytes" if size is not None else f"a {seconds} s transfer"
        raise BulkError(f"{what} to {host}:{port} not done within {timeout:.0f} s") from exc
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise BulkError(f"iperf3 to {host}:{port}: {done.stderr.strip() or done.stdout}") from exc
    if "error" in report:
        raise BulkError(f"iperf3 to {host}:{port}: {report['error']}")
    received, sent = report["end"]["sum_received"], report["end"]["sum_sent"]
    return Transfer(
        int(sent["bytes"]),
        int(received["bytes"]),
        float(received["seconds"]),
        int(sent.get("retransmits", 0)),
    )


def gro_on(namespaces: Namespaces, links: Iterable[tuple[str, str]]) -> None:
    """GRO on for each (netns, interface), as a real NIC has it; the other offloads stay as
    the kernel made them. (A veth aggregates without an XDP program since 5.13; on older
    kernels the switch is accepted and TSO from local senders still makes aggregates.)"""
    for netns, ifname in links:
        sh("ip", "netns", "exec", netns, "ethtool", "-K", ifname, "gro", "on")


def host_links(namespaces: Namespaces, wire_ns: str) -> list[tuple[str, str]]:
    """Every veth of the namespaces but the wire's (netns, interface): the hosts' NICs.
    The wire is a switch, and a switch does not aggregate."""
    found = []
    for netns in namespaces.namespaces:
        if netns == wire_ns:
            continue
        shown = subprocess.run(
            ["ip", "-n", netns, "-j", "-d", "link", "show", "type", "veth"],
            capture_output=True,
            text=True,
            check=True,
        )
        found += [(netns, link["ifname"]) for link in json.loads(shown.stdout or "[]")]
    return found
