"""The agent's health, judged as kube-proxy judges its own for /healthz and /livez.

Matched against kubernetes/kubernetes:

- pkg/proxy/healthcheck/proxy_health.go (ProxyHealthServer): `QueuedUpdate()` when a
  Service or EndpointSlice change is queued for the datapath remembers the *oldest*
  pending change; `Updated()` after a successful sync forgets it and sets `lastUpdated`;
  the proxy is unhealthy once a pending change has waited `healthTimeout` or longer
  (`currentTime - oldestPendingQueued >= healthTimeout`). /healthz and /livez answer 200
  or 503 with `Content-Type: application/json` and `X-Content-Type-Options: nosniff`, and
  the body `{"lastUpdated", "currentTime", "nodeEligible" (/healthz only), "healthy",
  "status": {"IPv4": {"lastUpdated", "healthy"}}}` in that order, times in Go's JSON
  format (RFC 3339, nanoseconds trimmed, "0001-01-01T00:00:00Z" for none). When healthy,
  the top-level lastUpdated is the current time ("to preserve compatibility" with
  releases that reported the last sync loop run).
- cmd/kube-proxy/app/server.go: healthTimeout is 2 x syncPeriod (Config.health_timeout).
- pkg/proxy/{iptables,nftables}/proxier.go: `Sync()` (a change arrived after the initial
  lists) calls QueuedUpdate; a successful syncProxyRules calls Updated; a failed one does
  not, so a change that cannot be applied turns /healthz to 503 after the timeout.

Where ebpflb differs, and why:

- /healthz answers 503 until the first full sync. kube-proxy answers 200 from the start
  (its SyncLoop calls Updated before any sync). A node whose maps may hold nothing yet
  should not receive load-balancer traffic; a restarted agent keeps serving from the
  pinned maps, and its start (about 2 s) is shorter than one probe interval of GCE's node
  health check (8 s, unhealthy after 3 failures), so a restart does not drain the node.
  /livez keeps kube-proxy's semantics (200 while starting): a slow first sync on a large
  cluster must not get the agent killed by its liveness probe.
- A change arriving while a sync runs may not be in that sync; kube-proxy's Updated
  forgets it anyway. Here it stays pending, counted from the start of that sync.
- nodeEligible is always true: ebpflb does not watch its Node object yet, so it cannot see
  the deletion timestamp or the cluster autoscaler's ToBeDeletedByClusterAutoscaler taint
  that make kube-proxy's /healthz answer 503 on a node being removed.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import UTC, datetime

from ebpflb.clock import Clock

GO_ZERO_TIME = "0001-01-01T00:00:00Z"


def go_time(unix: float | None) -> str:
    """A unix time as Go's time.Time marshals to JSON in UTC (RFC 3339, trailing zeros of
    the fraction trimmed); None as Go's zero time."""
    if unix is None:
        return GO_ZERO_TIME
    moment = datetime.fromtimestamp(unix, tz=UTC)
    fraction = f"{moment.microsecond:06d}".rstrip("0")
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"


@dataclass(frozen=True, slots=True)
class HealthSnapshot:
    ready: bool  # the first full sync has run (/readyz)
    synced: bool  # a sync has succeeded: left nothing to retry
    keeping_up: bool  # no pending change has waited health_timeout or longer
    last_updated: float | None  # unix time of the last successful sync
    current_time: float  # unix time of this snapshot
    oldest_pending_age: float | None  # seconds the oldest pending change has waited
    node_eligible: bool = True  # no Node watch yet (see above)

    @property
    def healthy(self) -> bool:
        """The proxy's own health, as /healthz reports it (node eligibility aside)."""
        return self.synced and self.keeping_up


class ProxyHealth:
    """kube-proxy's QueuedUpdate/Updated bookkeeping (thread-safe): sources queue changes
    from their threads, the sync loop reports starts and successes, HTTP threads read."""

    def __init__(self, timeout: float, clock: Clock) -> None:
        self.timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._oldest_queued: float | None = None  # monotonic, the clock's now()
        self._newest_queued: float | None = None
        self._sync_started: float | None = None
        self._last_updated: float | None = None  # unix time
        self._ready = False
        self._standing_by = False

    def stand_by(self) -> None:
        """This agent will not program the datapath (it refused the pins): changes are no
        longer pending on it, so /livez stays 200 (no restart loop) and /readyz 503."""
        with self._lock:
            self._standing_by = True
            self._oldest_queued = self._newest_queued = None

    def queued_update(self) -> None:
        """A change is waiting for the datapath (kube-proxy's QueuedUpdate)."""
        now = self._clock.now()
        with self._lock:
            if self._standing_by:
                return
            if self._oldest_queued is None:
                self._oldest_queued = now
            self._newest_queued = now

    def sync_started(self) -> None:
        """A sync is about to take the pending changes."""
        now = self._clock.now()
        with self._lock:
            self._sync_started = now

    def sync_finished(self, *, ok: bool) -> None:
        """The sync started last ran to its end; `ok`: it left nothing to retry. A sync
        that failed to write some service's change leaves that change pending."""
        with self._lock:
            self._ready = True
        if ok:
            self.updated()

    def updated(self) -> None:
        """The sync started last succeeded (kube-proxy's Updated)."""
        wall = self._clock.wall()
        with self._lock:
            started = self._sync_started
            if (
                started is not None
                and self._newest_queued is not None
                and self._newest_queued >= started
            ):
                # Queued while the sync ran: perhaps after it took the changes. Still
                # pending, counted from the sync's start (never later than it was queued).
                self._oldest_queued = started
            else:
                self._oldest_queued = self._newest_queued = None
            self._last_updated = wall

    def snapshot(self) -> HealthSnapshot:
        now, wall = self._clock.now(), self._clock.wall()
        with self._lock:
            age = None if self._oldest_queued is None else now - self._oldest_queued
            return HealthSnapshot(
                ready=self._ready,
                synced=self._last_updated is not None,
                keeping_up=age is None or age < self.timeout,
                last_updated=self._last_updated,
                current_time=wall,
                oldest_pending_age=age,
            )


def healthz_response(health: HealthSnapshot) -> tuple[int, bytes]:
    """(HTTP status, JSON body) of /healthz: may a load balancer send traffic here?"""
    ok = health.healthy and health.node_eligible
    return _response(health, ok, health.healthy, {"nodeEligible": health.node_eligible})


def livez_response(health: HealthSnapshot) -> tuple[int, bytes]:
    """(HTTP status, JSON body) of /livez: is the agent alive (keeping up with changes)?"""
    return _response(health, health.keeping_up, health.keeping_up, {})


def _response(
    health: HealthSnapshot, ok: bool, healthy: bool, extra: dict[str, object]
) -> tuple[int, bytes]:
    body: dict[str, object] = {
        # When answering 200, "now", as kube-proxy reports for compatibility (see above).
        "lastUpdated": go_time(health.current_time if ok else health.last_updated),
        "currentTime": go_time(health.current_time),
        **extra,
        "healthy": healthy,
    }
    if health.last_updated is not None:  # kube-proxy lists the proxiers that ran (IPv4 only)
        body["status"] = {
            "IPv4": {"lastUpdated": go_time(health.last_updated), "healthy": health.keeping_up}
        }
    return (200 if ok else 503), json.dumps(body, separators=(",", ":")).encode()


def readyz_response(health: HealthSnapshot) -> tuple[int, bytes]:
    """(HTTP status, text body) of /readyz: 200 once the first full sync is done."""
    if health.ready:
        return 200, b"ok\n"
    return 503, b"not ready: the first full sync has not finished\n"
