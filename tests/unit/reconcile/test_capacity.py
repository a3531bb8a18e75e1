"""A frontend that cannot be programmed fails alone (issue 17, "Capacity"): named with the
limit it hit, counted, its allocations given back before any other frontend is planned,
and retried by the next apply, while every other frontend is programmed."""

from __future__ import annotations

import dataclasses
import logging
from ipaddress import IPv4Address, IPv4Network

import pytest
from prometheus_client import CollectorRegistry

from ebpflb import maglev
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.desired import DesiredFrontend, WeightedBackend
from ebpflb.model import Backend, Frontend, NamespacedName, Proto, ServicePortName, SvcFlags
from ebpflb.observe.metrics import Metrics
from ebpflb.reconcile import LOG_EACH_MAX, Reconciler

BIG = NamespacedName("default", "big")
SMALL = NamespacedName("default", "small")
OTHER = NamespacedName("default", "other")

State = dict[NamespacedName, dict[Frontend, DesiredFrontend]]


def fe(ip: str) -> Frontend:
    return Frontend(IPv4Address(ip), 80, Proto.TCP)


def service(owner: NamespacedName, ip: str, count: int, first: str) -> State:
    """One ClusterIP frontend with `count` backends from address `first` on."""
    backends = tuple(
        WeightedBackend(Backend(IPv4Address(first) + i, 8080, Proto.TCP)) for i in range(count)
    )
    want = DesiredFrontend(
        fe(ip), ServicePortName(owner, "http", Proto.TCP), SvcFlags.CLUSTER_IP, backends
    )
    return {owner: {fe(ip): want}}


def programmed(maps: FakeMapSet) -> set[str]:
    return {maps.service_meta.data[e.svc_id] for e in maps.services.data.values()}


def sample(rec: Reconciler, name: str, labels: dict[str, str] | None = None) -> float | None:
    assert rec.metrics is not None
    return rec.metrics.registry.get_sample_value(name, labels or {})


def test_more_backends_than_the_largest_table_fails_only_that_frontend() -> None:
    """--maglev-max-table-size 101 and a 120-backend service: Maglev needs M >= N."""
    maps = FakeMapSet()
    rec = Reconciler(maps, max_table_size=101, metrics=Metrics(CollectorRegistry()))
    state = {
        **service(BIG, "10.96.0.10", 120, "10.244.1.1"),  # planned first
        **service(SMALL, "10.96.0.20", 3, "10.244.2.1"),
    }
    result = rec.apply(state, full=True)
    assert programmed(maps) == {"default/small:http"}
    assert result.failed == {BIG} and result.added == 1
    (message,) = result.errors
    assert "default/big:http 10.96.0.10:80/TCP not programmed" in message
    assert "120 backends" in message and "101" in message
    assert "--maglev-max-table-size" in message  # the fix
    assert (
        sample(rec, "ebpflb_map_errors_total", {"map": "ebpflb_slots", "reason": "table_size"}) == 1
    )
    # Nothing of the failed frontend stays: no backend, service id or slot range.
    assert {str(b.backend.address) for b in maps.backends.data.values()} == {
        "10.244.2.1",
        "10.244.2.2",
        "10.244.2.3",
    }
    assert sorted(maps.backends.data) == [1, 2, 3]
    assert [(e.svc_id, e.table_off) for e in maps.services.data.values()] == [(1, 0)]
    # A full resync meets it again: the rest is still repaired, it fails again, counted.
    del maps.services.data[fe("10.96.0.20")]
    rec.restore()
    again = rec.apply(state, full=True)
    assert again.failed == {BIG} and programmed(maps) == {"default/small:http"}
    assert (
        sample(rec, "ebpflb_map_errors_total", {"map": "ebpflb_slots", "reason": "table_size"}) == 2
    )
    # Once it fits, the retry programs it.
    fixed = rec.apply(service(BIG, "10.96.0.10", 101, "10.244.1.1"))
    assert fixed.errors == [] and fixed.added == 1
    assert programmed(maps) == {"default/small:http", "default/big:http"}


