"""Dual-stack Services without a kernel: each family's frontends from its own addresses
and its own EndpointSlices (kube-proxy's per-family proxiers), a Maglev table per
frontend whatever its family, IPv6 entries laid out for ebpflb_svc6/ebpflb_be6, the two
families' maps written through one FamilyMap, and `maps dump` and the per-frontend
metrics naming IPv6 frontends unambiguously."""

from __future__ import annotations

import ctypes as ct
import dataclasses
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ebpflb.clock import FakeClock
from ebpflb.config import Config
from ebpflb.datapath import contract
from ebpflb.datapath.contract import MapName
from ebpflb.datapath.maps import AddrPort, BackendEntry, dump, layout
from ebpflb.datapath.maps.fake import FakeMap, FakeMapSet
from ebpflb.datapath.maps.family import FamilyMap, backend_family, frontend_family
from ebpflb.desired import ExternalIPPolicy, NodeView, frontends_for_port, frontends_for_service
from ebpflb.errors import MapFullError
from ebpflb.explain import Verdict, explain
from ebpflb.explain.engine import Settings
from ebpflb.explain.model import parse_query
from ebpflb.k8s.sources.base import Kind
from ebpflb.k8s.trackers import EndpointSliceTracker, ServiceState, ServiceTracker, service_state
from ebpflb.k8s.translate import translate_service, translate_slice
from ebpflb.model import (
    Backend,
    BackendFlags,
    Frontend,
    NamespacedName,
    Proto,
    Scope,
    SvcFlags,
)
from ebpflb.observe.fill import agent_fill
from ebpflb.observe.metrics import Metrics
from ebpflb.observe.svccounters import ServiceCounterCollector
from ebpflb.reconcile import Reconciler
from ebpflb.sync.agent import Agent
from tests.factories import endpoint, endpoint_slice, service

WEB = NamespacedName("default", "web")
V4, V6 = IPv4Address("10.96.0.10"), IPv6Address("fd00::10")


def dual_service(**spec: object) -> dict[str, Any]:
    return service(
        cluster_ip="10.96.0.10",
        clusterIPs=["10.96.0.10", "fd00::10"],
        ipFamilies=["IPv4", "IPv6"],
        ipFamilyPolicy="RequireDualStack",
        **spec,
    )


def slices() -> list[dict[str, Any]]:
    return [
        endpoint_slice("web-4", endpoints=[endpoint("10.244.1.11"), endpoint("10.244.1.12")]),
        endpoint_slice(
            "web-6",
            address_type="IPv6",
            endpoints=[endpoint("fd00:244::11"), endpoint("fd00:244::12", ready=False)],
        ),
    ]


def state_of(svc: dict[str, Any], slice_objs: list[dict[str, Any]]) -> ServiceState:
    services, tracked = ServiceTracker(), EndpointSliceTracker()
    services.update(translate_service(svc))
    for obj in slice_objs:
        tracked.update(translate_slice(obj))
    services.take_changes(), tracked.take_changes()  # what a sync reads
    state = service_state(services, tracked, WEB)
    assert state is not None
    return state


def test_each_family_spreads_over_its_own_slices() -> None:
    found = frontends_for_service(state_of(dual_service(), slices()))
    four, six = Frontend(V4, 80, Proto.TCP), Frontend(V6, 80, Proto.TCP)
    assert set(found) == {four, six}
    assert [str(b.backend) for b in found[four].backends] == [
        "10.244.1.11:8080",
        "10.244.1.12:8080",
    ]
    # The IPv6 slice's ready endpoint only; never an IPv4 one.
    assert [str(b.backend) for b in found[six].backends] == ["[fd00:244::11]:8080"]
    assert found[six].flags == SvcFlags.CLUSTER_IP


def test_a_family_without_endpoints_refuses_alone() -> None:
    found = frontends_for_service(state_of(dual_service(), slices()[:1]))
    assert found[Frontend(V6, 80, Proto.TCP)].backends == ()
    assert len(found[Frontend(V4, 80, Proto.TCP)].backends) == 2


def test_ipv6_only_service() -> None:
    svc = service(cluster_ip="fd00::10", ipFamilies=["IPv6"], ipFamilyPolicy="SingleStack")
    found = frontends_for_service(state_of(svc, slices()))
    assert list(found) == [Frontend(V6, 80, Proto.TCP)]


