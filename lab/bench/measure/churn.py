"""Sustained churn: endpoint changes written to the API at a fixed rate, and the API write
-> map entry latency of a random sample of them.

The writer (the calling thread) writes change i at start + i/rate: one service's slice,
its last endpoint toggling between ready and not ready, the services visited in a shuffled
order. A random `sample` share of the changes (drawn per change, so no stride aliases with
the agent's sync period) is handed to the poller with its write time and the backend count
it must produce. The poller (one thread) looks up only those outstanding service entries in
the pinned map, one lookup each per pass, then sleeps `poll` seconds: at 1,000 changes/s,
10% sampled and latencies of tens of ms, a pass reads a handful of keys, so the poller
costs a few percent of a core (measured: its thread CPU time is reported) and adds at most
`poll` plus one pass to each figure. Polling every change or dumping the whole map each
pass would compete with the agent for the machine's two cores and skew what it measures.

A sampled change whose service is written again before the map showed it cannot be told
apart from the next one: it counts as timed out (the services are revisited every
N / rate seconds, far longer than the latencies measured).
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import TYPE_CHECKING

from lab.bench.scenario import PORT, BenchService, slice_object

if TYPE_CHECKING:
    from ebpflb.datapath.maps import MapSet
    from lab.harness.fakeapi import FakeApiServer

TIMEOUT = 10.0  # a sampled change not in the map by then is counted as timed out
POLL = 0.001


@dataclass(frozen=True)
class ChurnFigures:
    written: int
    writing_s: float  # first write -> last write returned
    writer_lag_max_s: float
    latencies_s: tuple[float, ...]  # of the sampled changes seen in the map
    timed_out: int
    poller_cpu_s: float
    # Time between the starts of the poller's passes: its real resolution. A pass that
    # starts late (the process descheduled) adds its lateness to the changes it sees.
    poller_gaps_s: tuple[float, ...]


@dataclass
class _Pending:
    index: int  # service index
    backends: int  # the backend count the change produces
    written: float  # perf_counter just before the API write


class _Poller(threading.Thread):
    """Looks up the outstanding sampled changes' service entries until each shows its
    backend count (or times out)."""

    def __init__(self, maps: MapSet, services: Sequence[BenchService], poll: float):
        super().__init__(name="churn-poller", daemon=True)
        from ebpflb.model import Frontend, Proto

        self._frontends = [Frontend(IPv4Address(s.vip), PORT, Proto.TCP) for s in services]
        self._maps = maps
        self._poll = poll
        self.inbox: collections.deque[_Pending] = collections.deque()
        self.stop = threading.Event()  # set when the writer is done: drain, then exit
        self.latencies: list[float] = []
        self.timed_out = 0
        self.cpu_s = 0.0
        self.gaps: list[float] = []
        self.outstanding: dict[int, _Pending] = {}  # service index -> its sampled change

    def run(self) -> None:
        cpu = time.thread_time()
        services = self._maps.services
        outstanding = self.outstanding
        last = time.perf_counter()
        while True:
            now = time.perf_counter()
            self.gaps.append(now - last)
            last = now
            while self.inbox:
                pending = self.inbox.popleft()
                if pending.index in outstanding:  # rewritten before seen: indistinguishable
                    self.timed_out += 1
                outstanding[pending.index] = pending
            if not outstanding and self.stop.is_set() and not self.inbox:
                break
            for index, pending in list(outstanding.items()):
                entry = services.get(self._frontends[index])
                now = time.perf_counter()
                if entry is not None and entry.backend_count == pending.backends:
                    self.latencies.append(now - pending.written)
                    del outstanding[index]
                elif now - pending.written > TIMEOUT:
                    self.timed_out += 1
                    del outstanding[index]
            time.sleep(self._poll)
        self.cpu_s = time.thread_time() - cpu


def churn(
    api: FakeApiServer,
    bpffs: Path,
    services: Sequence[BenchService],
    *,
    rate: float,
    seconds: float,
    sample: float,
    skip: Collection[int] = (),
    poll: float = POLL,
    seed: int = 15,
) -> ChurnFigures:
    """Write `rate` endpoint changes per second for `seconds`; the latency of a `sample`
    share of them (see the module's docstring). Every service starts with all endpoints
    ready, except those in `skip`, which are left alone."""
    from ebpflb.datapath.maps.kernel import KernelMapSet

    rng = random.Random(seed)
    skipped = set(skip)
    order = [i for i in range(len(services)) if i not in skipped]
    rng.shuffle(order)
    not_ready = [0] * len(services)  # the bench's slices start all ready
    total = int(rate * seconds)
    lag_max = 0.0
    with KernelMapSet(bpffs) as maps:
        poller = _Poller(maps, services, poll)
        poller.start()
        started = time.perf_counter()
        try:
            for i in range(total):
                due = started + i / rate
                now = time.perf_counter()
                if now < due:
                    time.sleep(due - now)
                else:
                    lag_max = max(lag_max, now - due)
                index = order[i % len(order)]
                svc = services[index]
                not_ready[index] ^= 1
                written = time.perf_counter()
                api.update(slice_object(svc, not_ready=not_ready[index]))
                if rng.random() < sample:
                    poller.inbox.append(
                        _Pending(index, svc.endpoint_count - not_ready[index], written)
                    )
            writing_s = time.perf_counter() - started
        finally:
            poller.stop.set()
            poller.join(TIMEOUT + 5)
    return ChurnFigures(
        written=total,
        writing_s=writing_s,
        writer_lag_max_s=lag_max,
        latencies_s=tuple(poller.latencies),
        timed_out=poller.timed_out + len(poller.outstanding),
        poller_cpu_s=poller.cpu_s,
        poller_gaps_s=tuple(poller.gaps),
    )
