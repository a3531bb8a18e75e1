"""The compiled Maglev fill loop in a helper process, so that numba's LLVM stays out of the
agent: `python -m ebpflb.maglev_worker IDLE_SECONDS`.

Importing numba maps llvmlite's LLVM (68 MiB resident here) and adds ~40 MiB of heap to a
process for good, while the agent needs the compiled loop only for large builds (a full
sync of hundreds of services and more, or a table of 131,071 slots). The agent
(`maglev.use_fill_worker()`) hands such builds to this helper: the arrays go down a pipe
(each as its length and its raw bytes), the filled slots come back the same way. The
helper exits when the agent closes the pipe (it exited) or after IDLE_SECONDS without a
request, taking numba with it; the next large build starts another (one to two seconds,
like numba's import in the agent before; the agent starts it early, during the lists).
"""

from __future__ import annotations

import select
import struct
import subprocess
import sys
import threading
from typing import IO, Any

import numpy as np
import numpy.typing as npt

_Int64Array = npt.NDArray[np.int64]
_Int32Array = npt.NDArray[np.int32]

IDLE_SECONDS = 30.0
_LENGTH = struct.Struct("<Q")


def _write(stream: IO[bytes], array: npt.NDArray[np.integer]) -> None:
    stream.write(_LENGTH.pack(len(array)))
    stream.write(np.ascontiguousarray(array).tobytes())


def _read(stream: IO[bytes], dtype: type[np.integer[Any]]) -> npt.NDArray[Any]:
    """One array written by _write; EOFError when the pipe ends first. (numpy's .npy
    reader bypasses a buffered pipe's buffer, so it cannot be used here.)"""
    head = stream.read(_LENGTH.size)
    if len(head) != _LENGTH.size:
        raise EOFError
    (count,) = _LENGTH.unpack(head)
    size = count * np.dtype(dtype).itemsize
    body = stream.read(size)
    if len(body) != size:
        raise EOFError
    return np.frombuffer(body, dtype=dtype)


class FillWorker:
    """The agent's side: one helper process at a time, started on demand, thread-safe."""

    def __init__(self, idle: float = IDLE_SECONDS) -> None:
        self.idle = idle
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the helper now (it loads numba meanwhile), if none is running."""
        with self._lock:
            self._running()

    def running(self) -> bool:
        """Whether a helper process is running (numba loaded, or still loading)."""
        with self._lock:
            return self._proc is not None and self._proc.poll() is None

    def _running(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "ebpflb.maglev.worker", str(self.idle)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        return self._proc

    def fill_many(
        self,
        offsets: _Int64Array,
        skips: _Int64Array,
        weights: _Int64Array,
        backend_starts: _Int64Array,
        out: _Int32Array,
        slot_starts: _Int64Array,
    ) -> None:
        """maglev_compiled.fill_many, computed by the helper. A helper that left meanwhile
        (idle) is replaced once; a second failure is raised as OSError."""
        with self._lock:
            for attempt in (1, 2):
                proc = self._running()
                assert proc.stdin is not None and proc.stdout is not None
                try:
                    for array in (offsets, skips, weights, backend_starts, slot_starts):
                        _write(proc.stdin, array.astype(np.int64, copy=False))
                    proc.stdin.flush()
                    result = _read(proc.stdout, np.int32)
                    if len(result) != len(out):
                        raise ValueError(f"{len(result)} slots for {len(out)}")
                except (OSError, ValueError, EOFError):
                    self._stop()
                    if attempt == 2:
                        raise OSError("the Maglev fill helper process failed twice") from None
                    continue
                out[:] = result
                return

    def _stop(self) -> None:
        if self._proc is not None:
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None:
                    stream.close()
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._stop()


def serve(requests: IO[bytes], answers: IO[bytes], idle: float) -> None:
    """Answer fill requests until `requests` closes or stays silent for `idle` seconds.
    Requests and answers strictly alternate, so nothing of a next request is ever buffered
    when select() waits."""
    from ebpflb.maglev import compiled as maglev_compiled

    maglev_compiled.warm_up()
    while True:
        ready, _, _ = select.select([requests], [], [], idle)
        if not ready:
            return
        try:
            offsets, skips, weights, backend_starts, slot_starts = (
                _read(requests, np.int64) for _ in range(5)
            )
        except EOFError:
            return  # the agent closed the pipe
        out = np.empty(int(slot_starts[-1]) if len(slot_starts) else 0, np.int32)
        maglev_compiled.fill_many(offsets, skips, weights, backend_starts, out, slot_starts)
        _write(answers, out)
        answers.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer, float(sys.argv[1]) if len(sys.argv) > 1 else 30.0)
