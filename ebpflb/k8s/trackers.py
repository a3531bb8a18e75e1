"""Change trackers in the kube-proxy manner: the current picture plus what changed since
the last sync.

Sources call ``update(obj)``/``delete(ref)`` from their own threads; the sync loop calls
``take_changes()``. Per object the tracker remembers the state at the last sync
("previous") and the latest ("current"); when an update returns an object to its previous
state the change is dropped, so a flapping object costs no map write. Several slices of one
Service are merged before comparing. Both sources (manifests, Kubernetes) feed the same
trackers: one code path from objects to maps.

The sync reads the *synced* view: the state as of its ``take_changes()`` (kube-proxy's
serviceMap, updated with the changes at the start of a sync). An update recorded while a
sync runs stays pending against what that sync programs; were the sync to read the latest
state instead, a later update back to the older state would cancel out against a baseline
the datapath no longer has, and wait for the next full resync.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from ebpflb.k8s.translate import (
    ServiceTranslation,
    SliceTranslation,
    endpoints_for_port,
)
from ebpflb.model import Endpoint, NamespacedName, ServicePort, ServicePortName

PortMap = Mapping[ServicePortName, ServicePort]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ServiceState:
    """What one Service (all its ports) looks like to the proxy right now."""

    ports: PortMap
    endpoints: Mapping[ServicePortName, tuple[Endpoint, ...]]


class _ChangeLog(ABC, Generic[T]):
    """Per Service, its state at the last sync while it differs from the current one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._previous: dict[NamespacedName, T] = {}

    def take_changes(self) -> set[NamespacedName]:
        """The Services changed since the last call (the sync about to run); their latest
        state becomes the synced view the sync reads."""
        with self._lock:
            changed = set(self._previous)
            for ref in changed:
                self._commit(ref)
            self._previous.clear()
            return changed

    @abstractmethod
    def _commit(self, ref: NamespacedName) -> None:
        """Copy one Service's latest state into the synced view (lock held)."""

    def pending(self) -> int:
        with self._lock:
            return len(self._previous)


class ServiceTracker(_ChangeLog[PortMap]):
    """Translated Services by name; remembers which changed since the last sync."""

    def __init__(self) -> None:
        super().__init__()
        self._latest: dict[NamespacedName, ServiceTranslation] = {}
        self._synced: dict[NamespacedName, ServiceTranslation] = {}

    def update(self, translation: ServiceTranslation) -> bool:
        """Record a translated Service; True when something is now pending."""
        with self._lock:
            return self._record(translation.ref, translation)

    def delete(self, ref: NamespacedName) -> bool:
        with self._lock:
            return self._record(ref, None)

    def _record(self, ref: NamespacedName, new: ServiceTranslation | None) -> bool:
        old = self._latest.get(ref)
        self._previous.setdefault(ref, dict(old.ports) if old else {})
        if new is None:
            self._latest.pop(ref, None)
        else:
            self._latest[ref] = new
        if self._previous[ref] == (dict(new.ports) if new else {}):
            del self._previous[ref]  # cancelled out: the same ports as synced
            self._commit(ref)  # what else changed (a skip reason) programs nothing
        return bool(self._previous)

    def _commit(self, ref: NamespacedName) -> None:
        latest = self._latest.get(ref)
        if latest is None:
            self._synced.pop(ref, None)
        else:
            self._synced[ref] = latest

    def get(self, ref: NamespacedName) -> ServiceTranslation | None:
        """The Service as of the last take_changes (what the sync programs)."""
        with self._lock:
            return self._synced.get(ref)

    def latest(self, ref: NamespacedName) -> ServiceTranslation | None:
        """The Service as last recorded, synced or not (for reporting an update)."""
        with self._lock:
            return self._latest.get(ref)

    def refs(self) -> set[NamespacedName]:
        with self._lock:
            return set(self._synced)

    def skipped(self) -> dict[NamespacedName, str]:
        with self._lock:
            return {ref: t.skipped for ref, t in self._synced.items() if t.skipped}


