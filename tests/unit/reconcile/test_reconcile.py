from __future__ import annotations

import logging
from ipaddress import IPv4Address, IPv4Network

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from ebpflb import maglev
from ebpflb.datapath.maps import SourceRange
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.desired import DesiredFrontend, WeightedBackend
from ebpflb.model import Backend, Frontend, NamespacedName, Proto, ServicePortName, SvcFlags
from ebpflb.observe.metrics import Metrics
from ebpflb.reconcile import LOG_EACH_MAX, Reconciler

WEB = NamespacedName("default", "web")
API = NamespacedName("default", "api")


def fe(ip: str = "10.96.0.10", port: int = 80) -> Frontend:
    return Frontend(IPv4Address(ip), port, Proto.TCP)


def backends(*lasts: int, port: int = 8080) -> tuple[WeightedBackend, ...]:
    return tuple(
        WeightedBackend(Backend(IPv4Address(f"10.244.1.{n}"), port, Proto.TCP)) for n in lasts
    )


def desired(
    owner: NamespacedName, frontend: Frontend, bes: tuple[WeightedBackend, ...]
) -> dict[NamespacedName, dict[Frontend, DesiredFrontend]]:
    want = DesiredFrontend(
        frontend, ServicePortName(owner, "http", Proto.TCP), SvcFlags.CLUSTER_IP, bes
    )
    return {owner: {frontend: want}}


def table_names(maps: FakeMapSet, frontend: Frontend) -> list[str]:
    entry = maps.services.data[frontend]
    ids = maps.slots.read(entry.table_off, entry.table_size)
    return [str(maps.backends.data[int(i)].backend) for i in ids]


@pytest.fixture
def maps() -> FakeMapSet:
    return FakeMapSet(max_services=8, max_backends=64, slot_pool_size=4096)


def test_new_service_is_written_with_the_maglev_table(maps: FakeMapSet) -> None:
    rec = Reconciler(maps)
    result = rec.apply(desired(WEB, fe(), backends(11, 12, 13)))
    assert (result.added, result.errors) == (1, [])
    entry = maps.services.data[fe()]
    assert entry.table_size == maglev.table_size_for(3) and entry.backend_count == 3
    assert maps.service_meta.data[entry.svc_id] == "default/web:http"
    expected = maglev.build_table(
        ["10.244.1.11:8080", "10.244.1.12:8080", "10.244.1.13:8080"], entry.table_size
    )
    assert table_names(maps, fe()) == [expected.backends[i] for i in expected.slots]
    assert result.slots_written == entry.table_size


def test_same_desired_state_writes_nothing(maps: FakeMapSet) -> None:
    rec = Reconciler(maps)
    rec.apply(desired(WEB, fe(), backends(11, 12, 13)))
    writes = (maps.services.writes, maps.backends.writes, maps.slots.slots_written)
    result = rec.apply(desired(WEB, fe(), backends(11, 12, 13)))
    assert result.changed == 0 and result.writes == {}
    assert (maps.services.writes, maps.backends.writes, maps.slots.slots_written) == writes


def test_removing_a_backend_writes_only_changed_slots_and_deletes_it_last(maps: FakeMapSet) -> None:
    rec = Reconciler(maps)
    rec.apply(desired(WEB, fe(), backends(11, 12, 13)))
    before = np.array(table_names(maps, fe()))
    result = rec.apply(desired(WEB, fe(), backends(11, 12)))
    after = np.array(table_names(maps, fe()))
    assert result.updated == 1
    assert result.slots_written == int((before != after).sum())
    assert "10.244.1.13:8080" not in set(after)
    assert sorted(str(b.backend) for b in maps.backends.data.values()) == [
        "10.244.1.11:8080",
        "10.244.1.12:8080",
    ]
    # Slots that belonged to survivors mostly stay put (Maglev's minimal disruption).
    moved_between_survivors = int(((before != after) & (before != "10.244.1.13:8080")).sum())
    assert moved_between_survivors < len(before) // 10


def test_service_without_endpoints_refuses(maps: FakeMapSet) -> None:
    rec = Reconciler(maps)
    rec.apply(desired(WEB, fe(), ()))
    entry = maps.services.data[fe()]
    assert (entry.table_size, entry.backend_count) == (0, 0)
    rec.apply(desired(WEB, fe(), backends(11)))
    assert maps.services.data[fe()].table_size > 0
    rec.apply(desired(WEB, fe(), ()))
    assert maps.services.data[fe()].table_size == 0 and not maps.backends.data


