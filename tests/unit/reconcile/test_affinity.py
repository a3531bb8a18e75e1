"""sessionAffinity=ClientIP: translation, desired frontends and ebpflb_affpair4."""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Any

import pytest

from ebpflb.datapath.maps import AffinityMatch
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.desired import DesiredFrontend, NodeView, WeightedBackend, frontends_for_port
from ebpflb.errors import InvalidObjectError
from ebpflb.k8s.translate import translate_service
from ebpflb.model import (
    Backend,
    Endpoint,
    Frontend,
    NamespacedName,
    Proto,
    ServicePortName,
    SvcFlags,
)
from ebpflb.reconcile import Reconciler
from tests.factories import service

WEB = NamespacedName("default", "web")
NAME = ServicePortName(WEB, "http", Proto.TCP)


def affinity_of(**spec: Any) -> int:
    (port,) = translate_service(service(**spec)).ports.values()
    return port.affinity_timeout


def test_translation_defaults_like_the_api() -> None:
    assert affinity_of() == 0
    assert affinity_of(sessionAffinity="None") == 0
    assert affinity_of(sessionAffinity="ClientIP") == 10800
    config = {"clientIP": {"timeoutSeconds": 60}}
    assert affinity_of(sessionAffinity="ClientIP", sessionAffinityConfig=config) == 60
    assert affinity_of(sessionAffinity="None", sessionAffinityConfig=config) == 0


@pytest.mark.parametrize(
    "spec",
    [
        {"sessionAffinity": "Sticky"},
        {
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}},
        },
        {
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86401}},
        },
        {
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": "1"}},
        },
    ],
)
def test_invalid_affinity_names_the_field(spec: dict[str, Any]) -> None:
    with pytest.raises(InvalidObjectError, match="sessionAffinity"):
        translate_service(service(**spec))


def test_every_frontend_of_the_port_gets_the_timeout() -> None:
    (port,) = translate_service(
        service(
            type="NodePort",
            sessionAffinity="ClientIP",
            externalTrafficPolicy="Local",
            ports=[{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}],
        )
    ).ports.values()
    eps = [Endpoint(IPv4Address("10.244.1.1"), 8080, node_name="n1")]
    fes = frontends_for_port(port, eps, NodeView("n1", (IPv4Address("192.168.1.10"),)))
    assert len(fes) == 5  # ClusterIP, node address and loopback, each of these twice
    assert all(fe.affinity_timeout == 10800 and SvcFlags.AFFINITY in fe.flags for fe in fes)


def frontend_with(
    timeout: int, *lasts: int
) -> dict[NamespacedName, dict[Frontend, DesiredFrontend]]:
    frontend = Frontend(IPv4Address("10.96.0.10"), 80, Proto.TCP)
    bes = tuple(
        WeightedBackend(Backend(IPv4Address(f"10.244.1.{n}"), 8080, Proto.TCP)) for n in lasts
    )
    flags = SvcFlags.CLUSTER_IP | (SvcFlags.AFFINITY if timeout else SvcFlags.NONE)
    return {WEB: {frontend: DesiredFrontend(frontend, NAME, flags, bes, (), timeout)}}


def matches(maps: FakeMapSet) -> dict[str, int]:
    """backend address -> timeout, for the one frontend's service id."""
    return {
        str(maps.backends.data[key.backend_id].backend.address): timeout
        for key, timeout in maps.affinity_match.data.items()
    }


def test_match_entries_follow_backends_timeout_and_switching() -> None:
    maps = FakeMapSet()
    rec = Reconciler(maps)
    rec.apply(frontend_with(60, 1, 2), full=True)
    assert matches(maps) == {"10.244.1.1": 60, "10.244.1.2": 60}
    rec.apply(frontend_with(60, 1, 3))  # backend 2 leaves: its pair goes at once
    assert matches(maps) == {"10.244.1.1": 60, "10.244.1.3": 60}
    rec.apply(frontend_with(5, 1, 3))  # a new timeout applies at once
    assert matches(maps) == {"10.244.1.1": 5, "10.244.1.3": 5}
    rec.apply(frontend_with(0, 1, 3))  # affinity off: nothing left to follow
    assert matches(maps) == {}
    rec.apply(frontend_with(30, 1))
    assert matches(maps) == {"10.244.1.1": 30}
    rec.apply({WEB: {}})  # the service goes
    assert maps.affinity_match.data == {}


def test_full_apply_repairs_drift_and_a_restart_rewrites_nothing() -> None:
    maps = FakeMapSet()
    Reconciler(maps).apply(frontend_with(60, 1, 2), full=True)
    (svc_id,) = {key.svc_id for key in maps.affinity_match.data}
    maps.affinity_match.data[AffinityMatch(svc_id + 7, 99)] = 1  # nobody's
    first = next(iter(maps.affinity_match.data))
    maps.affinity_match.data[first] = 1  # a wrong timeout
    restarted = Reconciler(maps)
    restarted.restore()
    result = restarted.apply(frontend_with(60, 1, 2), full=True)
    assert matches(maps) == {"10.244.1.1": 60, "10.244.1.2": 60}
    assert result.writes[maps.affinity_match.name] == 2  # one repaired, one deleted
    again = Reconciler(maps)
    again.restore()
    assert maps.affinity_match.name not in again.apply(frontend_with(60, 1, 2), full=True).writes


def test_a_full_match_map_is_reported_and_other_frontends_still_apply() -> None:
    maps = FakeMapSet(affinity_max=1)
    result = Reconciler(maps).apply(frontend_with(60, 1, 2), full=True)
    assert len(maps.affinity_match.data) == 1
    assert result.added == 1  # the frontend itself is programmed (its affinity half-kept)
    (error,) = result.errors
    assert "default/web:http 10.96.0.10:80/TCP" in error and "ebpflb_affpair4" in error
    assert "--affinity-max" in error
