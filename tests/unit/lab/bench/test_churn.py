"""The churn poller's bookkeeping, on in-memory maps (no kernel): a change seen in the map
is timed from its write, one rewritten before it was seen or never seen counts as timed
out, and the poller records the gaps between its passes."""

from __future__ import annotations

import time
from ipaddress import IPv4Address

from ebpflb.datapath.maps import ServiceEntry, SvcFlags
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.model import Frontend, Proto
from lab.bench.measure import churn
from lab.bench.scenario import PORT, bench_services


def _entry(backends: int) -> ServiceEntry:
    return ServiceEntry(1, 0, 509, backends, SvcFlags(0))


def test_the_poller_times_what_the_map_shows_and_counts_what_it_never_does() -> None:
    services = bench_services(3, 3)
    maps = FakeMapSet()
    frontends = [Frontend(IPv4Address(s.vip), PORT, Proto.TCP) for s in services]
    for frontend in frontends:
        maps.services.put(frontend, _entry(3))
    poller = churn._Poller(maps, services, poll=0.001)
    written = time.perf_counter()
    poller.inbox.append(churn._Pending(0, 2, written))  # will show
    poller.inbox.append(churn._Pending(1, 2, written))  # rewritten before it shows
    poller.inbox.append(churn._Pending(1, 3, written))
    poller.start()
    time.sleep(0.02)
    maps.services.put(frontends[0], _entry(2))
    deadline = time.monotonic() + 2
    while poller.outstanding.get(0) is not None or poller.inbox:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    poller.stop.set()
    poller.join(2)
    assert not poller.is_alive()
    # Service 1's second change matched at once (count 3); its first counts as timed out.
    assert poller.timed_out == 1
    assert len(poller.latencies) == 2
    assert max(poller.latencies) >= 0.02  # service 0: not before the map showed it
    assert poller.gaps and all(gap >= 0 for gap in poller.gaps)
    assert poller.cpu_s >= 0