def test_removed_service_frees_its_range_one_sync_later(maps: FakeMapSet) -> None:
    """A BPF program that read the old entry may still index the old range during the
    sync that removes it, so the range is reused only from the next sync on."""
    rec = Reconciler(maps)
    rec.apply(desired(WEB, fe(), backends(11)))
    first = maps.services.data[fe()].table_off
    rec.apply({WEB: {}, **desired(API, fe("10.96.0.20"), backends(21))})
    assert fe() not in maps.services.data
    assert set(maps.service_meta.data.values()) == {"default/api:http"}
    assert {str(b.backend) for b in maps.backends.data.values()} == {"10.244.1.21:8080"}
    assert maps.services.data[fe("10.96.0.20")].table_off != first
    rec.apply(desired(NamespacedName("default", "x"), fe("10.96.0.30"), backends(31)))
    assert maps.services.data[fe("10.96.0.30")].table_off == first


def test_full_slot_pool_fails_one_service_and_keeps_the_others() -> None:
    maps = FakeMapSet(slot_pool_size=300)
    rec = Reconciler(maps, metrics=Metrics(CollectorRegistry()))
    ok = rec.apply(desired(WEB, fe(), backends(11)))  # 101 slots
    assert ok.errors == []
    big = rec.apply(desired(API, fe("10.96.0.20"), backends(*range(20, 23))))  # needs 509
    assert big.failed == {API}
    (message,) = big.errors
    assert (
        "default/api:http 10.96.0.20:80/TCP" in message
        and "ebpflb_slots is full (limit 300)" in message
    )
    assert fe("10.96.0.20") not in maps.services.data
    assert {str(b.backend) for b in maps.backends.data.values()} == {"10.244.1.11:8080"}
    assert rec.metrics is not None
    assert (
        rec.metrics.registry.get_sample_value(
            "ebpflb_map_errors_total", {"map": "ebpflb_slots", "reason": "full"}
        )
        == 1
    )


def test_full_service_map_names_the_limit() -> None:
    maps = FakeMapSet(max_services=1)
    rec = Reconciler(maps)
    rec.apply(desired(WEB, fe(), backends(11)))
    result = rec.apply(desired(API, fe("10.96.0.20"), backends(12)))
    assert "ebpflb_svc4 is full (limit 1)" in result.errors[0]
    assert list(maps.services.data) == [fe()]
    assert {str(b.backend) for b in maps.backends.data.values()} == {"10.244.1.11:8080"}


def test_restart_restores_and_rewrites_nothing(maps: FakeMapSet) -> None:
    state = {
        **desired(WEB, fe(), backends(11, 12, 13)),
        **desired(API, fe("10.96.0.20"), backends(12, 14)),
    }
    Reconciler(maps).apply(state)
    writes = (
        maps.services.writes,
        maps.backends.writes,
        maps.service_meta.writes,
        maps.slots.slots_written,
    )
    restarted = Reconciler(maps)
    restarted.restore()
    result = restarted.apply(state, full=True)
    assert result.writes == {} and result.errors == []
    assert (
        maps.services.writes,
        maps.backends.writes,
        maps.service_meta.writes,
        maps.slots.slots_written,
    ) == writes


def test_full_resync_repairs_drift(maps: FakeMapSet) -> None:
    state = {
        **desired(WEB, fe(), backends(11, 12, 13)),
        **desired(API, fe("10.96.0.20"), backends(14)),
    }
    rec = Reconciler(maps)
    rec.apply(state)
    good = table_names(maps, fe())
    entry = maps.services.data[fe()]
    # Behind the agent's back: a service entry deleted, two slots scribbled, a stray entry.
    del maps.services.data[fe("10.96.0.20")]
    maps.slots.array[entry.table_off + 3] = maps.slots.array[entry.table_off + 4] + 0
    maps.slots.array[entry.table_off + 5] = 0
    maps.services.data[fe("10.96.0.99")] = entry
    rec.restore()
    result = rec.apply(state, full=True)
    assert table_names(maps, fe()) == good
    assert fe("10.96.0.20") in maps.services.data and fe("10.96.0.99") not in maps.services.data
    assert result.writes["ebpflb_slots"] >= 1 and result.writes["ebpflb_svc4"] >= 2


def test_frontend_claimed_twice_stays_with_its_holder(maps: FakeMapSet) -> None:
    rec = Reconciler(maps)
    rec.apply(desired(WEB, fe(), backends(11)))
    result = rec.apply(desired(API, fe(), backends(12)))
    assert "already used by default/web" in result.errors[0]
    assert table_names(maps, fe())[0] == "10.244.1.11:8080"


def test_shared_backend_survives_removal_of_one_service(maps: FakeMapSet) -> None:
    rec = Reconciler(maps)
    rec.apply({**desired(WEB, fe(), backends(11)), **desired(API, fe("10.96.0.20"), backends(11))})
    assert len(maps.backends.data) == 1
    rec.apply({WEB: {}})
    assert len(maps.backends.data) == 1
    assert set(table_names(maps, fe("10.96.0.20"))) == {"10.244.1.11:8080"}


