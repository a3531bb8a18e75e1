from __future__ import annotations

from ebpflb.clock import FakeClock
from ebpflb.sync.runner import BoundedFrequencyRunner, SyncKind


class Recorder:
    def __init__(self) -> None:
        self.kinds: list[SyncKind] = []
        self.fail_next = False

    def __call__(self, kind: SyncKind) -> bool:
        self.kinds.append(kind)
        if self.fail_next:
            self.fail_next = False
            return False
        return True


def make(clock: FakeClock, sync: Recorder) -> BoundedFrequencyRunner:
    return BoundedFrequencyRunner(
        sync, min_interval=1.0, max_interval=30.0, retry_interval=5.0, clock=clock
    )


def test_nothing_runs_before_enable_then_a_full_sync() -> None:
    clock, sync = FakeClock(), Recorder()
    runner = make(clock, sync)
    runner.request()
    assert runner.run_once() is None
    runner.enable()
    assert runner.run_once() is SyncKind.FULL
    assert runner.run_once() is None  # the request was served by the full sync


def test_burst_coalesces_within_min_interval() -> None:
    clock, sync = FakeClock(), Recorder()
    runner = make(clock, sync)
    runner.enable()
    runner.run_once()
    clock.advance(2.0)
    runner.request()
    assert runner.run_once() is SyncKind.INCREMENTAL
    for _ in range(10):
        runner.request()
        clock.advance(0.05)
        assert runner.run_once() is None
    kind, wait = runner.next_run()
    assert kind is None and 0.4 < wait < 0.6
    clock.advance(wait)
    assert runner.run_once() is SyncKind.INCREMENTAL
    assert sync.kinds == [SyncKind.FULL, SyncKind.INCREMENTAL, SyncKind.INCREMENTAL]


def test_full_resync_every_max_interval() -> None:
    clock, sync = FakeClock(), Recorder()
    runner = make(clock, sync)
    runner.enable()
    runner.run_once()
    clock.advance(29.0)
    assert runner.run_once() is None
    assert runner.next_run() == (None, 1.0)
    clock.advance(1.0)
    assert runner.run_once() is SyncKind.FULL


def test_failure_retries_after_retry_interval() -> None:
    clock, sync = FakeClock(), Recorder()
    runner = make(clock, sync)
    runner.enable()
    sync.fail_next = True
    runner.run_once()
    clock.advance(4.0)
    assert runner.run_once() is None
    clock.advance(1.0)
    assert runner.run_once() is SyncKind.INCREMENTAL
    clock.advance(10.0)
    assert runner.run_once() is None  # succeeded: no more retries


def test_exception_counts_as_failure() -> None:
    clock = FakeClock()
    calls: list[SyncKind] = []

    def boom(kind: SyncKind) -> bool:
        calls.append(kind)
        raise RuntimeError("kernel said no")

    runner = BoundedFrequencyRunner(
        boom, min_interval=1.0, max_interval=30.0, retry_interval=2.0, clock=clock
    )
    runner.enable()
    assert runner.run_once() is SyncKind.FULL
    clock.advance(2.0)
    assert runner.run_once() is SyncKind.INCREMENTAL
    assert len(calls) == 2
