"""Clocks: the real one and a fake one, so timing logic is tested without sleeping."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def wall(self) -> float:
        """Unix time (seconds), for timestamps shown to people and other programs."""
        ...

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Wait for `event` at most `timeout` seconds; True if it was set."""
        ...


class RealClock:
    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(timeout)


class FakeClock:
    """Time moves only when a test calls advance(); wait() advances to the timeout."""

    # Unix time at now() == 0: 2025-01-01T00:00:00Z, so wall() is reproducible.
    EPOCH = 1735689600.0

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self.EPOCH + self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def wait(self, event: threading.Event, timeout: float) -> bool:
        if event.is_set():
            return True
        self._now += max(timeout, 0.0)
        return False
