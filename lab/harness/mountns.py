"""A child process that sees some of the machine's directories empty: a private mount
namespace with a tmpfs over each, made between fork and exec (a preexec_fn), so nothing
outside that child ever sees the change and nothing needs undoing.

For tests of a node without something on it, e.g. kernel headers under /lib/modules and
/usr/src (tests/kernel/datapath/test_headers.py)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence

CLONE_NEWNS = 0x00020000  # linux/sched.h
MS_REC, MS_PRIVATE = 0x4000, 0x40000  # linux/mount.h


def hiding(paths: Sequence[str]) -> Callable[[], None]:
    """A preexec_fn: unshare the mount namespace, keep its mounts from propagating back,
    and mount an empty tmpfs over each of `paths` (existing directories)."""
    encoded = [p.encode() for p in paths]

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
        if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
        for path in encoded:
            if libc.mount(b"tmpfs", path, b"tmpfs", 0, b"mode=0755") != 0:
                raise OSError(ctypes.get_errno(), f"mount tmpfs on {os.fsdecode(path)}")

    return preexec
