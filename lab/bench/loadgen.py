"""The bench's connection load generator: connbench.c, compiled once, run in namespaces.

A Python client spends more time in the interpreter than the kernel spends on a connect(),
which would hide the differences between proxies that `ebpflb bench` measures. So the
loop is C (lab/bench/connbench.c, libc only); this module compiles it into a cache
directory and runs it:

- `latency()`: C sequential connects to "service i" (base + i + 1, as in scenario.py),
  each connect() timed alone; RST on close, so no TIME_WAIT piles up.
- `rate()`: as many sequential connections as possible for D seconds, optionally with a
  16-byte request and response on each.
- `start_server()`: `connbench serve` in a namespace (IPv4, or IPv6 with `ipv6`); on stop
  it reports how many connections it accepted and on how many distinct local addresses.

Clients connect in the family of their base address (IPv4 or IPv6).

Processes enter a namespace with `nsenter --net` and are moved into a cgroup (if given)
before that, from a preexec_fn, so the cgroup's socket programs apply to them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ebpflb.errors import ConfigError, EbpflbError

if TYPE_CHECKING:
    from lab.harness.netns import Cgroup, Namespaces

SOURCE = Path(__file__).with_name("connbench.c")
CFLAGS = ("-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread")
DEFAULT_CACHE = Path.home() / ".cache" / "ebpflb"
READY_TIMEOUT = 10.0  # seconds for `serve` to say "ready"


# ---- build ---------------------------------------------------------------------------


def binary_name(source: bytes, cflags: Sequence[str] = CFLAGS) -> str:
    """The cached binary's name: a changed source or changed flags give another file."""
    digest = hashlib.sha256(source + b"\0" + " ".join(cflags).encode()).hexdigest()
    return f"connbench-{digest[:16]}"