def test_nodeports_follow_the_node_addresses_and_ipv6_external_ips_are_frontends() -> None:
    svc = dual_service(type="NodePort", externalIPs=["2001:db8::7", "192.0.2.7"])
    svc["spec"]["ports"][0]["nodePort"] = 30080
    node = NodeView(
        name="n1",
        addresses=(IPv4Address("192.168.1.5"),),
        external_ips=ExternalIPPolicy((ip_network("2001:db8::/32"), ip_network("192.0.2.0/24"))),
    )
    found = frontends_for_service(state_of(svc, slices()), node)
    by_type = {
        (str(f), d.flags & (SvcFlags.NODE_PORT | SvcFlags.EXTERNAL_IP)) for f, d in found.items()
    }
    assert ("192.168.1.5:30080/TCP", SvcFlags.NODE_PORT) in by_type
    assert ("[2001:db8::7]:80/TCP", SvcFlags.EXTERNAL_IP) in by_type
    assert ("192.0.2.7:80/TCP", SvcFlags.EXTERNAL_IP) in by_type
    # No IPv6 node address: no IPv6 nodePort frontend (nor a ::1 one).
    assert not any(f.address.version == 6 and f.port == 30080 for f in found)
    six = found[Frontend(IPv6Address("2001:db8::7"), 80, Proto.TCP)]
    assert all(b.backend.address.version == 6 for b in six.backends)


def test_reconciler_writes_both_families_with_a_table_each() -> None:
    maps = FakeMapSet(max_services=8, max_backends=16, slot_pool_size=4096)
    rec = Reconciler(maps)
    want = frontends_for_service(state_of(dual_service(), slices()))
    result = rec.apply({WEB: want})
    assert result.added == 2 and not result.failed
    for frontend, desired in want.items():
        entry = maps.services.data[frontend]
        ids = {int(i) for i in maps.slots.read(entry.table_off, entry.table_size)}
        named = {maps.backends.data[i].backend for i in ids}
        assert named == {b.backend for b in desired.backends}
        assert {b.address.version for b in named} == {frontend.address.version}
    levels = {
        fill.map: fill.entries
        for fill in agent_fill(
            rec.map_entries(), {MapName.SERVICES: 8, MapName.SERVICES6: 8}, lambda _: 0
        )
    }
    assert levels == {"ebpflb_svc4": 1, "ebpflb_svc6": 1}  # each family's map its own
    four = maps.services.data[Frontend(V4, 80, Proto.TCP)]
    six = maps.services.data[Frontend(V6, 80, Proto.TCP)]
    assert four.svc_id != six.svc_id  # one id space: metadata and counters per frontend
    # Unchanged: nothing written again; the IPv6 frontend goes alone.
    assert rec.apply({WEB: want}).unchanged == 2
    del want[Frontend(V6, 80, Proto.TCP)]
    result = rec.apply({WEB: want})
    assert result.removed == 1 and Frontend(V6, 80, Proto.TCP) not in maps.services.data
    assert {b.backend.address.version for b in maps.backends.data.values()} == {4}


def test_a_restarted_reconciler_adopts_both_families_and_writes_nothing() -> None:
    maps = FakeMapSet(max_services=8, max_backends=16, slot_pool_size=4096)
    want = frontends_for_service(state_of(dual_service(), slices()))
    Reconciler(maps).apply({WEB: want})
    writes = (maps.services.writes, maps.backends.writes, maps.slots.slots_written)
    again = Reconciler(maps)
    again.restore()
    result = again.apply({WEB: want}, full=True)
    assert (result.added, result.updated, result.removed, result.unchanged) == (0, 0, 0, 2)
    assert (maps.services.writes, maps.backends.writes, maps.slots.slots_written) == writes


