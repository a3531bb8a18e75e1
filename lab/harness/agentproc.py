"""Run `ebpflb run` as a child process, wait until it has synced, read its state, stop it.

Everything is read through the agent's interfaces: readiness from /readyz, figures from
/status and /metrics (on free loopback ports chosen here, inside the agent's network
namespace when it runs in one). Its log lines are kept for people (a log file, and the
output shown when it fails), never matched.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from lab.harness.nshttp import free_ports, http_get

# Multiplies the waits below: an agent compiles its programs at start-up, which takes
# ~1 s here but a minute or two in an emulated VM (a kernel-matrix run sets e.g. 5).
TIMEOUT_SCALE = float(os.environ.get("EBPFLB_TEST_TIMEOUT_SCALE", "1"))
POLL_INTERVAL = 0.02

Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Scrape:
    """One scrape of /metrics: every sample by name (as exposed, e.g. with _total) and
    labels."""

    samples: Mapping[tuple[str, Labels], float]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[sample.name, frozenset(sample.labels.items())] = sample.value
        return cls(samples)

    def value(self, name: str, **labels: str) -> float | None:
        """The sample with exactly these labels, None if absent."""
        return self.samples.get((name, frozenset(labels.items())))

    def sum(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include these."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value given for --flag (as --flag=V or --flag V), the last one winning."""
    value = None
    for index, arg in enumerate(args):
        if arg.startswith(f"{flag}="):
            value = arg.split("=", 1)[1]
        elif arg == flag and index + 1 < len(args):
            value = args[index + 1]
    return value


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class AgentProcess:
    def __init__(
        self,
        args: Sequence[str],
        *,
        netns: str | None = None,
        log_file: Path | None = None,
        preexec_fn: Callable[[], None] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`ebpflb run ARGS` (inside `netns`). Its health and metrics servers listen on
        free ports of 127.0.0.1 unless ARGS give their addresses; a test never binds the
        machine's 0.0.0.0:10256."""
        # Tests and the demo never attach tc programs to the machine's own interfaces:
        # NodePort and the pod path need an explicit --interfaces / --pod-interfaces (inside
        # a test namespace).
        if not any(a.startswith("--interfaces") for a in args):
            args = [*args, "--interfaces="]
        if not any(a.startswith("--pod-interfaces") for a in args):
            args = [*args, "--pod-interfaces="]
        # Nor do they change the machine's own sysctls (the node's, in a namespace).
        if netns is None and not any(a.startswith("--conntrack-sysctls") for a in args):
            args = [*args, "--conntrack-sysctls=false"]
        self.netns = netns
        ports = free_ports(2, netns)
        self.metrics_address = _flag_value(args, "--metrics-bind-address")
        self.healthz_address = _flag_value(args, "--healthz-bind-address")
        if self.metrics_address is None:
            self.metrics_address = f"127.0.0.1:{ports[0]}"
            args = [f"--metrics-bind-address={self.metrics_address}", *args]
        if self.healthz_address is None:
            self.healthz_address = f"127.0.0.1:{ports[1]}"
            args = [f"--healthz-bind-address={self.healthz_address}", *args]
        argv = [sys.executable, "-m", "ebpflb", "run", *args]
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
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
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

    def output(self) -> str:
        """The agent's log so far, for people (failure messages): never to be matched."""
        return "\n".join(self.lines)

    # ---- the agent's HTTP interfaces -----------------------------------------------------

    def get(self, server: str, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """GET `path` from the agent's "healthz" or "metrics" server: (status, body)."""
        address = self.healthz_address if server == "healthz" else self.metrics_address
        if not address:
            raise RuntimeError(f"the agent's {server} server is disabled ({self.argv})")
        host, port = _host_port(address)
        status, _headers, body = http_get(host, port, path, netns=self.netns, timeout=timeout)
        return status, body

    def healthz(self, path: str = "/healthz") -> tuple[int, dict[str, Any]]:
        """kube-proxy's /healthz (or /livez): (HTTP status, JSON body)."""
        status, body = self.get("healthz", path)
        return status, json.loads(body)

    def status(self) -> dict[str, Any]:
        """The agent's /status document."""
        status, body = self.get("metrics", "/status")
        if status != 200:
            raise RuntimeError(f"/status answered {status}: {body[:200]!r}")
        document: dict[str, Any] = json.loads(body)
        return document

    def metrics(self) -> Scrape:
        """One scrape of /metrics, parsed by prometheus_client's parser."""
        status, body = self.get("metrics", "/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}: {body[:200]!r}")
        return Scrape.parse(body.decode())

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until /readyz answers 200 (the first full sync is done). The host compiles in
        seconds; the limit is for the kernel matrix's guests, where a cold compile of the
        socket-LB and NodePort programs took 228 s and more on 5.10 (scaled: 1,200 s)."""
        self._poll(lambda: self._ready(), timeout, "ready (/readyz 200)")

    def _ready(self) -> bool:
        try:
            return self.get("healthz", "/readyz", timeout=2.0)[0] == 200
        except OSError:  # not listening yet
            return False

    def wait_status(
        self, condition: Callable[[dict[str, Any]], bool], what: str, timeout: float = 10.0
    ) -> dict[str, Any]:
        """Poll /status until `condition(document)` holds; that document."""
        found: list[dict[str, Any]] = []

        def check() -> bool:
            document = self.status()
            if condition(document):
                found.append(document)
                return True
            return False

        self._poll(check, timeout, what)
        return found[0]

    def _poll(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        timeout *= TIMEOUT_SCALE
        deadline = time.monotonic() + timeout
        while not check():
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                raise RuntimeError(
                    f"agent exited ({self.proc.returncode}) before {what}:\n" + self.output()
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"agent not {what} within {timeout}s:\n" + self.output())
            time.sleep(POLL_INTERVAL)

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
