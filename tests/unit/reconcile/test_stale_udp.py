"""A UDP backend leaving a NodePort frontend takes its conntrack entries with it."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address

from ebpflb.datapath.contract import CtFlags, NatFlags
from ebpflb.datapath.maps import AddrPort, ConntrackEntry, Flow, NatEntry
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.desired import DesiredFrontend, WeightedBackend
from ebpflb.model import Backend, Frontend, NamespacedName, Proto, ServicePortName, SvcFlags
from ebpflb.reconcile import Reconciler

WEB = NamespacedName("default", "dns")
NODE = IPv4Address("192.168.1.10")


def want(proto: Proto, *lasts: int) -> dict[Frontend, DesiredFrontend]:
    frontend = Frontend(NODE, 30053, proto)
    bes = tuple(WeightedBackend(Backend(IPv4Address(f"10.244.1.{n}"), 5353, proto)) for n in lasts)
    name = ServicePortName(WEB, proto.name.lower(), proto)
    return {frontend: DesiredFrontend(frontend, name, SvcFlags.NODE_PORT, bes)}


def add_flow(maps: FakeMapSet, proto: Proto, client_port: int, backend: int) -> Flow:
    svc_id = maps.services.data[Frontend(NODE, 30053, proto)].svc_id
    flow = Flow(AddrPort(IPv4Address("192.168.1.100"), client_port), AddrPort(NODE, 30053), proto)
    target = AddrPort(IPv4Address(f"10.244.1.{backend}"), 5353)
    snat = AddrPort(NODE, 40000 + client_port % 100)
    maps.conntrack.put(flow, ConntrackEntry(target, CtFlags.SNAT, snat, svc_id, 0, 1, 1, 1))
    reply = NatEntry(flow.source, flow.destination, NatFlags.SNAT, 1)
    maps.reply_nat.put(Flow(target, snat, proto), reply)
    return flow


def test_udp_flows_of_a_leaving_backend_are_deleted_tcp_flows_kept() -> None:
    maps = FakeMapSet()
    rec = Reconciler(maps)
    rec.apply({WEB: {**want(Proto.UDP, 1, 2), **want(Proto.TCP, 1, 2)}}, full=True)
    stale = add_flow(maps, Proto.UDP, 1001, 1)
    live = add_flow(maps, Proto.UDP, 1002, 2)
    tcp = add_flow(maps, Proto.TCP, 1003, 1)
    result = rec.apply({WEB: {**want(Proto.UDP, 2), **want(Proto.TCP, 2)}})
    assert set(maps.conntrack4.data) == {live, tcp} and stale not in maps.conntrack4.data
    assert result.writes[maps.conntrack4.name] == 1
    # The stale flow's reply translation (its SNAT port) is gone too; the others stay.
    assert {nat.client.port for nat in maps.reply_nat4.data.values()} == {1002, 1003}


def test_nothing_is_read_when_no_udp_backend_left() -> None:
    maps = FakeMapSet()
    rec = Reconciler(maps)
    rec.apply({WEB: want(Proto.UDP, 1)}, full=True)
    add_flow(maps, Proto.UDP, 1001, 1)
    result = rec.apply({WEB: want(Proto.UDP, 1, 2)})  # a backend joins
    assert len(maps.conntrack) == 1 and maps.conntrack4.name not in result.writes


NODE6 = IPv6Address("2001:db8::10")


def test_ipv6_udp_flows_of_a_leaving_backend_are_deleted_from_the_ipv6_maps() -> None:
    """An IPv6 NodePort frontend losing a UDP backend: its flows in ebpflb_ct6 and their
    reply translations in ebpflb_rnat6 go; the other backend's and the IPv4 ones stay."""
    maps = FakeMapSet()
    rec = Reconciler(maps)
    frontend = Frontend(NODE6, 30053, Proto.UDP)
    name = ServicePortName(WEB, "udp6", Proto.UDP)

    def want6(*lasts: int) -> dict[Frontend, DesiredFrontend]:
        bes = tuple(
            WeightedBackend(Backend(IPv6Address(f"fd00:244::{n}"), 5353, Proto.UDP)) for n in lasts
        )
        return {frontend: DesiredFrontend(frontend, name, SvcFlags.NODE_PORT, bes)}

    rec.apply({WEB: {**want6(1, 2), **want(Proto.UDP, 1, 2)}}, full=True)
    svc_id = maps.services.data[frontend].svc_id
    flows = {}
    for port, backend in ((1001, 1), (1002, 2)):
        flow = Flow(AddrPort(IPv6Address("2001:db8:c::1"), port), AddrPort(NODE6, 30053), Proto.UDP)
        target = AddrPort(IPv6Address(f"fd00:244::{backend}"), 5353)
        snat = AddrPort(NODE6, 40000 + port % 100)
        maps.conntrack.put(flow, ConntrackEntry(target, CtFlags.SNAT, snat, svc_id, 0, 1, 1, 1))
        reply = NatEntry(flow.source, flow.destination, NatFlags.SNAT, 1)
        maps.reply_nat.put(Flow(target, snat, Proto.UDP), reply)
        flows[backend] = flow
    four = add_flow(maps, Proto.UDP, 1003, 1)
    assert len(maps.conntrack6) == 2 and len(maps.reply_nat6) == 2
    result = rec.apply({WEB: {**want6(2), **want(Proto.UDP, 1, 2)}})
    assert set(maps.conntrack6.data) == {flows[2]} and set(maps.conntrack4.data) == {four}
    assert [n.client.port for n in maps.reply_nat6.data.values()] == [1002]
    assert len(maps.reply_nat4) == 1
    assert result.writes[maps.conntrack6.name] == 1 and maps.conntrack4.name not in result.writes