def test_the_agent_programs_a_dual_stack_service_from_objects() -> None:
    maps = FakeMapSet()
    agent = Agent(Config(), maps, Metrics(CollectorRegistry()), clock=FakeClock())
    agent.object_updated(Kind.SERVICE, dual_service())
    for obj in slices():
        agent.object_updated(Kind.ENDPOINT_SLICE, obj)
    agent.initial_list_done(Kind.SERVICE)
    agent.initial_list_done(Kind.ENDPOINT_SLICE)
    agent.runner.run_once()
    report = dump.collect(maps)
    rows = {s["frontend"]: [b["address"] for b in s["backends"]] for s in report["services"]}
    assert rows == {
        "10.96.0.10:80/TCP": ["10.244.1.11:8080", "10.244.1.12:8080"],
        "[fd00::10]:80/TCP": ["[fd00:244::11]:8080"],
    }
    assert "[fd00::10]:80/TCP" in dump.render_text(report)
    selected = dump.collect(maps, select=dump.Selection.parse(frontend="[fd00::10]:80/TCP"))
    assert [s["frontend"] for s in selected["services"]] == ["[fd00::10]:80/TCP"]
    # Per-frontend metrics label the IPv6 frontend as [address]:port.
    registry = CollectorRegistry()
    registry.register(
        ServiceCounterCollector(maps.service_counters, lambda: agent.reconciler.realized)
    )
    text = generate_latest(registry).decode()
    assert 'frontend="[fd00::10]:80"' in text and 'frontend="10.96.0.10:80"' in text


def test_ipv6_entries_are_laid_out_as_the_c_structs() -> None:
    frontend = Frontend(IPv6Address("fd00::10"), 8080, Proto.UDP, Scope.INTERNAL)
    raw = layout.encode_frontend6(frontend)
    assert bytes(raw)[:16] == IPv6Address("fd00::10").packed  # network order
    assert bytes(raw)[16:18] == (8080).to_bytes(2, "big")
    assert ct.sizeof(raw) == 20
    assert layout.decode_frontend6(raw) == frontend
    entry = BackendEntry(Backend(IPv6Address("fd00:244::11"), 80, Proto.TCP), BackendFlags.LOCAL)
    assert layout.decode_backend6(layout.encode_backend6(entry)) == entry
    with pytest.raises(TypeError):
        layout.encode_frontend(frontend)  # an IPv6 frontend never reaches ebpflb_svc4
    with pytest.raises(TypeError):
        layout.encode_backend6(BackendEntry(Backend(IPv4Address("10.0.0.1"), 80, Proto.TCP)))


def test_family_map_sends_each_item_to_its_familys_map() -> None:
    four: FakeMap[Frontend, int] = FakeMap(contract.MapName.SERVICES.value, 2)
    six: FakeMap[Frontend, int] = FakeMap(contract.MapName.SERVICES6.value, 1)
    both = FamilyMap(four, six, frontend_family)
    a, b = Frontend(ip_address("10.0.0.1"), 80, Proto.TCP), Frontend(V6, 80, Proto.TCP)
    c = Frontend(ip_address("fd00::11"), 80, Proto.TCP)
    failures = both.put_many([(a, 1), (b, 2), (c, 3)])
    assert list(failures) == [2] and isinstance(failures[2], MapFullError)  # six is full
    assert "ebpflb_svc6" in str(failures[2])
    assert four.data == {a: 1} and six.data == {b: 2}
    assert both.get(b) == 2 and len(both) == 2 and dict(both.items()) == {a: 1, b: 2}
    assert both.name == "ebpflb_svc4" and both.capacity == 2
    assert both.delete(b) and not six.data


def test_backend_ids_are_one_space_over_both_arrays() -> None:
    four: FakeMap[int, BackendEntry] = FakeMap("ebpflb_be4", 8)
    six: FakeMap[int, BackendEntry] = FakeMap("ebpflb_be6", 8)
    both = FamilyMap(four, six, backend_family)
    e4 = BackendEntry(Backend(IPv4Address("10.0.0.1"), 80, Proto.TCP))
    e6 = BackendEntry(Backend(IPv6Address("fd00::1"), 80, Proto.TCP))
    assert both.put_many([(1, e4), (2, e6)]) == {}
    assert four.data == {1: e4} and six.data == {2: e6}
    assert both.get(2) == e6 and both.get(1) == e4  # an id alone: looked up in both
    assert both.delete(2) and not six.data and four.data == {1: e4}
    assert not both.delete(3)


