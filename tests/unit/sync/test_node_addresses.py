"""Node addresses that change while the agent runs: the pure parts (which addresses, which
SNAT source per interface, the node view) and the agent recomputing NodePort frontends.
The netlink side is tests/kernel/nodeport/test_node_addresses.py."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address, IPv6Network

import pytest
from prometheus_client import CollectorRegistry

from ebpflb.cli import parse_args
from ebpflb.clock import FakeClock
from ebpflb.config import Config
from ebpflb.datapath.addrwatch import AddressState, interface_mtus, snat_sources
from ebpflb.datapath.contract import MAX_IFACES
from ebpflb.datapath.maps import PRIMARY_IFINDEX, InterfaceAddresses, dump
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.desired import NodeView
from ebpflb.errors import ConfigError
from ebpflb.k8s.sources.base import Kind
from ebpflb.observe.metrics import Metrics
from ebpflb.sync.agent import Agent
from tests.factories import endpoint_slice, service

A, B, C = IPv4Address("192.168.1.10"), IPv4Address("192.168.1.11"), IPv4Address("10.0.0.10")
ETH0, ETH1, OTHER = 2, 3, 4
WATCHED = {ETH0: "eth0", ETH1: "eth1"}


def test_node_addresses_are_the_watched_interfaces_once_each() -> None:
    state = AddressState({ETH0: (A, B), ETH1: (C, A), OTHER: (IPv4Address("172.16.0.1"),)})
    assert state.node_addresses(WATCHED) == (A, B, C)
    assert state.node_addresses({}) == ()


def test_primary_addresses_are_the_default_route_interface_ones() -> None:
    assert AddressState({ETH0: (A, B), ETH1: (C,)}, default_ifindex=ETH1).primary_addresses() == (
        C,
    )
    assert AddressState({ETH0: (A,)}).primary_addresses() == ()  # no default route


def sources(previous: InterfaceAddresses, state: AddressState) -> InterfaceAddresses:
    found, left_out = snat_sources(previous, state)
    assert left_out == 0
    return found


P = PRIMARY_IFINDEX


def test_snat_source_stays_while_held_and_moves_when_removed() -> None:
    none = InterfaceAddresses()
    first = sources(none, AddressState({ETH0: (A,), ETH1: (C,)}, default_ifindex=ETH1))
    # Each interface's own, and the primary address (the default route's interface's).
    assert first == InterfaceAddresses({ETH0: A, ETH1: C, P: C})
    # A secondary address added: nothing moves (flows keep one source).
    again = AddressState({ETH0: (A, B), ETH1: (C,)}, default_ifindex=ETH1)
    assert sources(first, again) == first
    # Listed first now, but A is still there: A stays.
    assert sources(first, AddressState({ETH0: (B, A), ETH1: (C,)}, default_ifindex=ETH1)) == first
    # A removed: the interface's remaining address; eth1 with none: no entry at all, and
    # without a default route the primary is the lowest ifindex's.
    assert sources(first, AddressState({ETH0: (B,)})) == InterfaceAddresses({ETH0: B, P: B})


def test_every_interface_gets_its_snat_source_not_only_the_attached_ones() -> None:
    """MASQUERADE takes the egress interface's address (an overlay's tunnel device, a
    second NIC): the programs look the egress interface up, so every interface with an
    address has its entry, watched (attached) or not."""
    found = sources(InterfaceAddresses(), AddressState({OTHER: (A,)}))
    assert found == InterfaceAddresses({OTHER: A, P: A})


def test_interfaces_beyond_the_maps_are_left_out_and_counted() -> None:
    many = {index: (IPv4Address(f"10.1.{index // 256}.{index % 256}"),) for index in range(1, 81)}
    found, left_out = snat_sources(InterfaceAddresses(), AddressState(many))
    assert len(found.v4) == MAX_IFACES and left_out == 80 + 1 - MAX_IFACES
    assert found.v4[P] == many[1][0]  # the primary entry is kept
    assert max(found.v4) == MAX_IFACES - 1  # the lowest ifindexes are kept


def test_every_interface_mtu_is_followed() -> None:
    state = AddressState({ETH0: (A,)}, mtus={1: 65536, ETH0: 1500, ETH1: 1400})
    assert interface_mtus(state) == {1: 65536, ETH0: 1500, ETH1: 1400}
    lots = AddressState(mtus={index: 1500 for index in range(1, 100)})
    assert sorted(interface_mtus(lots)) == list(range(1, MAX_IFACES + 1))


G1, G2 = IPv6Address("2001:db8::10"), IPv6Address("2001:db8::11")
U1 = IPv6Address("fd00:1::10")


def test_each_family_has_its_own_snat_source_per_interface() -> None:
    """ebpflb_ifaddr6 beside ebpflb_ifaddr4: the first IPv6 address of each interface,
    kept while held, as the IPv4 one; an interface with addresses of one family only has
    an entry in that family's map only; each family's primary is its own."""
    state = AddressState({ETH0: (A, G1, G2), ETH1: (U1,)}, default6_ifindex=ETH1)
    first = sources(InterfaceAddresses(), state)
    assert first == InterfaceAddresses({ETH0: A, P: A}, {ETH0: G1, ETH1: U1, P: U1})
    assert first.of(6) == {ETH0: G1, ETH1: U1, P: U1} and first.of(4) == {ETH0: A, P: A}
    # G1 goes, A stays: only the IPv6 source moves.
    moved = sources(first, AddressState({ETH0: (A, G2), ETH1: (U1,)}, default6_ifindex=ETH1))
    assert moved == InterfaceAddresses({ETH0: A, P: A}, {ETH0: G2, ETH1: U1, P: U1})
    # G1 back, listed first: G2 is still held, it stays.
    assert sources(moved, state) == moved


def test_node_addresses_and_primary_cover_both_families() -> None:
    state = AddressState(
        {ETH0: (A, G1), ETH1: (C, U1)}, default_ifindex=ETH0, default6_ifindex=ETH1
    )
    assert state.node_addresses(WATCHED) == (A, G1, C, U1)
    # Each family's primary addresses come from its own default route's interface.
    assert state.primary_addresses() == (A, U1)
    assert AddressState({ETH0: (A, G1)}, default6_ifindex=ETH0).primary_addresses() == (G1,)


def test_usable_ipv6_addresses_are_global_and_past_dad() -> None:
    from ebpflb.datapath.addrwatch import IFA_F_DADFAILED, IFA_F_TENTATIVE, _usable6

    assert _usable6(G1, 0, 0) and _usable6(U1, 0, 0x80)  # 0x80: IFA_F_PERMANENT
    assert not _usable6(IPv6Address("fe80::1"), 253, 0)  # link scope
    assert not _usable6(IPv6Address("fe80::1"), 0, 0)  # fe80::/10 whatever the scope says
    assert not _usable6(IPv6Address("::1"), 254, 0)  # host scope
    assert not _usable6(G1, 0, IFA_F_TENTATIVE) and not _usable6(G1, 0, IFA_F_DADFAILED)


def test_ipv6_nodeports_are_on_the_ipv6_node_addresses_without_loopback() -> None:
    node = NodeView("n1", (A, G1))
    assert node.nodeport_addresses() == (A, G1, IPv4Address("127.0.0.1"))  # no ::1
    # --nodeport-addresses per family (kube-proxy's NewNodePortAddresses): the CIDRs of a
    # family filter it; a family with no CIDR of its own keeps all its addresses.
    only6 = NodeView("n1", (A, G1, U1), nodeport_cidrs=(IPv6Network("2001:db8::/32"),))
    assert only6.nodeport_addresses() == (A, G1, IPv4Address("127.0.0.1"))
    both = NodeView(
        "n1",
        (A, C, G1, U1),
        nodeport_cidrs=(*Config.parse_cidrs("10.0.0.0/8"), IPv6Network("fd00::/8")),
    )
    assert both.nodeport_addresses() == (C, U1)
    assert NodeView("n1", (A, G1), nodeport_primary=True, primary=(G1,)).nodeport_addresses() == (
        G1,
    )


def test_the_flag_takes_ipv6_cidrs() -> None:
    cidrs = parse_args(["run", "--nodeport-addresses", "10.0.0.0/8,2001:db8::/64"])
    assert [str(n) for n in cidrs.nodeport_addresses] == ["10.0.0.0/8", "2001:db8::/64"]
    with pytest.raises(SystemExit):
        parse_args(["run", "--nodeport-addresses", "2001:db8::1/64"])  # host bits set


def test_node_view_with_new_addresses_moves_its_nodeports() -> None:
    node = NodeView("n1", (A,))
    moved = node.with_addresses((A, B), ())
    assert moved.nodeport_addresses() == (A, B, IPv4Address("127.0.0.1"))
    assert moved.name == "n1" and node.addresses == (A,)  # frozen: a new view


def test_primary_nodeports_are_the_primary_addresses_only() -> None:
    node = NodeView("n1", (A, B, C), nodeport_primary=True, primary=(A, B))
    assert node.nodeport_addresses() == (A, B)  # no 127.0.0.1, as kube-proxy's "primary"
    assert node.with_addresses((A, B, C), (C,)).nodeport_addresses() == (C,)
    assert NodeView("n1", (A,), nodeport_primary=True).nodeport_addresses() == ()


def test_the_flag_takes_primary_or_cidrs() -> None:
    args = parse_args(["run", "--nodeport-addresses", "primary"])
    assert args.nodeport_addresses == "primary"
    cidrs = parse_args(["run", "--nodeport-addresses", "10.0.0.0/8"]).nodeport_addresses
    assert [str(n) for n in cidrs] == ["10.0.0.0/8"]
    with pytest.raises(SystemExit):
        parse_args(["run", "--nodeport-addresses", "primary,10.0.0.0/8"])
    with pytest.raises(ConfigError, match="not both"):
        Config(nodeport_primary=True, nodeport_addresses=cidrs)


def nodeports(maps: FakeMapSet) -> set[str]:
    return {s["frontend"] for s in dump.collect(maps)["services"] if ":30080/" in s["frontend"]}


def test_agent_follows_node_addresses_at_the_next_sync() -> None:
    maps = FakeMapSet()
    registry = CollectorRegistry()
    clock = FakeClock()
    agent = Agent(
        Config(min_sync_period=1.0, max_sync_period=60.0),
        maps,
        Metrics(registry),
        clock=clock,
        node=NodeView("n1", (A,)),
    )
    np = [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30080}]
    agent.object_updated(Kind.SERVICE, service(type="NodePort", ports=np))
    agent.object_updated(Kind.ENDPOINT_SLICE, endpoint_slice())
    agent.initial_list_done(Kind.SERVICE)
    agent.initial_list_done(Kind.ENDPOINT_SLICE)
    assert agent.runner.run_once() is not None
    assert nodeports(maps) == {f"{A}:30080/TCP", "127.0.0.1:30080/TCP"}

    assert agent.set_node_addresses((A, B))
    assert not agent.set_node_addresses((A, B))  # the same: nothing to do
    clock.advance(2)
    assert agent.runner.run_once() is not None  # no service changed, yet all recomputed
    assert nodeports(maps) == {f"{A}:30080/TCP", f"{B}:30080/TCP", "127.0.0.1:30080/TCP"}

    assert agent.set_node_addresses((B,))
    clock.advance(2)
    assert agent.runner.run_once() is not None
    assert nodeports(maps) == {f"{B}:30080/TCP", "127.0.0.1:30080/TCP"}
    assert "10.96.0.10:80/TCP" in {s["frontend"] for s in dump.collect(maps)["services"]}

    def changes(change: str) -> float | None:
        return registry.get_sample_value("ebpflb_node_address_changes_total", {"change": change})

    assert changes("added") == 1 and changes("removed") == 1


def test_agent_programs_ipv6_nodeports_on_ipv6_addresses_as_they_come() -> None:
    """An IPv6 single-stack NodePort: no frontend while the node has no IPv6 address, one
    on each IPv6 address once it has some (never on the IPv4 ones, nor on ::1)."""
    maps = FakeMapSet()
    clock = FakeClock()
    agent = Agent(
        Config(min_sync_period=1.0, max_sync_period=60.0),
        maps,
        Metrics(CollectorRegistry()),
        clock=clock,
        node=NodeView("n1", (A,)),
    )
    np = [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30080}]
    agent.object_updated(
        Kind.SERVICE, service(type="NodePort", cluster_ip="fd00::10", ipFamilies=["IPv6"], ports=np)
    )
    six = endpoint_slice("web-6", address_type="IPv6", endpoints=[{"addresses": ["fd00:244::11"]}])
    agent.object_updated(Kind.ENDPOINT_SLICE, six)
    agent.initial_list_done(Kind.SERVICE)
    agent.initial_list_done(Kind.ENDPOINT_SLICE)
    assert agent.runner.run_once() is not None
    assert nodeports(maps) == set()
    assert agent.set_node_addresses((A, G1, U1), (A, G1))
    clock.advance(2)
    assert agent.runner.run_once() is not None
    assert nodeports(maps) == {f"[{G1}]:30080/TCP", f"[{U1}]:30080/TCP"}
