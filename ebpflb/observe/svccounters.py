"""Per-frontend datapath counters (ebpflb_svcstats) as Prometheus counters, read at scrape
time: one series per programmed frontend and counter, labelled with its service, port
name, frontend address and protocol. `--per-service-metrics=false` keeps only the totals
(one unlabelled series per counter) for clusters where a series per frontend is too many.

The frontends come from the reconciler's record of what it wrote (service id -> frontend
and name), so a scrape costs one batched map read of ids 1..highest, not a walk of the
service map.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from ebpflb.datapath.maps import ServiceCounterMap, ServiceCounters, ServiceEntry
from ebpflb.model import Frontend, Scope, host_port

log = logging.getLogger(__name__)

LABELS = ("service", "port", "frontend", "protocol")


@dataclass(frozen=True, slots=True)
class CounterMetric:
    field: str  # ServiceCounters field
    name: str  # metric family name (prometheus_client adds _total)
    help: str


METRICS = (
    CounterMetric(
        "sock_xlated",
        "ebpflb_service_socket_translations",
        "connect() and sendmsg() calls to the frontend translated to a backend (socket-LB;"
        " unconnected UDP counts each sendmsg()).",
    ),
    CounterMetric(
        "refused",
        "ebpflb_service_refused",
        "connect()/sendmsg() calls refused (socket-LB) and NodePort/LoadBalancer packets"
        " dropped because the frontend had no usable backend.",
    ),
    CounterMetric(
        "np_flows",
        "ebpflb_service_nodeport_flows",
        "NodePort/LoadBalancer/external-IP flows started towards a backend (tc or XDP).",
    ),
    CounterMetric(
        "np_packets",
        "ebpflb_service_nodeport_packets",
        "NodePort/LoadBalancer/external-IP packets translated towards a backend (tc or XDP).",
    ),
    CounterMetric(
        "np_bytes",
        "ebpflb_service_nodeport_bytes",
        "Bytes of those packets as the hook saw them (Ethernet header included).",
    ),
)


class FrontendRecord(Protocol):
    """What the collector needs of a programmed frontend (reconcile.state.Realized)."""

    @property
    def entry(self) -> ServiceEntry: ...

    @property
    def name(self) -> str: ...


def frontend_label(frontend: Frontend) -> str:
    suffix = "/internal" if frontend.scope == Scope.INTERNAL else ""
    return f"{host_port(frontend.address, frontend.port)}{suffix}"


def labels(frontend: Frontend, name: str) -> tuple[str, str, str, str]:
    """(service, port, frontend, protocol) from a frontend and its "ns/name:port"."""
    service, _, port = name.rpartition(":")
    return service, port, frontend_label(frontend), frontend.protocol.name


class ServiceCounterCollector(Collector):
    """ebpflb_service_* counters from ebpflb_svcstats, at scrape time."""

    def __init__(
        self,
        counters: ServiceCounterMap,
        frontends: Callable[[], Mapping[Frontend, FrontendRecord]],
        *,
        per_service: bool = True,
    ) -> None:
        self._counters = counters
        self._frontends = frontends
        self.per_service = per_service

    def collect(self) -> Iterator[CounterMetricFamily]:
        families = [
            CounterMetricFamily(m.name, m.help, labels=LABELS if self.per_service else None)
            for m in METRICS
        ]
        try:
            # list(): one C-level copy, safe against the sync thread changing the dict.
            records = list(self._frontends().items())
            upto = max((r.entry.svc_id for _, r in records), default=0)
            values = self._counters.read(upto)
        except Exception:  # a scrape must not take the agent down
            log.exception("reading per-service datapath counters failed")
            return
        zero = ServiceCounters()
        if self.per_service:
            for frontend, record in records:
                counters = values.get(record.entry.svc_id, zero)
                series = labels(frontend, record.name)
                for family, metric in zip(families, METRICS, strict=True):
                    family.add_metric(series, getattr(counters, metric.field))
        else:
            live = {r.entry.svc_id for _, r in records}
            for family, metric in zip(families, METRICS, strict=True):
                total = sum(getattr(c, metric.field) for i, c in values.items() if i in live)
                family.add_metric([], total)
        yield from families