def test_a_dual_stack_nodeport_answers_on_the_node_addresses_of_each_family() -> None:
    """Each family's nodePort frontends on that family's node addresses, over that
    family's endpoints; 127.0.0.1 for host processes, no ::1 (kube-proxy has none)."""
    svc = dual_service(type="NodePort")
    svc["spec"]["ports"][0]["nodePort"] = 30080
    node = NodeView("n1", (IPv4Address("192.168.1.5"), IPv6Address("2001:db8::5")))
    found = frontends_for_service(state_of(svc, slices()), node)
    nodeports = {str(f): d for f, d in found.items() if d.flags & SvcFlags.NODE_PORT}
    assert set(nodeports) == {
        "192.168.1.5:30080/TCP",
        "127.0.0.1:30080/TCP",
        "[2001:db8::5]:30080/TCP",
    }
    six = nodeports["[2001:db8::5]:30080/TCP"]
    assert {str(b.backend) for b in six.backends} == {"[fd00:244::11]:8080"}
    four = nodeports["192.168.1.5:30080/TCP"]
    assert all(b.backend.address.version == 4 for b in four.backends) and four.backends
    # Nothing is left unserved now: no counter for it.
    agent = Agent(Config(), FakeMapSet(), Metrics(CollectorRegistry()), clock=FakeClock())
    agent.object_updated(Kind.SERVICE, svc)
    assert agent.metrics.registry.get_sample_value("ebpflb_ipv6_skipped_total") is None


def test_refused_external_ips_of_both_families_are_reported() -> None:
    """externalIPs outside --external-ip-cidrs (none by default) of both families: both
    refused and reported (the two families' addresses are never compared)."""
    agent = Agent(Config(), FakeMapSet(), Metrics(CollectorRegistry()), clock=FakeClock())
    agent.object_updated(Kind.SERVICE, dual_service(externalIPs=["2001:db8::7", "192.0.2.7"]))
    assert agent.metrics.registry.get_sample_value("ebpflb_external_ips_refused_total") == 2


