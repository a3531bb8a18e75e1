"""One endpoint change, timed from the write to the pinned map showing it.

The agent under test serves the bench's services from a fake API server (or a manifest
file); for each service picked, one of its endpoints turns not ready there (the slice
written to the API, or its document edited in the file), and this process polls the
pinned service entry (through the datapath's own map reader) until it shows one backend
fewer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path
from typing import Any

from ebpflb.errors import EbpflbError
from lab.bench.measure.cost import live_threads_cpu_seconds
from lab.bench.scenario import PORT, BenchService, slice_object

CHANGE_TIMEOUT = 30.0


@dataclass(frozen=True)
class ChangeTiming:
    seconds: float  # API write -> map entry changed
    cpu_s: float  # the agent's CPU time meanwhile (all its live threads)


def change_latencies(
    write: Callable[[Mapping[str, Any]], object],
    bpffs: Path,
    services: Sequence[BenchService],
    picks: Sequence[int],
    *,
    agent_pid: int,
    pause: float,
) -> list[ChangeTiming]:
    """Per service index in `picks`: one of its endpoints turns not ready (`write` puts
    the slice where the agent reads it: FakeApiServer.update, ManifestFile.write_change);
    how long until the pinned entry has one backend fewer, and the agent's CPU seconds.
    `pause` before each, so that each is a lone change."""
    # Imported here: the bench's other parts (and --help) work without bcc.
    from ebpflb.datapath.maps.kernel import KernelMapSet
    from ebpflb.model import Frontend, Proto

    results = []
    with KernelMapSet(bpffs) as maps:
        for index in picks:
            svc = services[index]
            frontend = Frontend(ip_address(svc.vip), PORT, Proto.TCP)
            entry = maps.services.get(frontend)
            if entry is None or entry.backend_count != svc.endpoint_count:
                raise EbpflbError(f"{svc.name}: unexpected map entry {entry}")
            time.sleep(pause)
            cpu = live_threads_cpu_seconds(agent_pid)
            started = time.perf_counter()
            write(slice_object(svc, not_ready=1))
            while (entry := maps.services.get(frontend)) is None or (
                entry.backend_count != svc.endpoint_count - 1
            ):
                if time.perf_counter() - started > CHANGE_TIMEOUT:
                    raise EbpflbError(
                        f"{svc.name}: change not in the map after {CHANGE_TIMEOUT:g} s"
                    )
                time.sleep(0.0001)
            latency = time.perf_counter() - started
            time.sleep(0.05)  # the agent finishes the sync it was in
            results.append(ChangeTiming(latency, live_threads_cpu_seconds(agent_pid) - cpu))
    return results