def test_growing_past_a_size_rung_moves_the_table(maps: FakeMapSet) -> None:
    registry = CollectorRegistry()
    rec = Reconciler(maps, metrics=Metrics(registry))
    rec.apply(desired(WEB, fe(), backends(11)))
    small = maps.services.data[fe()]
    rec.apply(desired(WEB, fe(), backends(*range(11, 17))))
    grown = maps.services.data[fe()]
    assert grown.table_size == maglev.table_size_for(6) > small.table_size
    assert grown.table_off != small.table_off and grown.svc_id == small.svc_id
    assert registry.get_sample_value("ebpflb_maglev_table_resizes_total") == 1


def test_weights_shape_the_table(maps: FakeMapSet) -> None:
    rec = Reconciler(maps)
    weighted = tuple(
        WeightedBackend(b.backend, w) for b, w in zip(backends(11, 12, 13), (1, 3, 0), strict=True)
    )
    rec.apply(desired(WEB, fe(), weighted))
    names = table_names(maps, fe())
    assert "10.244.1.13:8080" not in names  # weight 0: drained
    assert abs(names.count("10.244.1.12:8080") / len(names) - 0.75) < 0.02


def test_source_ranges_follow_the_frontend(maps: FakeMapSet) -> None:
    rec = Reconciler(maps)
    lb = fe("203.0.113.9")
    ranges = (IPv4Network("198.51.100.0/24"), IPv4Network("192.0.2.1/32"))
    want = DesiredFrontend(
        lb,
        ServicePortName(WEB, "http", Proto.TCP),
        SvcFlags.LOADBALANCER | SvcFlags.SOURCE_RANGES,
        backends(11),
        ranges,
    )
    rec.apply({WEB: {lb: want}})
    svc_id = maps.services.data[lb].svc_id
    assert set(maps.source_ranges4.data) == {SourceRange(svc_id, n) for n in ranges}
    narrowed = DesiredFrontend(lb, want.service, want.flags, want.backends, ranges[:1])
    rec.apply({WEB: {lb: narrowed}})
    assert set(maps.source_ranges4.data) == {SourceRange(svc_id, ranges[0])}
    restarted = Reconciler(maps)
    restarted.restore()
    assert restarted.apply({WEB: {lb: narrowed}}, full=True).writes == {}
    restarted.apply({WEB: {}})
    assert not maps.source_ranges4.data


def test_too_many_source_ranges_fail_only_that_frontend() -> None:
    maps = FakeMapSet(src_range_max=2)
    rec = Reconciler(maps)
    many = tuple(IPv4Network(f"198.51.100.{i}/32") for i in range(3))
    lb = fe("203.0.113.9")
    want = DesiredFrontend(
        lb,
        ServicePortName(WEB, "http", Proto.TCP),
        SvcFlags.LOADBALANCER | SvcFlags.SOURCE_RANGES,
        backends(11),
        many,
    )
    result = rec.apply({WEB: {lb: want}, **desired(API, fe("10.96.0.20"), backends(12))})
    assert "ebpflb_srcrng4 is full (limit 2)" in result.errors[0]
    assert list(maps.services.data) == [fe("10.96.0.20")]
    assert not maps.source_ranges4.data and maps.slots.array[:101].any()
    assert {str(b.backend) for b in maps.backends.data.values()} == {"10.244.1.12:8080"}


# ---- batches: one write per map per apply, failures attributed to their frontends --------


def many(count: int, first_ip: int = 10) -> dict[NamespacedName, dict[Frontend, DesiredFrontend]]:
    """`count` services of one frontend (10.96.1.<first_ip + i>) and two backends each."""
    state: dict[NamespacedName, dict[Frontend, DesiredFrontend]] = {}
    for i in range(count):
        pair = tuple(
            WeightedBackend(Backend(IPv4Address("10.245.0.0") + 2 * i + k, 8080, Proto.TCP))
            for k in (1, 2)
        )
        state.update(
            desired(NamespacedName("default", f"svc{i}"), fe(f"10.96.1.{first_ip + i}"), pair)
        )
    return state


def test_an_apply_writes_each_map_in_one_batch() -> None:
    maps = FakeMapSet(max_services=64, max_backends=128, slot_pool_size=1 << 16)
    result = Reconciler(maps).apply(many(20))
    assert result.added == 20 and result.errors == []
    assert (maps.backends.batches, maps.service_meta.batches, maps.services.batches) == (1, 1, 1)
    assert maps.slots.batches == 1
    assert len(maps.services.data) == 20 and len(maps.backends.data) == 40


