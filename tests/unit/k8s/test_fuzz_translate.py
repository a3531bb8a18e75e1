"""Fuzzing translation: arbitrary API-shaped input (wrong types, missing and extra fields,
huge lists, deep nesting) never raises anything but InvalidObjectError, and translation
accepts exactly what the independent reference (tests/unit/k8s/reference_schema.py) accepts,
with the meaning the reference gives it.
"""

from __future__ import annotations

from typing import Any

from hypothesis import event as record
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from prometheus_client import CollectorRegistry

from ebpflb.clock import FakeClock
from ebpflb.config import Config
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.errors import InvalidObjectError
from ebpflb.k8s.sources.base import Kind
from ebpflb.k8s.translate import translate_service, translate_slice
from ebpflb.observe.metrics import Metrics
from ebpflb.sync.agent import Agent
from tests.factories import endpoint_slice, service
from tests.unit.k8s import fuzzing, reference_schema
from tests.unit.k8s.fuzzing import fuzz, json_values, services, slices


def event(text: str) -> None:
    if currently_in_test_context():  # the checks also run outside hypothesis
        record(text)


def check_service(obj: Any) -> None:
    expected = reference_schema.service_verdict(obj)
    try:
        t = translate_service(obj)
    except InvalidObjectError as exc:
        assert not expected.valid, f"refused what the reference accepts: {exc}"
        event(f"invalid ({exc.fault.value})")
        return
    assert expected.valid, f"accepted what the reference refuses: {t}"
    assert (t.skipped is not None) == expected.skipped, t.skipped
    assert {(str(n.port_name), n.protocol.name) for n in t.ports} == expected.ports
    event("skipped" if t.skipped else "programmed")


def check_slice(obj: Any) -> None:
    expected = reference_schema.slice_verdict(obj)
    try:
        t = translate_slice(obj)
    except InvalidObjectError as exc:
        assert not expected.valid, f"refused what the reference accepts: {exc}"
        event(f"invalid ({exc.fault.value})")
        return
    assert expected.valid, f"accepted what the reference refuses: {t}"
    assert (t.skipped is not None) == expected.skipped
    got = tuple((str(e.address), e.ready, e.serving, e.terminating) for e in t.endpoints)
    assert got == expected.endpoints
    event("skipped" if t.skipped else "programmed")


@fuzz(200, 40_000)
@given(services)
def test_services_accepted_exactly_as_the_reference_accepts(obj: dict[str, Any]) -> None:
    check_service(obj)


@fuzz(200, 40_000)
@given(slices)
def test_slices_accepted_exactly_as_the_reference_accepts(obj: dict[str, Any]) -> None:
    check_slice(obj)


@fuzz(100, 20_000)
@given(json_values | fuzzing.deep)
def test_anything_at_all_is_refused_cleanly(value: Any) -> None:
    check_service(value)
    check_slice(value)


@fuzz(30, 5_000)
@given(st.lists(st.tuples(st.booleans(), services | slices), max_size=6))
def test_the_agent_survives_any_objects_and_counts_each_refusal(
    objects: list[tuple[bool, dict[str, Any]]],
) -> None:
    """Any mix, through object_updated and a sync on fake maps: nothing escapes, and each
    refusal is counted once."""
    agent = Agent(Config(), FakeMapSet(), Metrics(CollectorRegistry()), clock=FakeClock())
    refused = 0
    for as_service, obj in objects:
        kind = Kind.SERVICE if as_service else Kind.ENDPOINT_SLICE
        if as_service:
            refused += not reference_schema.service_verdict(obj).valid
        else:
            refused += not reference_schema.slice_verdict(obj).valid
        agent.object_updated(kind, obj)
    agent.initial_list_done(Kind.SERVICE)
    agent.initial_list_done(Kind.ENDPOINT_SLICE)
    agent.runner.run_once()
    registry = agent.metrics.registry
    counted = sum(
        s.value
        for metric in registry.collect()
        if metric.name == "ebpflb_invalid_objects"
        for s in metric.samples
        if s.name == "ebpflb_invalid_objects_total"
    )
    assert counted == refused


def test_nesting_deeper_than_any_recursion_limit_is_refused_or_ignored() -> None:
    """100,000 levels (too deep for hypothesis to print) in a field translation reads, and
    in one it does not: refused, and ignored. Nothing recurses into it."""
    deep = fuzzing.nested(100_000)
    for path in ("spec", "spec.ports", "metadata.labels", "spec.clusterIPs"):
        obj = service()
        parent = obj
        *parents, last = path.split(".")
        for key in parents:
            parent = parent[key]
        parent[last] = deep
        check_service(obj)
    check_service(service(selector=deep))
    check_slice({**endpoint_slice(), "endpoints": deep})
    check_slice({**endpoint_slice(), "extra": deep})
