"""kube-proxy's health semantics on a fake clock (ebpflb/observe/health.py), after
pkg/proxy/healthcheck/healthcheck_test.go's testProxyHealthUpdater."""

from __future__ import annotations

import json
import re

import pytest

from ebpflb.clock import FakeClock
from ebpflb.observe.health import (
    ProxyHealth,
    go_time,
    healthz_response,
    livez_response,
    readyz_response,
)

TIMEOUT = 10.0
# Go's time.Time JSON in UTC: RFC 3339 with up to 9 fraction digits, no trailing zeros.
GO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{0,8}[1-9])?Z$")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def health(clock: FakeClock) -> ProxyHealth:
    return ProxyHealth(TIMEOUT, clock)


def healthz(health: ProxyHealth) -> tuple[int, dict[str, object]]:
    status, body = healthz_response(health.snapshot())
    return status, json.loads(body)


def livez(health: ProxyHealth) -> int:
    return livez_response(health.snapshot())[0]


def sync(health: ProxyHealth, *, ok: bool = True) -> None:
    health.sync_started()
    health.sync_finished(ok=ok)


def test_go_time_format() -> None:
    assert go_time(None) == "0001-01-01T00:00:00Z"
    assert go_time(0.0) == "1970-01-01T00:00:00Z"
    assert go_time(1735689600.5) == "2025-01-01T00:00:00.5Z"
    assert go_time(1735689600.123456) == "2025-01-01T00:00:00.123456Z"


def test_503_before_the_first_sync_then_200(health: ProxyHealth, clock: FakeClock) -> None:
    status, body = healthz(health)
    assert status == 503
    # kube-proxy's fields, in its order; no proxier has updated yet: no "status".
    assert list(body) == ["lastUpdated", "currentTime", "nodeEligible", "healthy"]
    assert body["lastUpdated"] == "0001-01-01T00:00:00Z"
    assert body["currentTime"] == go_time(clock.wall())
    assert (body["nodeEligible"], body["healthy"]) == (True, False)
    assert readyz_response(health.snapshot())[0] == 503
    assert livez(health) == 200  # starting up is not dead (kube-proxy's /livez)

    sync(health)
    clock.advance(3)
    status, body = healthz(health)
    assert status == 200
    assert list(body) == ["lastUpdated", "currentTime", "nodeEligible", "healthy", "status"]
    # Healthy: lastUpdated is "now", as kube-proxy reports; the per-family entry keeps
    # the real time of the last sync.
    assert body["lastUpdated"] == body["currentTime"] == go_time(clock.wall())
    assert body["status"] == {"IPv4": {"lastUpdated": go_time(clock.wall() - 3), "healthy": True}}
    assert all(GO_TIME.match(str(t)) for t in (body["lastUpdated"], body["currentTime"]))
    assert readyz_response(health.snapshot()) == (200, b"ok\n")


def test_a_queued_change_turns_503_at_the_timeout_and_200_after_the_sync(
    health: ProxyHealth, clock: FakeClock
) -> None:
    sync(health)
    synced_at = clock.wall()
    clock.advance(25)  # no change pending: healthy however long nothing happens
    assert healthz(health)[0] == 200

    health.queued_update()
    clock.advance(TIMEOUT - 0.001)
    assert healthz(health)[0] == 200  # pending, not late yet
    health.queued_update()  # a later change does not move the oldest one
    clock.advance(0.001)
    status, body = healthz(health)
    assert status == 503 and livez(health) == 503
    assert body["lastUpdated"] == go_time(synced_at)  # unhealthy: the real last sync
    assert body["healthy"] is False
    assert body["status"] == {"IPv4": {"lastUpdated": go_time(synced_at), "healthy": False}}
    assert health.snapshot().oldest_pending_age == pytest.approx(TIMEOUT)

    clock.advance(5)
    sync(health)
    assert healthz(health)[0] == 200 and livez(health) == 200
    assert health.snapshot().oldest_pending_age is None


def test_a_failed_sync_leaves_the_change_pending(health: ProxyHealth, clock: FakeClock) -> None:
    sync(health)
    health.queued_update()
    clock.advance(TIMEOUT / 2)
    sync(health, ok=False)  # e.g. a map full: the change was not written, it is retried
    clock.advance(TIMEOUT / 2)
    assert healthz(health)[0] == 503
    sync(health)
    assert healthz(health)[0] == 200


def test_a_first_sync_that_failed_is_ready_but_not_healthy(health: ProxyHealth) -> None:
    sync(health, ok=False)
    snapshot = health.snapshot()
    assert readyz_response(snapshot)[0] == 200  # it ran: the errors are in /status
    assert healthz_response(snapshot)[0] == 503


def test_a_change_queued_during_a_sync_stays_pending_from_the_syncs_start(
    health: ProxyHealth, clock: FakeClock
) -> None:
    sync(health)
    health.sync_started()
    clock.advance(1)
    health.queued_update()  # perhaps after the sync took the changes
    clock.advance(1)
    health.sync_finished(ok=True)
    assert health.snapshot().oldest_pending_age == pytest.approx(2.0)
    clock.advance(TIMEOUT - 2)
    assert healthz(health)[0] == 503  # kube-proxy would have forgotten it
    sync(health)  # the next sync takes it
    assert healthz(health)[0] == 200


def test_livez_body_has_no_node_eligibility(health: ProxyHealth) -> None:
    sync(health)
    status, body = livez_response(health.snapshot())
    assert status == 200
    assert list(json.loads(body)) == ["lastUpdated", "currentTime", "healthy", "status"]
    assert b" " not in body  # compact, as Go's json.Marshal writes it


def test_an_agent_standing_by_stays_live_and_unready(health: ProxyHealth, clock: FakeClock) -> None:
    """Refused pins (pinlayout): changes keep arriving but none is this agent's to program,
    so /livez stays 200 (the kubelet does not restart it in a loop) and /readyz 503."""
    health.queued_update()
    health.stand_by()
    health.queued_update()
    clock.advance(TIMEOUT * 3)
    assert livez(health) == 200
    assert readyz_response(health.snapshot())[0] == 503