def build(cache_dir: Path | None = None, *, source: Path = SOURCE) -> Path:
    """Compile connbench.c unless the cache already holds this source's binary; its path."""
    cache = cache_dir if cache_dir is not None else DEFAULT_CACHE
    text = source.read_bytes()
    target = cache / binary_name(text)
    if os.access(target, os.X_OK):
        return target
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ConfigError(
            "gcc not found: the bench compiles its load generator (apt-get install gcc)"
        )
    cache.mkdir(parents=True, exist_ok=True)
    # Compile to a private name, then rename: a concurrent build of the same source
    # replaces the file with an identical one, and nobody runs a half-written binary.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=cache)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        done = subprocess.run(
            [gcc, *CFLAGS, "-o", str(tmp), str(source)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise EbpflbError(f"compiling {source} failed:\n{done.stderr.strip()[-2000:]}")
        tmp.chmod(0o755)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


# ---- results -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatencyResult:
    samples_ns: list[int]  # one per successful connect(), in order
    errors: int
    first_error: str | None


@dataclass(frozen=True, slots=True)
class RateResult:
    connections: int  # successful ones
    seconds: float
    errors: int
    first_error: str | None

    @property
    def rate(self) -> float:
        """Successful connections per second."""
        return self.connections / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class ServerStats:
    accepted: int
    requests: int  # connections that sent a request and were answered
    local_addresses: int  # distinct local addresses accepted on (a lower bound past 32768)


# ---- clients -------------------------------------------------------------------------


def _in_netns(netns: str, argv: Sequence[str]) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{netns}", *argv]


def _target_args(
    base: str, port: int, index: int | None, random_count: int | None, cpu: int | None
) -> list[str]:
    if (index is None) == (random_count is None):
        raise ConfigError("connbench: give exactly one of index and random_count")
    args = ["--base", base, "--port", str(port)]
    args += ["--index", str(index)] if index is not None else ["--random", str(random_count)]
    return args + (["--cpu", str(cpu)] if cpu is not None else [])


def _run_client(
    netns: str, args: list[str], cgroup: Cgroup | None, timeout: float
) -> dict[str, Any]:
    argv = _in_netns(netns, [str(build()), *args])
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=cgroup.enter if cgroup else None,
        )
    except subprocess.TimeoutExpired as exc:
        raise EbpflbError(f"connbench {args[0]} in {netns} ran over {timeout:.0f} s") from exc
    if done.returncode != 0:
        raise EbpflbError(
            f"connbench {args[0]} in {netns} failed ({done.returncode}): {done.stderr.strip()!r}"
        )
    try:
        result = json.loads(done.stdout)
        if not isinstance(result, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise EbpflbError(
            f"connbench {args[0]} in {netns}: malformed output {done.stdout[:200]!r}"
            f" (stderr {done.stderr.strip()!r})"
        ) from exc
    return result


# Each connect's (and response's) limit: past the first SYN retransmission (Linux's initial
# RTO is 1 s), so a SYN dropped by a server's full accept queue on a loaded machine makes a
# slow sample, not a failed connection; a path that drops every SYN still fails.
CONNECT_TIMEOUT_S = 3.0


def latency(
    netns: str,
    base: str,
    port: int,
    connects: int,
    *,
    index: int | None = None,
    random_count: int | None = None,
    cpu: int | None = None,
    cgroup: Cgroup | None = None,
    timeout: float = CONNECT_TIMEOUT_S,
    seed: int = 1,
) -> LatencyResult:
    """`connects` sequential connects from `netns` to service `index` (base + index + 1) or
    to a uniformly random one of `random_count`; `timeout` is each connect's, in seconds."""
    args = ["latency", *_target_args(base, port, index, random_count, cpu)]
    args += ["--connects", str(connects), "--seed", str(seed)]
    args += ["--timeout-ms", str(max(1, round(timeout * 1000)))]
    out = _run_client(netns, args, cgroup, timeout=30 + connects * timeout)
    try:
        return LatencyResult(
            [int(s) for s in out["samples_ns"]], int(out["errors"]), out["first_error"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EbpflbError(f"connbench latency: unexpected output {out!r:.200}") from exc


def rate(
    netns: str,
    base: str,
    port: int,
    seconds: float,
    *,
    index: int | None = None,
    random_count: int | None = None,
    cpu: int | None = None,
    cgroup: Cgroup | None = None,
    request: bool = False,
    timeout: float = CONNECT_TIMEOUT_S,
    seed: int = 1,
) -> RateResult:
    """Sequential connections from `netns` for `seconds` (with a 16-byte request and
    response each if `request`); `timeout` bounds each connect and response wait."""
    args = ["rate", *_target_args(base, port, index, random_count, cpu)]
    args += ["--seconds", str(seconds), "--seed", str(seed)]
    args += ["--timeout-ms", str(max(1, round(timeout * 1000)))]
    args += ["--request"] if request else []
    out = _run_client(netns, args, cgroup, timeout=30 + seconds + 3 * timeout)
    return _rate_result(out, "connections", "rate")


def _rate_result(out: dict[str, Any], count: str, command: str) -> RateResult:
    """A rate or rr client's JSON line; `count` names its successes' field."""
    try:
        return RateResult(
            int(out[count]), float(out["seconds"]), int(out["errors"]), out["first_error"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EbpflbError(f"connbench {command}: unexpected output {out!r:.200}") from exc


def request_response(
    netns: str,
    base: str,
    port: int,
    seconds: float,
    flows: int,
    *,
    new_connection: bool,
    index: int,
    cpu: int | None = None,
    cgroup: Cgroup | None = None,
    timeout: float = CONNECT_TIMEOUT_S,
) -> RateResult:
    """`flows` flows at once from `netns` for `seconds`, each a 16-byte request and its
    response after another: on one connection per flow (RR), or a new connection per
    request (CRR, `new_connection`). `connections` of the result counts transactions."""
    args = ["rr", *_target_args(base, port, index, None, cpu)]
    args += ["--seconds", str(seconds), "--flows", str(flows)]
    args += ["--timeout-ms", str(max(1, round(timeout * 1000)))]
    args += ["--new-connection"] if new_connection else []
    out = _run_client(netns, args, cgroup, timeout=30 + seconds + 3 * timeout)
    return _rate_result(out, "transactions", "rr")


# ---- server --------------------------------------------------------------------------


class Server:
    """A running `connbench serve`; stop() (or leaving the `with`) ends it by its PID."""

    def __init__(self, proc: subprocess.Popen[str], netns: str) -> None:
        self.proc = proc
        self.netns = netns
        self.stats: ServerStats | None = None

    def stop(self) -> ServerStats:
        """SIGTERM the server and return its counters (it prints them on the way out)."""
        if self.stats is not None:
            return self.stats
        # nsenter exec()s connbench, so this PID is the server itself (and Popen does not
        # signal a PID it has already reaped).
        self.proc.terminate()
        try:
            out, err = self.proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise EbpflbError(f"connbench serve in {self.netns} ignored SIGTERM") from None
        lines = out.strip().splitlines()
        try:
            fields = json.loads(lines[-1])
            self.stats = ServerStats(
                int(fields["accepted"]), int(fields["requests"]), int(fields["local_addresses"])
            )
        except (IndexError, KeyError, TypeError, ValueError) as exc:
            raise EbpflbError(
                f"connbench serve in {self.netns} exited {self.proc.returncode}"
                f" without counters: {out[-200:]!r} (stderr {err.strip()!r})"
            ) from exc
        return self.stats

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.stop()
            return
        with contextlib.suppress(EbpflbError):  # don't hide the exception in flight
            self.stop()


def start_server(
    netns: str,
    port: int,
    *,
    cpu: int | None = None,
    lifetime: float = 600,
    threads: int = 1,
    cgroup: Cgroup | None = None,
    owner: Namespaces | None = None,
    ipv6: bool = False,
) -> Server:
    """Start `connbench serve` on 0.0.0.0:port (on [::]:port, IPv6 only, if `ipv6`) in
    `netns`; returns once it listens. It
    exits by itself after `lifetime` seconds, so a forgotten server does not linger, and
    if `owner` is given, its close() kills the server too (a safety net for tests)."""
    args = ["serve", "--port", str(port), "--lifetime", str(lifetime), "--threads", str(threads)]
    args += ["--cpu", str(cpu)] if cpu is not None else []
    args += ["--ipv6"] if ipv6 else []
    proc = subprocess.Popen(
        _in_netns(netns, [str(build()), *args]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=cgroup.enter if cgroup else None,
    )
    if owner is not None:
        owner.processes.append(proc)
    assert proc.stdout is not None and proc.stderr is not None
    ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "ready":
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
        raise EbpflbError(f"connbench serve in {netns} did not start: {err.strip()!r}")
    return Server(proc, netns)
