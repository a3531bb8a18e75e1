"""A bounded-frequency runner, after kube-proxy's BoundedFrequencyRunner.

`request()` never blocks: it marks work pending. The loop runs the sync function
- at most once per `min_interval` (a burst of changes coalesces into one sync),
- at least once per `max_interval` as a full resync (the maps are re-read and repaired),
- again after `retry_interval` when a sync failed.
The decision (`next_run`) is a pure function of the clock and the state, so it is tested
with a fake clock and no sleeping.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable

from ebpflb.clock import Clock

log = logging.getLogger(__name__)


class SyncKind(enum.Enum):
    INCREMENTAL = "incremental"  # apply pending changes only
    FULL = "full"  # re-read every map and repair it to the desired state


class BoundedFrequencyRunner:
    def __init__(
        self,
        sync: Callable[[SyncKind], bool],
        *,
        min_interval: float,
        max_interval: float,
        retry_interval: float,
        clock: Clock,
    ) -> None:
        """`sync(kind)` returns True on success; False or an exception schedules a retry."""
        self._sync = sync
        self.min_interval = min_interval
        self.max_interval = max_interval
        self.retry_interval = retry_interval
        self._clock = clock
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._pending = False
        self._enabled = False
        self._last_run: float | None = None
        self._last_full: float | None = None
        self._retry_at: float | None = None
        self.runs = 0

    def enable(self) -> None:
        """Allow syncs (after both initial lists are in); the first sync is a full one."""
        with self._lock:
            self._enabled = True
        self._wake.set()

    def request(self) -> None:
        with self._lock:
            self._pending = True
        self._wake.set()

    def next_run(self) -> tuple[SyncKind | None, float]:
        """(what to run now, or None) and how long until the next decision point."""
        now = self._clock.now()
        with self._lock:
            if not self._enabled:
                return None, self.max_interval
            if self._last_full is None:
                return SyncKind.FULL, 0.0
            full_due = self._last_full + self.max_interval
            if now >= full_due:
                return SyncKind.FULL, 0.0
            wants = self._pending or (self._retry_at is not None and now >= self._retry_at)
            earliest = (self._last_run or -1e18) + self.min_interval
            if wants and now >= earliest:
                return SyncKind.INCREMENTAL, 0.0
            deadlines = [full_due]
            if self._pending:
                deadlines.append(earliest)
            if self._retry_at is not None:
                deadlines.append(max(self._retry_at, earliest))
            return None, max(min(deadlines) - now, 0.0)

    def run_once(self) -> SyncKind | None:
        """Run the sync if one is due; returns what ran."""
        kind, _ = self.next_run()
        if kind is None:
            return None
        now = self._clock.now()
        with self._lock:
            self._pending = False
            self._last_run = now
            if kind is SyncKind.FULL:
                self._last_full = now
        try:
            ok = self._sync(kind)
        except Exception:
            log.exception("%s sync failed", kind.value)
            ok = False
        with self._lock:
            self._retry_at = None if ok else self._clock.now() + self.retry_interval
        self.runs += 1
        return kind

    def loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self.run_once() is not None:
                continue
            _, wait = self.next_run()
            self._wake.clear()
            # Re-check after clearing so a request() between next_run and clear is not lost.
            if self.next_run()[0] is None:
                self._clock.wait(self._wake, min(wait, 1.0) if wait > 0 else 0.05)

    def wake(self) -> None:
        self._wake.set()
