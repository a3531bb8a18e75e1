"""Service state -> the frontends and weighted backends the maps should hold. Pure.

Endpoint choice follows kube-proxy: ready endpoints serve; when none is ready, endpoints
that are still serving while terminating do (so a rolling update of a one-replica
Deployment does not refuse connections); with neither, the frontend refuses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ebpflb.model import (
    Backend,
    BackendFlags,
    Endpoint,
    Frontend,
    ServicePort,
    ServicePortName,
    SvcFlags,
)
from ebpflb.tracker import ServiceState

DEFAULT_WEIGHT = 1


@dataclass(frozen=True, slots=True, order=True)
class WeightedBackend:
    backend: Backend
    weight: int = DEFAULT_WEIGHT
    flags: BackendFlags = BackendFlags.NONE


@dataclass(frozen=True, slots=True)
class DesiredFrontend:
    """One entry of ebpflb_svc4 as it should be, with the backends its table spreads over."""

    frontend: Frontend
    service: ServicePortName
    flags: SvcFlags
    backends: tuple[WeightedBackend, ...]  # sorted: equal sets compare equal

    @property
    def usable(self) -> bool:
        return any(b.weight > 0 for b in self.backends)


def usable_endpoints(endpoints: Iterable[Endpoint]) -> tuple[tuple[Endpoint, ...], bool]:
    """(endpoints to use, whether they are the terminating fallback)."""
    endpoints = tuple(endpoints)
    ready = tuple(ep for ep in endpoints if ep.ready)
    if ready:
        return ready, False
    return tuple(ep for ep in endpoints if ep.serving and ep.terminating), True


def frontends_for_port(
    port: ServicePort, endpoints: Iterable[Endpoint], node_name: str = ""
) -> list[DesiredFrontend]:
    chosen, fallback = usable_endpoints(endpoints)
    backends = tuple(
        sorted(
            WeightedBackend(
                Backend(ep.address, ep.port, port.protocol),
                DEFAULT_WEIGHT,
                (
                    BackendFlags.LOCAL
                    if node_name and ep.node_name == node_name
                    else BackendFlags.NONE
                )
                | (BackendFlags.TERMINATING if ep.terminating else BackendFlags.NONE),
            )
            for ep in chosen
        )
    )
    flags = SvcFlags.TERMINATING if fallback and backends else SvcFlags.NONE
    return [
        DesiredFrontend(
            Frontend(ip, port.port, port.protocol), port.name, SvcFlags.CLUSTER_IP | flags, backends
        )
        for ip in port.cluster_ips
    ]


def frontends_for_service(
    state: ServiceState, node_name: str = ""
) -> dict[Frontend, DesiredFrontend]:
    result: dict[Frontend, DesiredFrontend] = {}
    for name, port in sorted(state.ports.items()):
        for desired in frontends_for_port(port, state.endpoints.get(name, ()), node_name):
            result[desired.frontend] = desired
    return result