class EndpointSliceTracker(_ChangeLog[tuple[SliceTranslation, ...]]):
    """EndpointSlices grouped by the Service they belong to (kube-proxy's slice cache).

    Also kube-proxy's EndpointsChangeTracker bookkeeping for its metrics: the slice updates
    that changed something since the last sync (endpoint changes pending), and per Service
    the last-change-trigger-time of each such update (network programming latency), those
    up to `start_time` (unix) excepted: they were programmed before this tracker existed.
    """

    def __init__(self, start_time: float = float("-inf")) -> None:
        super().__init__()
        self.start_time = start_time
        self._slices: dict[NamespacedName, SliceTranslation] = {}
        self._by_service: dict[NamespacedName, dict[NamespacedName, SliceTranslation]] = {}
        self._synced: dict[NamespacedName, tuple[SliceTranslation, ...]] = {}
        self._trigger_times: dict[NamespacedName, list[float]] = {}
        self._updates = 0  # slice updates that changed something, since the last sync

    def update(self, translation: SliceTranslation) -> bool:
        with self._lock:
            old = self._slices.get(translation.ref)
            if old is not None and old.service != translation.service:
                self._change(old.service, old.ref, None)  # label moved to another service
            self._slices[translation.ref] = translation
            self._change(translation.service, translation.ref, translation)
            if old != translation:  # trigger times aside (not compared)
                self._updates += 1
                when = translation.trigger_time
                if when is not None and when > self.start_time:
                    self._trigger_times.setdefault(translation.service, []).append(when)
            if translation.service not in self._previous:  # no change left to program
                self._trigger_times.pop(translation.service, None)
            return bool(self._previous)

    def delete(self, ref: NamespacedName) -> bool:
        with self._lock:
            old = self._slices.pop(ref, None)
            if old is not None:
                self._change(old.service, ref, None)
                self._updates += 1
                # kube-proxy too: a deletion's trigger time is that of the last update.
                self._trigger_times.pop(old.service, None)
            return bool(self._previous)

    def take_changes(self) -> set[NamespacedName]:
        with self._lock:
            self._updates = 0
        return super().take_changes()

    def pending_updates(self) -> int:
        """Slice updates and deletions that changed something since the last sync."""
        with self._lock:
            return self._updates

    def take_trigger_times(self) -> dict[NamespacedName, list[float]]:
        """The trigger times recorded since the last call, by Service (call it before
        take_changes: a time recorded in between is then observed a sync late, never
        before its change is programmed)."""
        with self._lock:
            times, self._trigger_times = self._trigger_times, {}
            return times

    def _change(
        self, service: NamespacedName, ref: NamespacedName, new: SliceTranslation | None
    ) -> None:
        group = self._by_service.setdefault(service, {})
        self._previous.setdefault(service, _merged(group))
        if new is None:
            group.pop(ref, None)
        else:
            group[ref] = new
        if not group:
            del self._by_service[service]
        merged = _merged(group)
        if self._previous[service] == merged:
            del self._previous[service]
            self._set_synced(service, merged)  # trigger times aside, the same as synced

    def _commit(self, ref: NamespacedName) -> None:
        self._set_synced(ref, _merged(self._by_service.get(ref, {})))

    def _set_synced(self, ref: NamespacedName, merged: tuple[SliceTranslation, ...]) -> None:
        if merged:
            self._synced[ref] = merged
        else:
            self._synced.pop(ref, None)

    def slices_for(self, service: NamespacedName) -> tuple[SliceTranslation, ...]:
        """The Service's slices as of the last take_changes (what the sync programs)."""
        with self._lock:
            return self._synced.get(service, ())

    def services(self) -> set[NamespacedName]:
        with self._lock:
            return set(self._synced)


def _merged(group: Mapping[NamespacedName, SliceTranslation]) -> tuple[SliceTranslation, ...]:
    """The slices of one Service in a canonical order, comparable across time."""
    return tuple(group[ref] for ref in sorted(group))


def service_state(
    services: ServiceTracker, slices: EndpointSliceTracker, ref: NamespacedName
) -> ServiceState | None:
    """The current ports and merged endpoints of one Service; None if it is not programmed."""
    translation = services.get(ref)
    if translation is None or translation.skipped:
        return None
    group = slices.slices_for(ref)
    return ServiceState(
        ports=translation.ports,
        endpoints={name: endpoints_for_port(name, group) for name in translation.ports},
    )
