"""Bounded, continuous client load for the zero-loss tests: new TCP connections to one
address at a steady rate for a given time, each one a full exchange with the echo server
(connect, read its reply, close). Prints a JSON line when it starts, and one JSON summary
when done.

    python -m lab.harness.connload 10.96.0.10:80 --seconds 10 --rate 400

Bounded three ways: the duration, the rate (at most rate x seconds connections) and a
timeout per connection. A connection fails when connect, the reply or the timeout fails;
failures are counted by errno, with the time (seconds after the start) of the first few.
Started inside a test namespace and cgroup, like the echo client.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import select
import sys
import time
from typing import Any

from lab.harness.agentproc import TIMEOUT_SCALE
from lab.harness.echo import _addr, tcp_request
from lab.harness.netns import Cgroup, Namespaces

FAILURES_KEPT = 20  # failed connections listed with their time
STARTED = {"event": "started"}  # the first line: the client is about to connect
START_TIMEOUT = 30.0  # seconds for the client to start (Python's start-up; scaled)


def run(target: tuple[str, int], seconds: float, rate: float, timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    interval = 1.0 / rate
    servers: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    failures: list[dict[str, Any]] = []
    attempted = 0
    while True:
        due = started + attempted * interval
        now = time.monotonic()
        if due - started >= seconds:
            break
        if due > now:
            time.sleep(due - now)
        attempted += 1
        result = tcp_request(target, timeout)
        if result["ok"]:
            servers[str(result["server"])] += 1
        else:
            errors[str(result["error"])] += 1
            if len(failures) < FAILURES_KEPT:
                failures.append({"at": round(time.monotonic() - started, 3), **result})
    return {
        "attempted": attempted,
        "ok": sum(servers.values()),
        "failed": sum(errors.values()),
        "errors": dict(errors),
        "failures": failures,
        "servers": dict(servers),
        "seconds": round(time.monotonic() - started, 3),
    }


class Load:
    """The client running in `netns` (and `cgroup`, None: outside the agent's) while a test
    does its worst."""

    def __init__(
        self,
        topology: Namespaces,
        netns: str,
        cgroup: Cgroup | None,
        target: str,
        *,
        seconds: float = 10.0,
        rate: float = 400.0,
        timeout: float = 2.0,
    ) -> None:
        self.seconds = seconds
        self.timeout = timeout
        argv = [sys.executable, "-m", "lab.harness.connload", target]
        argv += ["--seconds", str(seconds), "--rate", str(rate), "--timeout", str(timeout)]
        self.proc = topology.spawn(netns, argv, cgroup)
        self._wait_started(START_TIMEOUT * TIMEOUT_SCALE)

    def _wait_started(self, timeout: float) -> None:
        """Until the client is connecting: what a test does next must happen under load,
        however long the interpreter takes to start (much longer under emulation)."""
        assert self.proc.stdout is not None
        fd, line, deadline = self.proc.stdout.fileno(), b"", time.monotonic() + timeout
        # Byte by byte from the descriptor: nothing of the summary may sit in a buffer that
        # communicate() (which reads the descriptor) would not see.
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            byte = os.read(fd, 1)
            if not byte:
                break
            line += byte
        if not line or json.loads(line) != STARTED:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
            raise RuntimeError(f"load client did not start within {timeout:.0f}s: {line!r} {err}")

    def result(self) -> dict[str, Any]:
        """Its summary, once it has finished (it ends by itself: bounded)."""
        out, err = self.proc.communicate(timeout=(self.seconds + self.timeout) * TIMEOUT_SCALE + 30)
        if self.proc.returncode != 0:
            raise RuntimeError(f"load client failed ({self.proc.returncode}): {err}")
        summary: dict[str, Any] = json.loads(out)
        return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.harness.connload")
    parser.add_argument("target", type=_addr, help="IP:PORT")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=400.0, help="new connections per second")
    parser.add_argument("--timeout", type=float, default=2.0, help="per connection")
    args = parser.parse_args(argv)
    print(json.dumps(STARTED), flush=True)
    print(json.dumps(run(args.target, args.seconds, args.rate, args.timeout)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