def test_fewer_than_100_slots_per_backend_uses_the_largest_table_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    maps = FakeMapSet()
    rec = Reconciler(maps, max_table_size=101, metrics=Metrics(CollectorRegistry()))
    with caplog.at_level(logging.WARNING, logger="ebpflb.reconcile"):
        result = rec.apply(service(BIG, "10.96.0.10", 90, "10.244.1.1"))
    assert result.errors == [] and maps.services.data[fe("10.96.0.10")].table_size == 101
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "default/big:http 10.96.0.10:80/TCP" in warning and "90 backends" in warning
    assert "101 slots" in warning and "--maglev-max-table-size" in warning
    assert sample(rec, "ebpflb_maglev_undersized_tables") == 1
    rec.apply(service(BIG, "10.96.0.10", 1, "10.244.1.1"))
    assert sample(rec, "ebpflb_maglev_undersized_tables") == 0


@pytest.mark.parametrize("big_first", [True, False])
def test_a_service_over_the_backend_map_fails_alone_and_blames_itself(big_first: bool) -> None:
    """--max-backends 8 and a 10-backend service: the small service is programmed whether
    it is planned before or after the big one (which gave its ids back at once)."""
    maps = FakeMapSet(max_backends=8)
    rec = Reconciler(maps, metrics=Metrics(CollectorRegistry()))
    big_ip, small_ip = ("10.96.0.10", "10.96.0.20") if big_first else ("10.96.0.20", "10.96.0.10")
    state = {
        **service(BIG, big_ip, 10, "10.244.1.1"),
        **service(SMALL, small_ip, 2, "10.244.2.1"),
    }
    result = rec.apply(state)
    assert result.failed == {BIG}
    assert programmed(maps) == {"default/small:http"}
    (message,) = result.errors
    assert f"default/big:http {big_ip}:80/TCP not programmed" in message
    assert "ebpflb_be4 is full (limit 8)" in message and "--max-backends" in message
    assert sample(rec, "ebpflb_map_errors_total", {"map": "ebpflb_be4", "reason": "full"}) == 1
    assert sorted(maps.backends.data) == [1, 2]
    # Retried at every apply, it never takes another service's room.
    more = rec.apply({**state, **service(OTHER, "10.96.0.30", 6, "10.244.3.1")})
    assert more.failed == {BIG}
    assert programmed(maps) == {"default/small:http", "default/other:http"}
    assert len(maps.backends.data) == 8


def test_a_failed_frontend_gives_back_its_service_id_and_slot_range() -> None:
    maps = FakeMapSet(max_backends=4)
    rec = Reconciler(maps)
    failed = rec.apply(service(BIG, "10.96.0.10", 5, "10.244.1.1"))
    assert failed.failed == {BIG} and not maps.services.data and not maps.backends.data
    rec.apply(service(SMALL, "10.96.0.20", 4, "10.244.2.1"))
    (entry,) = maps.services.data.values()
    assert (entry.svc_id, entry.table_off) == (1, 0)  # the first id and range again


