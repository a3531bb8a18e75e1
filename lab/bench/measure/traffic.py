"""Data-plane measurements: connect() latency in interleaved batches, and connection or
request rates, through the compiled client (lab.bench.loadgen).

Nothing here knows which proxy serves the addresses: a Client says where to connect from
and to, and `flush` forgets connection tracking state before each batch or run (the
kube-proxy modes NAT through conntrack). Every mode given is measured in the same rounds,
so a slow or fast phase of the machine lands on all of them alike.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from lab.bench import loadgen
from lab.bench.records.compare import ConnectLatency, LatencySummary, Rate, Target
from lab.bench.stats import percentile

if TYPE_CHECKING:
    from lab.harness.netns import Cgroup

# Everything on one core: a wake-up across CPUs costs more than a whole connection on
# this kind of VM (measured: ~150 µs), which would measure the hypervisor, not the proxy.
CLIENT_CPU = 0
K = TypeVar("K", bound=Hashable)  # what the caller names its clients by


@dataclass(frozen=True)
class Client:
    """Who connects where: the namespace and cgroup it runs in, and the address block
    ("service i" is base + i + 1) and port it targets."""

    netns: str
    base: str
    port: int
    cgroup: Cgroup | None = None

    def target_args(self, target: Target, n: int) -> dict[str, int]:
        if target is Target.FIRST:
            return {"index": 0}
        if target is Target.LAST:
            return {"index": n - 1}
        return {"random_count": n}


def latency_summary(samples_ns: Sequence[int], errors: int) -> LatencySummary:
    if not samples_ns:
        return LatencySummary(samples=0, errors=errors)
    values = sorted(s / 1000 for s in samples_ns)
    return LatencySummary(
        samples=len(values),
        errors=errors,
        p50_us=percentile(values, 0.50),
        p99_us=percentile(values, 0.99),
        mean_us=statistics.fmean(values),
    )


def measure_latency(
    clients: Mapping[K, Client],
    n: int,
    *,
    rounds: int,
    batch: int,
    flush: Callable[[], None],
) -> dict[K, ConnectLatency]:
    """Interleaved batches: every round runs one batch of `batch` connects per (target,
    client), in an order that rotates, with `flush` before each. Client key -> figures."""
    samples: dict[tuple[K, Target], list[int]] = {}
    errors: dict[tuple[K, Target], int] = {}
    first_error: dict[K, str] = {}
    order = [(key, target) for target in Target for key in clients]
    for round_index in range(rounds):
        shift = round_index % len(order)
        for key, target in order[shift:] + order[:shift]:
            client = clients[key]
            flush()
            result = loadgen.latency(
                client.netns,
                client.base,
                client.port,
                batch,
                cpu=CLIENT_CPU,
                cgroup=client.cgroup,
                **client.target_args(target, n),
            )
            samples.setdefault((key, target), []).extend(result.samples_ns)
            errors[(key, target)] = errors.get((key, target), 0) + result.errors
            if result.errors and result.first_error:
                first_error.setdefault(key, result.first_error)
    return {
        key: ConnectLatency(
            first=latency_summary(samples[(key, Target.FIRST)], errors[(key, Target.FIRST)]),
            last=latency_summary(samples[(key, Target.LAST)], errors[(key, Target.LAST)]),
            random=latency_summary(samples[(key, Target.RANDOM)], errors[(key, Target.RANDOM)]),
            first_error=first_error.get(key),
        )
        for key in clients
    }


def measure_rates(
    clients: Mapping[K, tuple[Client, int]],
    *,
    repeats: int,
    seconds: float,
    flush: Callable[[], None],
    request: bool,
) -> dict[K, Rate]:
    """Connections (or request/response exchanges, if `request`) per second to service
    index (the int of each client) on one core, the clients' runs interleaved and their
    order reversed every other repeat; the median of the repeats."""

    def one_run(client: Client, index: int) -> loadgen.RateResult:
        return loadgen.rate(
            client.netns,
            client.base,
            client.port,
            seconds,
            index=index,
            cpu=CLIENT_CPU,
            cgroup=client.cgroup,
            request=request,
        )

    return _interleaved(clients, repeats, flush, one_run)


def measure_request_response(
    clients: Mapping[K, tuple[Client, int]],
    *,
    flows: int,
    new_connection: bool,
    repeats: int,
    seconds: float,
    flush: Callable[[], None],
) -> dict[K, Rate]:
    """Transactions per second of `flows` request/response flows at once (RR, or CRR with
    `new_connection`) to service index, on one core, interleaved as measure_rates."""

    def one_run(client: Client, index: int) -> loadgen.RateResult:
        return loadgen.request_response(
            client.netns,
            client.base,
            client.port,
            seconds,
            flows,
            new_connection=new_connection,
            index=index,
            cpu=CLIENT_CPU,
            cgroup=client.cgroup,
        )

    return _interleaved(clients, repeats, flush, one_run)


def _interleaved(
    clients: Mapping[K, tuple[Client, int]],
    repeats: int,
    flush: Callable[[], None],
    one_run: Callable[[Client, int], loadgen.RateResult],
) -> dict[K, Rate]:
    """Each client's runs, interleaved, the order reversed every other repeat; the median."""
    runs: dict[K, list[float]] = {key: [] for key in clients}
    failures: dict[K, int] = dict.fromkeys(clients, 0)
    first_error: dict[K, str] = {}
    for repeat in range(repeats):
        keys = list(clients)
        if repeat % 2:
            keys.reverse()
        for key in keys:
            flush()
            result = one_run(*clients[key])
            runs[key].append(result.rate)
            failures[key] += result.errors
            if result.errors and result.first_error:
                first_error.setdefault(key, result.first_error)
    return {
        key: Rate(statistics.median(rates), tuple(rates), failures[key], first_error.get(key))
        for key, rates in runs.items()
    }
