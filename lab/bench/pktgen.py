"""trafgen (netsniff-ng, a Debian package) as the bench's packet generator: minimum-size
UDP frames out of one namespace's interface, from one pinned core, as fast as it can
(a TX_RING, no qdisc) or at a fixed rate.

The kernel has no pktgen here (CONFIG_NET_PKTGEN unset), and a socket sender tops out far
below what one forwarding core handles. trafgen writes frames straight to the device, so
the frames need the link's MAC addresses; it computes the IP and UDP checksums per frame
(each frame's source port differs: `flows` of them, one conntrack entry each in every
mode).

One machine-wide setting: trafgen's TX_RING keeps every frame in flight charged to its
socket, and a veth peer's queue holds more than the default send buffer (212,992 bytes),
so the ring stalls with EAGAIN. A socket's buffer is fixed when it is made, and
net.core.wmem_default is global (read-only in a namespace), so `flooding` raises it only
until the generator has sent its first frames, then puts it back (trafgen's own tuning,
switched off here, would leave it raised for the whole run).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from ebpflb.errors import EbpflbError
from lab.bench.scenario import Family

TRAFGEN = "trafgen"
FIRST_SPORT = 10_000  # the flows' source ports: `flows` of them from here
PAYLOAD = 18  # bytes of UDP payload: a 60-byte IPv4 frame (the minimum before the FCS)
WMEM_DEFAULT = Path("/proc/sys/net/core/wmem_default")
RING_SNDBUF = 4 << 20  # the generator socket's send buffer while it starts
START_TIMEOUT = 10.0  # seconds for the generator's first frames
STOP_TIMEOUT = 10.0
MAX_SEND = 64  # frames `send` takes: their skbs fit a default send buffer


def available() -> bool:
    return shutil.which(TRAFGEN) is not None


def frame_config(
    family: Family,
    *,
    src_mac: str,
    dst_mac: str,
    src: str,
    dst: str,
    dport: int,
    flows: int,
) -> str:
    """trafgen's packet description: UDP from `src` to `dst`:`dport`, the source port
    counting through `flows` ports frame by frame."""
    if family is Family.IPV6:
        # trafgen 0.6.8 leaves the EtherType 0 under ipv6(): named here.
        eth = f"eth(da={dst_mac}, sa={src_mac}, type=0x86dd)"
        ip = f"ipv6(sa={src}, da={dst}, hl=64)"
    else:
        eth = f"eth(da={dst_mac}, sa={src_mac})"
        ip = f"ipv4(sa={src}, da={dst}, ttl=64)"  # trafgen's default TTL would not forward
    last = FIRST_SPORT + flows - 1
    udp = f"udp(sp=dinc({FIRST_SPORT}, {last}), dp={dport})"
    return f"{{ {eth}, {ip}, {udp}, fill(0x41, {PAYLOAD}) }}"


def tx_packets(netns: str, dev: str) -> int:
    """Frames `dev` in `netns` has sent so far."""
    shown = subprocess.run(
        ["ip", "-n", netns, "-s", "-j", "link", "show", "dev", dev],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return int(json.loads(shown.stdout)[0]["stats64"]["tx"]["packets"])


def _argv(netns: str, dev: str, *extra: str) -> list[str]:
    """trafgen in `netns`, one sender, reading its frames from stdin, leaving the machine's
    socket memory and IRQ affinities alone."""
    return [
        "nsenter", f"--net=/run/netns/{netns}", TRAFGEN, "--dev", dev, "--conf", "-",
        "--cpus", "1", "--no-sock-mem", "--notouch-irq", "--no-cpu-stats", *extra,
    ]  # fmt: skip


def send(netns: str, dev: str, config: str, count: int) -> None:
    """`count` frames of `config` out of `dev` in `netns` through trafgen's TX_RING (each
    frame's headers in a page of the ring, not in the skb's linear data), then return.
    Few enough to fit the default send buffer: no machine-wide setting changed."""
    if not 1 <= count <= MAX_SEND:
        raise ValueError(f"send: 1 to {MAX_SEND} frames, not {count}")
    done = subprocess.run(
        _argv(netns, dev, "--num", str(count)),
        input=config,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        raise EbpflbError(f"bench: trafgen failed ({done.returncode}): {done.stderr[-300:]}")


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGINT to the generator's process group (its forked sender included), then SIGKILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=STOP_TIMEOUT)


@contextlib.contextmanager
def flooding(
    netns: str, dev: str, config: str, *, cpu: int, rate: int | None = None
) -> Iterator[None]:
    """trafgen sending `config` out of `dev` in `netns` from `cpu` for the block: as fast
    as it can, or `rate` frames/s. Raises if no frame left within START_TIMEOUT."""
    argv = ["taskset", "-c", str(cpu), *_argv(netns, dev)]
    if rate is not None:
        argv += ["--rate", f"{rate}pps"]
    before = tx_packets(netns, dev)
    previous = WMEM_DEFAULT.read_text().strip()
    WMEM_DEFAULT.write_text(f"{max(RING_SNDBUF, int(previous))}\n")
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own group: the forked sender stops with it
        )
        try:
            assert proc.stdin is not None
            proc.stdin.write(config)
            proc.stdin.close()
            deadline = time.monotonic() + START_TIMEOUT
            while tx_packets(netns, dev) == before:
                if proc.poll() is not None or time.monotonic() > deadline:
                    _stop(proc)
                    stderr = proc.stderr.read() if proc.stderr else ""
                    raise EbpflbError(f"bench: trafgen sent nothing out of {dev}: {stderr[-300:]}")
                time.sleep(0.05)
        except BaseException:
            _stop(proc)
            raise
    finally:
        WMEM_DEFAULT.write_text(previous + "\n")
    try:
        yield
    finally:
        _stop(proc)
        if proc.stderr:
            proc.stderr.close()
