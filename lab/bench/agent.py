"""The agent's HTTP interfaces, as the bench reads them: readiness, start-up figures and
sync results, never its log text.

`ebpflb run` serves /readyz (200 once the first full sync is done, 503 before) on its
health address and /status (JSON) and /metrics (Prometheus text) on its metrics address.
The bench gives the agent both addresses on 127.0.0.1 of the agent's network namespace
and reads them with sockets made inside that namespace (Endpoints, lab.harness.nshttp).
AgentStatus is the part of /status the bench uses; keys the agent adds are ignored.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ebpflb.errors import EbpflbError
from lab.bench.records.agent import AgentStartup, Listing
from lab.harness.nshttp import http_get


class AgentError(EbpflbError):
    """The agent's endpoints did not answer as specified (or not in time)."""


@dataclass(frozen=True)
class SyncResult:
    kind: str  # "first", "full" (a periodic resync) or "incremental"
    duration_s: float
    failed: int
    errors: tuple[str, ...] = ()
    finished: float | None = None  # unix time


@dataclass(frozen=True)
class AgentStatus:
    """What /status says (the fields the bench uses)."""

    ready: bool
    process_start: float  # unix time
    phases: Mapping[str, float]  # phase -> seconds after process_start
    compile_seconds: Mapping[str, float]
    lists: Mapping[str, Listing]
    sync_count: int
    last_sync: SyncResult | None
    frontends: int
    xdp: Mapping[str, str] = field(default_factory=dict)  # interface -> native|generic|off
    program_origin: Mapping[str, str] = field(default_factory=dict)  # set -> adopted|...

    @classmethod
    def parse(cls, data: Any) -> AgentStatus:
        try:
            sync = data.get("sync") or {}
            last = sync.get("last")
            return cls(
                ready=bool(data["ready"]),
                process_start=float(data["process_start"]),
                phases={str(k): float(v) for k, v in data.get("phases", {}).items()},
                compile_seconds={
                    str(k): float(v) for k, v in data.get("compile_seconds", {}).items()
                },
                lists={
                    str(kind): Listing(int(v["objects"]), float(v["seconds"]))
                    for kind, v in data.get("lists", {}).items()
                },
                sync_count=int(sync.get("count", 0)),
                last_sync=SyncResult(
                    str(last["kind"]),
                    float(last["duration_s"]),
                    int(last.get("failed", 0)),
                    tuple(str(e) for e in last.get("errors", ())),
                    float(last["finished"]) if "finished" in last else None,
                )
                if last
                else None,
                frontends=int(data.get("frontends", 0)),
                xdp={
                    str(name): str(iface.get("xdp", "off"))
                    for name, iface in data.get("interfaces", {}).items()
                },
                program_origin={
                    str(k): str(v)
                    for k, v in (data.get("programs") or {}).get("origin", {}).items()
                },
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise AgentError(f"/status: unexpected content ({type(exc).__name__}: {exc})") from exc


@dataclass(frozen=True)
class Endpoints:
    """The agent's two HTTP servers, "HOST:PORT" each, inside `netns` (None: this one)."""

    health: str
    metrics: str
    netns: str | None = None
    timeout: float = 5.0

    def get(self, address: str, path: str) -> tuple[int, bytes]:
        host, _, port = address.rpartition(":")
        code, _, body = http_get(host, int(port), path, netns=self.netns, timeout=self.timeout)
        return code, body

    def ready(self) -> bool:
        """/readyz answers 200; False while it says 503 or nothing listens yet."""
        try:
            code, _ = self.get(self.health, "/readyz")
        except OSError:
            return False
        if code not in (200, 503):
            raise AgentError(f"/readyz answered {code}")
        return code == 200

    def status(self) -> AgentStatus:
        body = self._checked(self.metrics, "/status")
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise AgentError(f"/status: not JSON: {body[:200]!r}") from exc
        return AgentStatus.parse(data)

    def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """One sample of /metrics (None if absent), e.g. metric("x_total", {"map": "m"})."""
        from prometheus_client.parser import text_string_to_metric_families

        body = self._checked(self.metrics, "/metrics")
        wanted = dict(labels or {})
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name == name and sample.labels == wanted:
                    return float(sample.value)
        return None

    def _checked(self, address: str, path: str) -> bytes:
        try:
            code, body = self.get(address, path)
        except OSError as exc:
            raise AgentError(f"{path} on {address}: {exc}") from exc
        if code != 200:
            raise AgentError(f"{path} on {address} answered {code}: {body[:200]!r}")
        return body

    def wait_ready(self, alive: Callable[[], bool], timeout: float, poll: float = 0.02) -> None:
        """Poll /readyz until 200; AgentError when `alive()` turns false or time runs out."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if not alive():
                raise AgentError("the agent exited before it was ready")
            if time.monotonic() > deadline:
                raise AgentError(f"the agent was not ready after {timeout:g} s")
            time.sleep(poll)

    def wait_for_full_resync(self, timeout: float, poll: float = 0.2) -> SyncResult | None:
        """The first periodic full resync's result (None if none came within `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            last = status.last_sync
            if last is not None and last.kind == "full" and status.sync_count >= 2:
                return last
            time.sleep(poll)
        return None


def startup(status: AgentStatus, spawned_at: float, cpu_s_at_synced: float) -> AgentStartup:
    """The start-up figures of a ready agent's /status. `spawned_at`: the unix time the bench
    started the process; the agent's phases are shifted to count from there."""
    if "first_sync" not in status.phases:
        raise AgentError(f"/status has no first_sync phase: {sorted(status.phases)}")
    offset = status.process_start - spawned_at
    phases = {name: round(offset + at, 3) for name, at in status.phases.items()}
    last = status.last_sync
    first = last if last and (last.kind == "first" or status.sync_count == 1) else None
    return AgentStartup(
        start_to_synced_s=offset + status.phases["first_sync"],
        cpu_s_at_synced=cpu_s_at_synced,
        frontends=status.frontends,
        sync_errors=first.failed if first else 0,
        first_sync_s=first.duration_s if first else None,
        phases=phases,
        compile_s=dict(status.compile_seconds),
        lists=dict(status.lists),
        program_origin=dict(status.program_origin),
    )
