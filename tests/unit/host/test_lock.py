"""The pin directory's lock (ebpflb.host.lock): one holder, waiting with a bound, handover when
the holder lets go, and the holder named from /proc/locks. flock works on a directory of
any filesystem, so these run on tmp_path; the kernel test runs it on bpffs."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from ebpflb.cli import parse_args
from ebpflb.clock import FakeClock
from ebpflb.config import Config
from ebpflb.errors import ConfigError, PinDirBusyError
from ebpflb.host.lock import Holder, PinDirLock, lock_holders


def proc_locks_line(path: Path, pid: int, *, waiter: bool = False) -> str:
    info = os.stat(path)
    where = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    arrow = "-> " if waiter else ""
    return f"1: {arrow}FLOCK  ADVISORY  WRITE {pid} {where} 0 EOF"


def test_holders_are_read_from_proc_locks_for_this_inode_only(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    text = "\n".join(
        [
            "1: POSIX  ADVISORY  WRITE 11 00:27:1 0 EOF",
            proc_locks_line(other, 22),
            proc_locks_line(tmp_path, 33),
            proc_locks_line(tmp_path, 44, waiter=True),
            "garbage",
        ]
    )
    info = os.stat(tmp_path)
    assert lock_holders(info.st_dev, info.st_ino, text) == [33]


def test_a_second_lock_on_the_same_directory_is_refused_until_the_first_is_released(
    tmp_path: Path,
) -> None:
    first, second = PinDirLock(tmp_path), PinDirLock(tmp_path)
    assert first.try_acquire()
    assert not second.try_acquire()
    first.release()
    assert second.try_acquire() and second.held
    second.release()


def test_the_holder_is_named_from_proc_locks(tmp_path: Path) -> None:
    lock = PinDirLock(tmp_path, proc_locks=lambda: proc_locks_line(tmp_path, 4242))
    assert lock.holder() == Holder(4242)
    assert str(lock.holder()) == "pid 4242"
    hidden = PinDirLock(tmp_path, proc_locks=lambda: "")
    assert hidden.holder() == Holder(None)
    assert "not visible in this PID namespace" in str(hidden.holder())


def test_waiting_times_out_with_the_directory_and_the_holder_in_the_error(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    first = PinDirLock(tmp_path)
    assert first.try_acquire()
    waits: list[Holder] = []
    second = PinDirLock(tmp_path, clock=clock, proc_locks=lambda: proc_locks_line(tmp_path, 4242))
    started = clock.now()
    with pytest.raises(PinDirBusyError) as caught:
        second.acquire(60.0, on_wait=waits.append)
    assert clock.now() - started == pytest.approx(60.0)
    assert waits == [Holder(4242)]  # said once, not at every attempt
    message = str(caught.value)
    assert str(tmp_path) in message and "pid 4242" in message and "--lock-timeout" in message
    assert not second.held
    first.release()


def test_a_waiting_lock_takes_over_when_the_holder_lets_go(tmp_path: Path) -> None:
    first = PinDirLock(tmp_path)
    assert first.try_acquire()
    releaser = threading.Timer(0.3, first.release)
    releaser.start()
    second = PinDirLock(tmp_path)
    started = time.monotonic()
    assert second.acquire(10.0)
    waited = time.monotonic() - started
    assert 0.25 <= waited < 2.0
    second.release()
    releaser.join()


def test_stop_ends_the_wait_without_the_lock(tmp_path: Path) -> None:
    first = PinDirLock(tmp_path)
    assert first.try_acquire()
    stop = threading.Event()
    stop.set()
    second = PinDirLock(tmp_path, clock=FakeClock())
    assert second.acquire(60.0, stop=stop) is False
    assert not second.held
    first.release()


def test_a_free_lock_is_taken_at_once_without_waiting(tmp_path: Path) -> None:
    waits: list[Holder] = []
    lock = PinDirLock(tmp_path, clock=FakeClock())
    assert lock.acquire(0.0, on_wait=waits.append)
    assert waits == []
    lock.release()


def test_a_directory_replaced_while_waiting_is_locked_anew(tmp_path: Path) -> None:
    """`ebpflb cleanup` removed the directory (holding the lock) and it is made again: the
    waiter must lock the new directory, not the removed one nobody looks at any more."""
    pins = tmp_path / "pins"
    pins.mkdir()
    cleanup = PinDirLock(pins)
    assert cleanup.try_acquire()
    waiter = PinDirLock(pins)

    def remove_and_release() -> None:
        pins.rmdir()
        cleanup.release()  # the lock of a directory that is gone

    threading.Timer(0.2, remove_and_release).start()
    assert waiter.acquire(10.0, recreate=pins.mkdir)
    other = PinDirLock(pins)
    assert not other.try_acquire()  # the waiter holds the new directory's lock
    waiter.release()


def test_lock_timeout_is_a_run_option_and_not_negative() -> None:
    assert Config().lock_timeout == 60.0
    assert parse_args(["run", "--lock-timeout", "5"]).lock_timeout == 5.0
    with pytest.raises(ConfigError, match="lock-timeout"):
        Config(lock_timeout=-1)