def test_sockets_are_destroyed_for_the_frontends_in_node_clients_use() -> None:
    maps = FakeMapSet()
    rec = Reconciler(maps)
    rec.apply({WEB: {**want(Proto.UDP, 1, 2), **want(Proto.TCP, 1, 2)}}, full=True)
    rec.apply({WEB: {**want(Proto.UDP, 2), **want(Proto.TCP, 2)}})
    leaver = AddrPort(IPv4Address("10.244.1.1"), 5353)
    assert maps.destroy_requests == [{AddrPort(NODE, 30053): frozenset({leaver})}]
    rec.apply({WEB: {**want(Proto.UDP, 2, 3), **want(Proto.TCP, 2)}})  # joins only
    assert len(maps.destroy_requests) == 1


def test_stale_cookies_match_backend_and_frontend() -> None:
    from ebpflb.datapath.syscall.sockdiag import stale_cookies

    a, b, f = IPv4Address("10.244.1.1"), IPv4Address("10.244.1.2"), IPv4Address("10.96.0.53")
    entries = [(1, a, 53, f, 53), (2, b, 53, f, 53), (3, a, 53, f, 54), (4, a, 54, f, 53)]
    assert stale_cookies(iter(entries), {(f, 53): {(a, 53)}}) == {1}


def test_clusterip_udp_flows_of_a_leaving_backend_are_deleted() -> None:
    """The per-packet path (--pod-interfaces) tracks ClusterIP flows too, keyed by the
    ClusterIP's entry: a backend leaving takes them with it, as NodePort's (found porting
    upstream's Conntrack "server pod cycles for a ClusterIP service" to that path)."""
    maps = FakeMapSet()
    rec = Reconciler(maps)
    vip = Frontend(IPv4Address("10.96.0.10"), 53, Proto.UDP)
    name = ServicePortName(WEB, "dns", Proto.UDP)

    def want_vip(*lasts: int) -> dict[Frontend, DesiredFrontend]:
        bes = tuple(
            WeightedBackend(Backend(IPv4Address(f"10.244.1.{n}"), 5353, Proto.UDP)) for n in lasts
        )
        return {vip: DesiredFrontend(vip, name, SvcFlags.CLUSTER_IP, bes)}

    rec.apply({WEB: want_vip(1, 2)}, full=True)
    svc_id = maps.services.data[vip].svc_id
    flows = {}
    for port, backend in ((1001, 1), (1002, 2)):
        flow = Flow(
            AddrPort(IPv4Address("10.244.1.50"), port), AddrPort(vip.address, 53), Proto.UDP
        )
        target = AddrPort(IPv4Address(f"10.244.1.{backend}"), 5353)
        maps.conntrack.put(flow, ConntrackEntry(target, CtFlags(0), None, svc_id, 0, 1, 1, 1))
        flows[backend] = flow
    result = rec.apply({WEB: want_vip(2)})
    assert set(maps.conntrack4.data) == {flows[2]}
    assert result.writes[maps.conntrack4.name] == 1


def test_udp_flows_of_a_removed_frontend_are_deleted() -> None:
    """A UDP NodePort Service deleted: its flows and their reply translations go too. Kept,
    the reply translation (backend:port -> client:port) rewrote the replies of a later flow
    of the same addresses and ports, a ClusterIP's through socket-LB, into the deleted
    nodePort's (found porting upstream's Conntrack rows: the ClusterIP one after the
    NodePort one, the same client port 12345 and server pod)."""
    maps = FakeMapSet()
    rec = Reconciler(maps)
    rec.apply({WEB: {**want(Proto.UDP, 1), **want(Proto.TCP, 1)}}, full=True)
    add_flow(maps, Proto.UDP, 1001, 1)
    tcp = add_flow(maps, Proto.TCP, 1003, 1)
    result = rec.apply({WEB: want(Proto.TCP, 1)})  # the UDP port removed
    assert set(maps.conntrack4.data) == {tcp}
    assert {nat.client.port for nat in maps.reply_nat4.data.values()} == {1003}
    assert result.writes[maps.conntrack4.name] == 1
