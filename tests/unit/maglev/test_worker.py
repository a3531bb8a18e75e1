"""The compiled Maglev loop in a helper process (ebpflb.maglev.worker): the same tables as
in this process, numba never imported here, a helper gone (idle or killed) replaced."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from ebpflb import maglev
from ebpflb.maglev.worker import FillWorker
from tests import REPO

SERVICES = [[f"10.0.{s % 200}.{b}:80" for b in range(1 + s % 5)] for s in range(300)]
SIZES = [maglev.TABLE_SIZES[s % 3] for s in range(300)]


def _fill(worker: FillWorker) -> list[maglev.MaglevTable]:
    """build_tables through `worker` (forced compiled: these tables are small)."""
    saved = maglev._worker
    maglev._worker = worker
    try:
        return maglev.build_tables(SERVICES, SIZES, compiled=True)
    finally:
        maglev._worker = saved


def test_the_helper_builds_the_same_tables_without_numba_here() -> None:
    expected = maglev.build_tables(SERVICES, SIZES, compiled=False)
    code = (
        "import sys\n"
        "from tests.unit.maglev.test_worker import _fill, FillWorker\n"
        "worker = FillWorker()\n"
        "tables = _fill(worker)\n"
        "worker.close()\n"
        "assert 'numba' not in sys.modules and 'llvmlite' not in sys.modules\n"
        "assert not any('llvmlite' in line for line in open('/proc/self/maps'))\n"
        "import pickle; sys.stdout.buffer.write(pickle.dumps([t.slots for t in tables]))\n"
    )
    root = REPO
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    import pickle

    slots = pickle.loads(done.stdout)
    assert len(slots) == len(expected)
    for got, table in zip(slots, expected, strict=True):
        assert np.array_equal(got, table.slots)


def test_a_helper_that_left_is_replaced() -> None:
    worker = FillWorker(idle=0.5)
    try:
        first = _fill(worker)
        assert worker._proc is not None
        # Idle: the helper exits by itself (0.5 s, and however long a loaded machine adds).
        assert worker._proc.wait(timeout=60) == 0
        again = _fill(worker)
        worker._proc.kill()  # and a killed one
        worker._proc.wait()
        last = _fill(worker)
        for a, b, c in zip(first, again, last, strict=True):
            assert np.array_equal(a.slots, b.slots) and np.array_equal(a.slots, c.slots)
    finally:
        worker.close()


class Helper:
    """A stand-in for FillWorker, running or not; its builds run the Python loop (the
    tables are the same either way)."""

    def __init__(self, running: bool) -> None:
        self.is_running = running
        self.starts = 0
        self.fills = 0

    def running(self) -> bool:
        return self.is_running

    def start(self) -> None:
        self.starts += 1

    def fill_many(self, *arrays: np.ndarray) -> None:
        self.fills += 1
        maglev._fill_many(*arrays, compiled=False)  # type: ignore[arg-type]


def _built_with(helper: Helper) -> list[maglev.MaglevTable]:
    saved = maglev._worker
    maglev._worker = helper  # type: ignore[assignment]
    try:
        return maglev.build_tables(SERVICES, SIZES)  # over COMPILED_MIN_SLOTS: the helper's
    finally:
        maglev._worker = saved


def test_a_build_runs_here_without_a_helper_and_goes_to_a_running_one() -> None:
    assert sum(SIZES) >= maglev.COMPILED_MIN_SLOTS
    expected = maglev.build_tables(SERVICES, SIZES, compiled=False)
    idle = Helper(running=False)
    assert _built_with(idle) == expected
    assert (idle.fills, idle.starts) == (0, 1)  # started after it, for the builds after
    running = Helper(running=True)  # loaded or still loading numba: waited for
    assert _built_with(running) == expected
    assert (running.fills, running.starts) == (1, 0)


def test_the_helper_is_started_ahead_only_for_builds_python_could_not_do_meanwhile() -> None:
    assert not maglev.compiled_for(1000)
    assert maglev.compiled_for(10_000)


def test_a_helper_runs_until_closed() -> None:
    worker = FillWorker()
    assert not worker.running()
    worker.start()
    try:
        assert worker.running()
    finally:
        worker.close()
    assert not worker.running()