def test_ipv6_udp_sockets_of_a_leaving_backend_are_destroyed() -> None:
    """A UDP backend leaving an IPv6 ClusterIP: the agent asks for the connected sockets
    aimed at it to be destroyed (tc/XDP serves no ClusterIP: no conntrack to purge)."""
    maps = FakeMapSet()
    rec = Reconciler(maps)
    ports = [{"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 5353}]
    svc = service(cluster_ip="fd00::53", ports=ports)
    six = [
        endpoint_slice(
            "web-6",
            address_type="IPv6",
            endpoints=[endpoint("fd00:244::11"), endpoint("fd00:244::12")],
        )
    ]
    for obj in six:
        obj["ports"] = [{"name": "dns", "protocol": "UDP", "port": 5353}]
    rec.apply({WEB: frontends_for_service(state_of(svc, six))})
    six[0]["endpoints"] = six[0]["endpoints"][:1]
    rec.apply({WEB: frontends_for_service(state_of(svc, six))})
    frontend = AddrPort(IPv6Address("fd00::53"), 53)
    assert maps.destroy_requests == [
        {frontend: frozenset({AddrPort(IPv6Address("fd00:244::12"), 5353)})}
    ]


def test_a_port_without_cluster_ips_keeps_its_ipv4_frontends() -> None:
    """A ServicePort built without cluster IPs (tests and tools build such) still gets its
    NodePort, LoadBalancer and external-IP frontends, as before dual-stack."""
    port = next(iter(translate_service(service(type="NodePort")).ports.values()))
    port = dataclasses.replace(port, cluster_ips=(), node_port=30080)
    node = NodeView(addresses=(IPv4Address("192.168.1.5"),))
    found = frontends_for_port(port, (), node)
    assert {str(d.frontend) for d in found} == {"192.168.1.5:30080/TCP", "127.0.0.1:30080/TCP"}


def test_explain_follows_an_ipv6_and_an_ipv4_mapped_connect() -> None:
    """`ebpflb explain` for socket-LB over IPv6: the IPv6 frontend's table and backends;
    an IPv4-mapped address is explained by the IPv4 tables, as connect6 translates it."""
    maps = FakeMapSet(max_services=8, max_backends=16, slot_pool_size=4096)
    Reconciler(maps).apply({WEB: frontends_for_service(state_of(dual_service(), slices()))})
    settings = Settings(1)
    six = explain(maps, parse_query("fd00::1", "[fd00::10]:80"), settings)
    assert six.verdict is Verdict.TRANSLATED
    assert [c.backend for c in six.candidates] == ["[fd00:244::11]:8080"]
    mapped = explain(maps, parse_query("fd00::1", "[::ffff:10.96.0.10]:80"), settings)
    assert mapped.verdict is Verdict.TRANSLATED
    assert {c.backend for c in mapped.candidates} == {"10.244.1.11:8080", "10.244.1.12:8080"}
    missing = explain(maps, parse_query("fd00::1", "[fd00::10]:81"), settings)
    assert missing.verdict is Verdict.NOT_TRANSLATED
    assert "not in ebpflb_svc6" in missing.steps[0].outcome
    # From outside, the IPv6 frontend is tc/XDP's: the ClusterIP is not served there.
    outside = explain(maps, parse_query("2001:db8::1", "[fd00::10]:80", outside=True), settings)
    assert outside.verdict is Verdict.NOT_TRANSLATED and "ClusterIP" in outside.reason


def test_each_familys_source_ranges_have_their_own_map_and_budget() -> None:
    """A dual-stack LoadBalancer: the IPv6 ingress IP's ranges go to ebpflb_srcrng6, the
    IPv4 one's to ebpflb_srcrng4, each map with its own capacity; a family's map full
    fails that family's frontend only (named, counted), nothing of it written."""
    svc = dual_service(
        type="LoadBalancer",
        loadBalancerSourceRanges=["198.51.100.0/24", "2001:db8:c::/48", "2001:db8:d::/48"],
    )
    svc["spec"]["ports"][0]["nodePort"] = 30080
    svc["status"] = {"loadBalancer": {"ingress": [{"ip": "203.0.113.1"}, {"ip": "2001:db8::1"}]}}
    wanted = frontends_for_service(state_of(svc, slices()))
    lb4 = wanted[Frontend(IPv4Address("203.0.113.1"), 80, Proto.TCP)]
    lb6 = wanted[Frontend(IPv6Address("2001:db8::1"), 80, Proto.TCP)]
    assert [str(n) for n in lb4.source_ranges] == ["198.51.100.0/24"]
    assert [str(n) for n in lb6.source_ranges] == ["2001:db8:c::/48", "2001:db8:d::/48"]

    maps = FakeMapSet(src_range_max=2)
    rec = Reconciler(maps, metrics=Metrics(CollectorRegistry()))
    assert rec.apply({WEB: wanted}).errors == []
    assert {r.network.version for r in maps.source_ranges4.data} == {4}
    assert len(maps.source_ranges4) == 1 and len(maps.source_ranges6) == 2
    assert rec.space.range_counts == {4: 1, 6: 2}

    # A third IPv6 range: ebpflb_srcrng6 (2 entries) is full, ebpflb_srcrng4 is not.
    more = dual_service(
        type="LoadBalancer",
        loadBalancerSourceRanges=["198.51.100.0/24", "2001:db8:c::/48", "2001:db8:d::/48"],
    )
    more["spec"]["clusterIPs"] = ["10.96.0.11", "fd00::11"]
    more["spec"]["clusterIP"] = "10.96.0.11"
    more["spec"]["ports"][0]["nodePort"] = 30081
    more["status"] = {"loadBalancer": {"ingress": [{"ip": "203.0.113.2"}, {"ip": "2001:db8::2"}]}}
    other = NamespacedName("default", "other")  # another owner, the same port name
    result = rec.apply({WEB: wanted, other: frontends_for_service(state_of(more, slices()))})
    (error,) = result.errors
    assert "ebpflb_srcrng6 is full (limit 2)" in error and "[2001:db8::2]:80/TCP" in error
    assert rec.metrics is not None
    counted = rec.metrics.registry.get_sample_value(
        "ebpflb_map_errors_total", {"map": "ebpflb_srcrng6", "reason": "full"}
    )
    assert counted == 1
    assert Frontend(IPv6Address("2001:db8::2"), 80, Proto.TCP) not in maps.services.data
    # The IPv4 ingress IP of the same service has room in its own map: written.
    assert Frontend(IPv4Address("203.0.113.2"), 80, Proto.TCP) in maps.services.data
    assert rec.space.range_counts == {4: 2, 6: 2}
    assert len(maps.source_ranges4) == 2 and len(maps.source_ranges6) == 2
