"""One user at a time of what kernel test sessions and `ebpflb bench` runs share: the
machine's namespaces, cgroups and pins named ebpflb*, and its CPUs.

A kernel test session checks that it left nothing behind by comparing the machine before
and after, which a bench running alongside would change; and each would measure the
other's load. Both take this lock. The process holding it marks the environment, so what
it starts (an `ebpflb bench` run by a test) does not wait for its own parent.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_PATH = Path("/run/lock/ebpflb-kernel-tests.lock")
_HELD = "EBPFLB_MACHINE_LOCK_HELD"


@contextlib.contextmanager
def machine_lock(who: str) -> Iterator[None]:
    """Hold the lock for the block, waiting (with a line on stderr) while another has it."""
    if os.environ.get(_HELD) or os.geteuid() != 0:
        yield
        return
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_PATH.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"{who}: waiting for another kernel test session or bench ({LOCK_PATH})",
                file=sys.stderr,
            )
            started = time.monotonic()
            fcntl.flock(lock, fcntl.LOCK_EX)
            print(
                f"{who}: waited {time.monotonic() - started:.0f}s for {LOCK_PATH}", file=sys.stderr
            )
        os.environ[_HELD] = str(os.getpid())
        try:
            yield
        finally:
            del os.environ[_HELD]
