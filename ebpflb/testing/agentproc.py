"""Run `ebpflb run` as a child process, wait until it has synced, stop it by PID."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

READY_LINE = "initial sync complete"
# Multiplies the waits below: an agent compiles its programs at start-up, which takes
# ~1 s here but a minute or two in an emulated VM (a kernel-matrix run sets e.g. 5).
TIMEOUT_SCALE = float(os.environ.get("EBPFLB_TEST_TIMEOUT_SCALE", "1"))


class AgentProcess:
    def __init__(
        self,
        args: Sequence[str],
        *,
        netns: str | None = None,
        log_file: Path | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        # Tests and the demo never attach tc programs to the machine's own interfaces:
        # NodePort needs an explicit --interfaces (inside a test namespace).
        if not any(a.startswith("--interfaces") for a in args):
            args = [*args, "--interfaces="]
        argv = [sys.executable, "-m", "ebpflb", "run", "--metrics-bind-address=", *args]
        if netns:
            argv = ["nsenter", f"--net=/run/netns/{netns}", *argv]
        self.argv = argv
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._log = log_file.open("a") if log_file else None
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            # e.g. joining a memory cgroup that accounts the agent's kernel memory
            preexec_fn=preexec_fn,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if self._log:
                self._log.write(line)
                self._log.flush()
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, text: str, timeout: float = 30.0, start: int = 0) -> str:
        """Block until a log line containing `text` (at index >= start) appears."""
        timeout *= TIMEOUT_SCALE
        deadline = time.monotonic() + timeout
        seen = start
        while True:
            for line in self.lines[seen:]:
                if text in line:
                    return line
            seen = len(self.lines)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"agent did not log {text!r} in {timeout}s:\n" + self.output())
            try:
                if (
                    self._queue.get(timeout=min(remaining, 0.2)) is None
                    and self.proc.poll() is not None
                ):
                    for line in self.lines[seen:]:
                        if text in line:
                            return line
                    raise RuntimeError(f"agent exited ({self.proc.returncode}):\n" + self.output())
            except queue.Empty:
                pass

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.wait_for(READY_LINE, timeout)

    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then SIGKILL if it does not leave in time; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._reader.join(timeout=5)
        if self._log:
            self._log.close()
            self._log = None
        with contextlib.suppress(Exception):
            if self.proc.stderr:
                self.proc.stderr.close()
        return self.proc.returncode


def cleanup_datapath(
    bpffs: Path,
    cgroup: Path,
    interfaces: Sequence[str] = (),
    netns: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`ebpflb cleanup` for one agent's pins, cgroup and (in `netns`) interfaces. Only the
    interfaces named: never whatever a production agent on this machine attached."""
    argv = [
        sys.executable,
        "-m",
        "ebpflb",
        "cleanup",
        "--bpffs",
        str(bpffs),
        "--cgroup",
        str(cgroup),
        f"--interfaces={','.join(interfaces)}",
    ]
    if netns:
        argv = ["nsenter", f"--net=/run/netns/{netns}", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)
