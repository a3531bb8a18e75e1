from __future__ import annotations

from ebpflb.k8s.trackers import EndpointSliceTracker, ServiceTracker, service_state
from ebpflb.k8s.translate import translate_service, translate_slice
from ebpflb.model import NamespacedName, Proto, ServicePortName
from tests.factories import endpoint, endpoint_slice, service

WEB = NamespacedName("default", "web")


def test_service_change_is_pending_until_taken() -> None:
    tracker = ServiceTracker()
    assert tracker.update(translate_service(service()))
    assert tracker.take_changes() == {WEB}
    assert tracker.take_changes() == set()


def test_change_that_cancels_out_is_dropped() -> None:
    tracker = ServiceTracker()
    tracker.update(translate_service(service()))
    tracker.take_changes()
    assert tracker.update(translate_service(service(cluster_ip="10.96.0.11")))
    assert not tracker.update(translate_service(service()))  # back to the synced state
    assert tracker.take_changes() == set()


def test_add_then_delete_before_sync_is_no_change() -> None:
    tracker = ServiceTracker()
    tracker.update(translate_service(service()))
    assert not tracker.delete(WEB)
    assert tracker.take_changes() == set()


def test_slices_of_one_service_are_merged() -> None:
    slices = EndpointSliceTracker()
    slices.update(translate_slice(endpoint_slice("web-1", endpoints=[endpoint("10.244.1.11")])))
    slices.update(translate_slice(endpoint_slice("web-2", endpoints=[endpoint("10.244.2.21")])))
    assert slices.take_changes() == {WEB}
    services = ServiceTracker()
    services.update(translate_service(service()))
    state = service_state(services, slices, WEB)
    assert state is not None
    eps = state.endpoints[ServicePortName(WEB, "http", Proto.TCP)]
    assert [str(e.address) for e in eps] == ["10.244.1.11", "10.244.2.21"]


def test_slice_flap_cancels_out() -> None:
    slices = EndpointSliceTracker()
    one = translate_slice(endpoint_slice(endpoints=[endpoint("10.244.1.11")]))
    slices.update(one)
    slices.take_changes()
    assert slices.update(
        translate_slice(endpoint_slice(endpoints=[endpoint("10.244.1.11", ready=False)]))
    )
    assert not slices.update(one)
    assert slices.take_changes() == set()


def test_slice_moving_to_another_service_changes_both() -> None:
    slices = EndpointSliceTracker()
    slices.update(translate_slice(endpoint_slice("s", service_name="a")))
    slices.take_changes()
    slices.update(translate_slice(endpoint_slice("s", service_name="b")))
    assert slices.take_changes() == {NamespacedName("default", "a"), NamespacedName("default", "b")}
    assert slices.slices_for(NamespacedName("default", "a")) == ()


def test_skipped_service_has_no_state() -> None:
    services = ServiceTracker()
    services.update(translate_service(service(cluster_ip="None")))
    assert service_state(services, EndpointSliceTracker(), WEB) is None
    assert services.skipped() == {WEB: "headless service (clusterIP: None)"}
