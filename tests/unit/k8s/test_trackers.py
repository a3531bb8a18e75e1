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
    services.take_changes()
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
    services.take_changes()
    assert service_state(services, EndpointSliceTracker(), WEB) is None
    assert services.skipped() == {WEB: "headless service (clusterIP: None)"}


def test_the_sync_reads_the_state_it_took() -> None:
    """An update recorded while a sync runs (after its take_changes) is not what that sync
    reads: it stays pending for the next one."""
    services = ServiceTracker()
    services.update(translate_service(service()))
    assert services.take_changes() == {WEB}
    moved = translate_service(service(cluster_ip="10.96.0.11"))
    assert services.update(moved)
    assert services.get(WEB) == translate_service(service())
    assert services.latest(WEB) == moved
    assert services.take_changes() == {WEB}
    assert services.get(WEB) == moved


def test_a_service_created_during_a_sync_then_emptied_is_a_change() -> None:
    """The e2e race: its slice synced first, the Service created while that sync ran, then
    made ExternalName (no ports). The sync programmed no ports for it, so becoming
    ExternalName cancels the creation out: nothing was ever programmed, nothing pending."""
    services, slices = ServiceTracker(), EndpointSliceTracker()
    slices.update(translate_slice(endpoint_slice(endpoints=[endpoint("10.244.1.11")])))
    assert slices.take_changes() | services.take_changes() == {WEB}
    services.update(translate_service(service()))  # while the sync runs
    assert service_state(services, slices, WEB) is None  # that sync programs nothing
    assert not services.update(translate_service(service(type="ExternalName")))
    assert services.take_changes() == set()
    assert service_state(services, slices, WEB) is None


def test_a_change_back_after_a_sync_programmed_it_is_pending() -> None:
    """The other order: the creation was taken and programmed, then the Service became
    ExternalName: that change is pending until a sync takes it."""
    services, slices = ServiceTracker(), EndpointSliceTracker()
    slices.update(translate_slice(endpoint_slice(endpoints=[endpoint("10.244.1.11")])))
    services.update(translate_service(service()))
    assert slices.take_changes() | services.take_changes() == {WEB}
    assert service_state(services, slices, WEB) is not None
    assert services.update(translate_service(service(type="ExternalName")))
    assert services.take_changes() == {WEB}
    assert service_state(services, slices, WEB) is None


def test_a_slice_change_during_a_sync_stays_pending() -> None:
    slices = EndpointSliceTracker()
    one = translate_slice(endpoint_slice(endpoints=[endpoint("10.244.1.11")]))
    slices.update(one)
    slices.take_changes()
    two = translate_slice(endpoint_slice(endpoints=[endpoint("10.244.1.12")]))
    assert slices.update(two)
    assert slices.slices_for(WEB) == (one,)
    assert slices.take_changes() == {WEB}
    assert slices.slices_for(WEB) == (two,)