def test_an_apply_that_raises_part_way_is_relearned_and_leaks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error no step expects (here: the service map's batch write raising) leaves the
    allocators unsure; the next apply relearns them from the maps first."""
    maps = FakeMapSet()
    rec = Reconciler(maps)
    state = {
        **service(BIG, "10.96.0.10", 3, "10.244.1.1"),
        **service(SMALL, "10.96.0.20", 2, "10.244.2.1"),
    }

    def broken(items: object) -> object:
        monkeypatch.undo()
        raise RuntimeError("unexpected")

    monkeypatch.setattr(maps.services, "put_many", broken)
    with pytest.raises(RuntimeError):
        rec.apply(state)
    assert not maps.services.data and len(maps.backends.data) == 5  # written, not named
    result = rec.apply(state)
    assert result.added == 2 and result.errors == []
    assert sorted(e.svc_id for e in maps.services.data.values()) == [1, 2]
    assert sorted(e.table_off for e in maps.services.data.values()) == [0, 510]
    assert sorted(maps.backends.data) == [1, 2, 3, 4, 5]


def test_a_table_that_cannot_be_built_fails_only_its_frontend() -> None:
    """Tables are built in one batch; a bad one (here a weight over Maglev's u32) makes the
    batch be built one by one, and only that frontend fails."""
    maps = FakeMapSet()
    rec = Reconciler(maps, metrics=Metrics(CollectorRegistry()))
    state = {
        **service(BIG, "10.96.0.10", 2, "10.244.1.1"),
        **service(SMALL, "10.96.0.20", 2, "10.244.2.1"),
    }
    (want,) = state[BIG].values()
    heavy = (WeightedBackend(want.backends[0].backend, maglev.MAX_WEIGHT + 1), want.backends[1])
    state[BIG] = {want.frontend: dataclasses.replace(want, backends=heavy)}
    result = rec.apply(state)
    assert result.failed == {BIG} and programmed(maps) == {"default/small:http"}
    assert "weight of '10.244.1.1:8080'" in result.errors[0]
    assert sample(rec, "ebpflb_map_errors_total", {"map": "ebpflb_slots", "reason": "error"}) == 1
    assert {str(b.backend.address) for b in maps.backends.data.values()} == {
        "10.244.2.1",
        "10.244.2.2",
    }


@pytest.mark.parametrize(
    ("limits", "hit"),
    [
        ({"slot_pool_size": 300}, "ebpflb_slots is full (limit 300)"),
        ({"src_range_max": 2}, "ebpflb_srcrng4 is full (limit 2)"),
        ({}, "ebpflb_be4 is full (limit 3)"),
    ],
)
def test_whatever_limit_a_frontend_hits_it_gives_back_all_it_took_first(
    limits: dict[str, int], hit: str
) -> None:
    """The first frontend planned takes the only service id and every backend id, then
    hits a limit; the next one needs a service id and a backend id."""
    maps = FakeMapSet(**{"max_services": 1, "max_backends": 3, **limits})
    rec = Reconciler(maps)
    state = {
        **service(BIG, "10.96.0.10", 6, "10.244.1.1"),
        **service(SMALL, "10.96.0.20", 1, "10.244.2.1"),
    }
    (want,) = state[BIG].values()
    if "src_range_max" in limits:  # three source ranges, and few enough backends to fit
        ranges = tuple(IPv4Network(f"198.51.100.{i}/32") for i in range(3))
        state[BIG] = {
            want.frontend: dataclasses.replace(
                want, backends=want.backends[:3], source_ranges=ranges
            )
        }
    elif "slot_pool_size" in limits:  # 3 backends need a 509-slot table
        state[BIG] = {want.frontend: dataclasses.replace(want, backends=want.backends[:3])}
    result = rec.apply(state)
    assert result.failed == {BIG} and hit in result.errors[0]
    assert programmed(maps) == {"default/small:http"}
    assert [e.svc_id for e in maps.services.data.values()] == [1]


def test_many_failures_log_a_bounded_number_of_lines(caplog: pytest.LogCaptureFixture) -> None:
    maps = FakeMapSet(max_services=1)
    rec = Reconciler(maps)
    state: State = {}
    for i in range(LOG_EACH_MAX + 11):
        owner = NamespacedName("default", f"s{i}")
        state.update(service(owner, f"10.96.1.{i}", 1, "10.244.1.1"))
    with caplog.at_level(logging.ERROR, logger="ebpflb.reconcile"):
        result = rec.apply(state)
    assert len(result.errors) == LOG_EACH_MAX + 10  # one frontend fits
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == LOG_EACH_MAX + 1
    assert lines[-1].startswith("10 more frontends not programmed")
    # At the retry, the same failures are not logged again at error level.
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="ebpflb.reconcile"):
        assert len(rec.apply(state).errors) == LOG_EACH_MAX + 10
    assert caplog.records == []


def test_more_backends_than_a_frontend_can_count_fails_that_frontend() -> None:
    """struct lb_svc_val.backend_count is 16 bits: 65,536 backends cannot be named, even
    though the largest table (131,071 slots) would hold them."""
    maps = FakeMapSet(max_backends=70000)
    rec = Reconciler(maps, metrics=Metrics(CollectorRegistry()))
    result = rec.apply(service(BIG, "10.96.0.10", 65536, "10.200.0.0"))
    assert result.failed == {BIG} and not maps.backends.data
    assert "65536 backends exceed the limit of 65535" in result.errors[0]
    assert (
        sample(rec, "ebpflb_map_errors_total", {"map": "ebpflb_slots", "reason": "table_size"}) == 1
    )
