"""One agent per pin directory: an exclusive flock on the directory itself, held for the
agent's lifetime.

Two agents writing the same maps would undo each other's writes and free each other's
slot ranges and backend ids (a DaemonSet update whose old pod is still terminating, a
second `ebpflb run` by mistake). bpffs holds no regular files, so there is no lock file:
the lock is on the pin directory's inode, which every pod mounting the host's bpffs
shares. The kernel drops it when the holder's process ends, however it ends, so there is
nothing stale to clean up after a crash.

Handover: a second agent waits (bounded by --lock-timeout), saying once who holds the
lock; it takes over as soon as the first exits. Who holds it comes from /proc/locks (the
kernel's record of flock holders), which shows pids of this PID namespace only: an agent
in another pod shows as "not visible here".
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ebpflb.clock import Clock, RealClock
from ebpflb.errors import PinDirBusyError

log = logging.getLogger(__name__)

PROC_LOCKS = Path("/proc/locks")
POLL_INTERVAL = 0.1  # seconds between attempts while waiting: the handover's added delay


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds the lock, as far as this process can see."""

    pid: int | None  # None: not visible in this PID namespace

    def __str__(self) -> str:
        if self.pid is None:
            return "a process not visible in this PID namespace (another pod?)"
        return f"pid {self.pid}"


def lock_holders(dev: int, inode: int, proc_locks: str) -> list[int]:
    """Pids holding a flock on the inode `dev`/`inode`, read from /proc/locks text (lines
    like "1: FLOCK  ADVISORY  WRITE 1234 00:27:8849592 0 EOF"; waiters, "1: -> FLOCK ...",
    are skipped)."""
    wanted = f"{os.major(dev):02x}:{os.minor(dev):02x}:{inode}"
    pids = []
    for line in proc_locks.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        pid, where = fields[4], fields[5]
        if where == wanted and pid.isdigit():
            pids.append(int(pid))
    return pids


class PinDirLock:
    """The exclusive lock on `pin_dir` (which must exist). Not thread-safe: one owner."""

    def __init__(
        self,
        pin_dir: Path,
        *,
        clock: Clock | None = None,
        proc_locks: Callable[[], str] = PROC_LOCKS.read_text,
    ) -> None:
        self.pin_dir = pin_dir
        self._clock = clock or RealClock()
        self._proc_locks = proc_locks
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if it is free; False if another process holds it."""
        if self._fd is not None:
            return True
        try:
            fd = os.open(self.pin_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:  # removed while we waited: `recreate` makes it again
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        # Removed (by `ebpflb cleanup`) and made again while we waited: the lock taken is
        # on a directory nobody else will look at any more. Try the new one.
        if not self._same_directory(fd):
            os.close(fd)
            return False
        self._fd = fd
        return True

    def _same_directory(self, fd: int) -> bool:
        try:
            now = os.stat(self.pin_dir)
        except FileNotFoundError:
            return False
        locked = os.fstat(fd)
        return (now.st_dev, now.st_ino) == (locked.st_dev, locked.st_ino)

    def holder(self) -> Holder:
        """Who holds the lock now (when this process does not)."""
        try:
            info = os.stat(self.pin_dir)
            pids = lock_holders(info.st_dev, info.st_ino, self._proc_locks())
        except OSError:
            pids = []
        others = [p for p in pids if p != os.getpid()]
        return Holder(others[0] if others else None)

    def acquire(
        self,
        timeout: float,
        *,
        stop: threading.Event | None = None,
        on_wait: Callable[[Holder], None] | None = None,
        recreate: Callable[[], None] | None = None,
    ) -> bool:
        """Take the lock, waiting up to `timeout` seconds for its holder to exit.

        `on_wait(holder)` is called once, when the wait starts. `recreate` makes the
        directory again if it went away while waiting. False if `stop` was set while
        waiting; PinDirBusyError naming the directory and the holder on timeout."""
        if self.try_acquire():
            return True
        holder = self.holder()
        if on_wait is not None:
            on_wait(holder)
        stop = stop or threading.Event()
        deadline = self._clock.now() + timeout
        while True:
            remaining = deadline - self._clock.now()
            if remaining <= 0:
                raise PinDirBusyError(self.pin_dir, str(self.holder()), timeout)
            if self._clock.wait(stop, min(POLL_INTERVAL, remaining)):
                return False
            if recreate is not None and not self.pin_dir.exists():
                recreate()
            if self.try_acquire():
                return True

    def release(self) -> None:
        """Give the lock up (exiting does it too)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> PinDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