def test_a_backend_the_kernel_refuses_fails_only_the_frontends_using_it() -> None:
    maps = FakeMapSet(max_services=64, max_backends=128, slot_pool_size=1 << 16)
    rec = Reconciler(maps, metrics=Metrics(CollectorRegistry()))
    state = many(5)
    # The backend written third in the batch (ids are handed out in frontend order).
    maps.backends.failing = {3}
    result = rec.apply(state)
    svc1 = NamespacedName("default", "svc1")
    assert result.failed == {svc1} and result.added == 4
    (message,) = result.errors
    assert "default/svc1:http 10.96.1.11:80/TCP not programmed" in message
    assert fe("10.96.1.11") not in maps.services.data
    assert len(maps.services.data) == 4
    # Its other backend was written, names no table, and is gone again.
    assert sorted(maps.backends.data) == [1, 2, 5, 6, 7, 8, 9, 10]
    assert rec.metrics is not None
    assert (
        rec.metrics.registry.get_sample_value(
            "ebpflb_map_errors_total", {"map": "ebpflb_be4", "reason": "error"}
        )
        == 1
    )
    # Once the kernel takes it, the retry programs the frontend.
    maps.backends.failing = set()
    retry = rec.apply({svc1: state[svc1]})
    assert retry.added == 1 and fe("10.96.1.11") in maps.services.data


def test_a_failed_table_write_fails_its_frontend_and_frees_its_range() -> None:
    maps = FakeMapSet(max_services=64, max_backends=128, slot_pool_size=1 << 16)
    rec = Reconciler(maps)
    maps.slots.failing = {252}  # the second table's range: 251 slots + 1 padding each
    result = rec.apply(many(3))
    assert result.failed == {NamespacedName("default", "svc1")}
    assert fe("10.96.1.11") not in maps.services.data
    assert [e.table_off for e in maps.services.data.values()] == [0, 504]
    maps.slots.failing = set()
    rec.apply(many(3))
    assert maps.services.data[fe("10.96.1.11")].table_off == 252  # reused at once


def test_a_failed_entry_write_keeps_the_previous_entry_until_the_retry() -> None:
    maps = FakeMapSet()
    rec = Reconciler(maps)
    rec.apply(desired(WEB, fe(), backends(11, 12, 13)))
    before = maps.services.data[fe()]
    maps.services.failing = {fe()}
    result = rec.apply(desired(WEB, fe(), backends(11, 12)))
    assert result.failed == {WEB} and maps.services.data[fe()] == before
    # The slots changed in place before the entry failed: the pool holds the new table,
    # which names only the two remaining backends, and the third is still in the map.
    assert set(table_names(maps, fe())) == {"10.244.1.11:8080", "10.244.1.12:8080"}
    maps.services.failing = set()
    retry = rec.apply(desired(WEB, fe(), backends(11, 12)))
    assert retry.errors == [] and maps.services.data[fe()].backend_count == 2
    assert len(maps.backends.data) == 2


def test_source_ranges_of_a_frontend_that_failed_later_are_taken_back() -> None:
    maps = FakeMapSet()
    rec = Reconciler(maps)
    lb = fe("203.0.113.9")
    want = DesiredFrontend(
        lb,
        ServicePortName(WEB, "http", Proto.TCP),
        SvcFlags.LOADBALANCER | SvcFlags.SOURCE_RANGES,
        backends(11),
        (IPv4Network("198.51.100.0/24"),),
    )
    maps.services.failing = {lb}
    result = rec.apply({WEB: {lb: want}})
    assert result.failed == {WEB}
    assert not maps.source_ranges4.data and not maps.services.data and not maps.backends.data


def test_restore_keeps_everything_when_the_maps_hold_what_was_written(maps: FakeMapSet) -> None:
    rec = Reconciler(maps)
    state = {**desired(WEB, fe(), backends(11, 12)), **desired(API, fe("10.96.0.20"), ())}
    rec.apply(state)
    known = dict(rec.realized)
    rec.restore()
    assert all(rec.realized[f] is r for f, r in known.items())
    result = rec.apply(state, full=True)
    assert result.writes == {} and result.unchanged == 2
    # One slot changed behind its back: relearned from the maps, and repaired.
    entry = maps.services.data[fe()]
    maps.slots.array[entry.table_off] = 0
    rec.restore()
    assert rec.realized[fe()] is not known[fe()]
    assert rec.apply(state, full=True).writes == {"ebpflb_slots": 1}


def test_a_big_apply_logs_one_summary_line(caplog: pytest.LogCaptureFixture) -> None:
    maps = FakeMapSet(max_services=256, max_backends=512, slot_pool_size=1 << 16)
    with caplog.at_level(logging.INFO, logger="ebpflb.reconcile"):
        Reconciler(maps).apply(many(LOG_EACH_MAX + 1, first_ip=0))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"applied {LOG_EACH_MAX + 1} frontends: {LOG_EACH_MAX + 1} added, 0 updated,"
        f" 0 removed, 0 unchanged, 0 failed, {(LOG_EACH_MAX + 1) * 251} slots written"
    ]
