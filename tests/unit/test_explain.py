"""`ebpflb explain` against maps the reconciler wrote (FakeMapSet): each path and verdict,
and the slot it computes against the table itself. tests/kernel/test_explain.py checks the
same explanations against where real traffic goes."""

from __future__ import annotations

import json
from ipaddress import IPv4Address, IPv4Network

import pytest

from ebpflb.cli import parse_args
from ebpflb.datapath.contract import CtFlags
from ebpflb.datapath.fake import FakeMapSet
from ebpflb.datapath.maps import AddrPort, ConntrackEntry, Flow, ServiceCounters
from ebpflb.desired import DesiredFrontend, WeightedBackend
from ebpflb.errors import ConfigError
from ebpflb.explain import Path, Verdict, explain
from ebpflb.explain.engine import Settings
from ebpflb.explain.flowhash import flow4_hash, jhash_3words, mix64
from ebpflb.explain.model import parse_query
from ebpflb.explain.render import render_text
from ebpflb.model import (
    Backend,
    BackendFlags,
    Frontend,
    NamespacedName,
    Proto,
    ServicePortName,
    SvcFlags,
)
from ebpflb.reconcile import Reconciler

NODE = IPv4Address("192.168.1.1")
SEED = 0x6562706C
SETTINGS = Settings(SEED, (40000, 40063), ifindex=lambda name: {"eth0": 2}[name], now_ns=10**12)
LOCAL, REMOTE = ("10.244.1.11", "10.244.1.12"), ("10.244.2.21", "10.244.2.22")


def be(ip: str, local: bool) -> WeightedBackend:
    flags = BackendFlags.LOCAL if local else BackendFlags.NONE
    return WeightedBackend(Backend(IPv4Address(ip), 8080, Proto.TCP), flags=flags)


def frontend(ip: str | IPv4Address, port: int) -> Frontend:
    return Frontend(IPv4Address(ip), port, Proto.TCP)


def want(
    name: str, fe: Frontend, flags: SvcFlags, backends: tuple[WeightedBackend, ...], **kw: object
) -> DesiredFrontend:
    owner = ServicePortName(NamespacedName("default", name), "http", Proto.TCP)
    return DesiredFrontend(fe, owner, flags, backends, **kw)  # type: ignore[arg-type]


ALL = tuple(be(ip, True) for ip in LOCAL) + tuple(be(ip, False) for ip in REMOTE)


@pytest.fixture
def maps() -> FakeMapSet:
    maps = FakeMapSet()
    services = {
        "web": [
            want("web", frontend("10.96.0.10", 80), SvcFlags.CLUSTER_IP, ALL),
            want("web", frontend(NODE, 30080), SvcFlags.NODE_PORT, ALL),
        ],
        "local": [
            want(
                "local",
                frontend(NODE, 30081),
                SvcFlags.NODE_PORT | SvcFlags.ETP_LOCAL,
                ALL[:1],
            ),
        ],
        "empty": [
            want("empty", frontend("10.96.0.99", 80), SvcFlags.CLUSTER_IP, ()),
            want("empty", frontend(NODE, 30099), SvcFlags.NODE_PORT, ()),
        ],
        "dns": [
            DesiredFrontend(
                Frontend(IPv4Address("10.96.0.53"), 53, Proto.UDP),
                ServicePortName(NamespacedName("default", "dns"), "dns", Proto.UDP),
                SvcFlags.CLUSTER_IP,
                tuple(WeightedBackend(Backend(IPv4Address(ip), 53, Proto.UDP)) for ip in LOCAL),
            )
        ],
        "lb": [
            want(
                "lb",
                frontend("192.168.1.50", 80),
                SvcFlags.LOADBALANCER | SvcFlags.SOURCE_RANGES,
                ALL,
                source_ranges=(IPv4Network("192.168.1.100/32"),),
            ),
        ],
    }
    result = Reconciler(maps).apply(
        {
            NamespacedName("default", name): {w.frontend: w for w in wants}
            for name, wants in services.items()
        }
    )
    assert not result.errors
    maps.iface_addrs = {2: NODE}
    return maps


def ask(maps: FakeMapSet, client: str, target: str, **kw: object) -> object:
    return explain(maps, parse_query(client, target, **kw), SETTINGS)  # type: ignore[arg-type]


def test_the_hash_mirrors_give_the_c_functions_values() -> None:
    # Reference values from bpf/lib/hash.h's functions compiled with gcc.
    assert jhash_3words(0, 0, 0, 0) == 834184464
    assert jhash_3words(1, 2, 3, 4) == 3371942647
    assert jhash_3words(0xFFFFFFFF, 0x12345678, 0x9ABCDEF0, SEED) == 3263417847
    assert mix64(1) == 885181228 and mix64(0x123456789ABCDEF) == 2298621162


def test_an_address_that_is_no_frontend_is_not_translated(maps: FakeMapSet) -> None:
    ex = explain(maps, parse_query("10.244.1.5", "10.96.0.10:81"), SETTINGS)
    assert ex.verdict is Verdict.NOT_TRANSLATED and ex.frontend is None
    assert "not in ebpflb_svc4" in ex.steps[0].outcome


def test_cluster_ip_connect_is_random_over_the_table(maps: FakeMapSet) -> None:
    ex = explain(maps, parse_query("10.244.1.5", "10.96.0.10:80/tcp"), SETTINGS)
    assert ex.verdict is Verdict.TRANSLATED and ex.frontend is not None
    assert ex.frontend.service == "default/web:http" and ex.frontend.type == "ClusterIP"
    assert ex.selection is not None and not ex.selection.deterministic
    assert "prandom" in ex.selection.hash_inputs and ex.backend is None
    assert {c.backend for c in ex.candidates} == {f"{ip}:8080" for ip in LOCAL + REMOTE}
    assert sum(c.slots for c in ex.candidates) == ex.frontend.table_size
    assert ex.nat is not None and not ex.nat.snat
    assert "possible backends" in render_text(ex)


def test_unconnected_udp_with_its_socket_cookie_is_exact(maps: FakeMapSet) -> None:
    ex = explain(
        maps,
        parse_query("10.244.1.5", "10.96.0.53:53/UDP", sendmsg=True, socket_cookie=4242),
        SETTINGS,
    )
    entry = maps.services.data[Frontend(IPv4Address("10.96.0.53"), 53, Proto.UDP)]
    assert ex.selection is not None and ex.selection.slot == mix64(4242) % entry.table_size
    backend_id = int(maps.slots.read(entry.table_off + ex.selection.slot, 1)[0])
    assert ex.backend is not None and ex.backend.backend_id == backend_id


def test_no_endpoints_refuses_a_connect_and_drops_a_packet(maps: FakeMapSet) -> None:
    ex = explain(maps, parse_query("10.244.1.5", "10.96.0.99:80"), SETTINGS)
    assert ex.verdict is Verdict.REFUSED and "ECONNREFUSED" in ex.reason
    ex = explain(maps, parse_query("192.168.1.100:5000", f"{NODE}:30099", outside=True), SETTINGS)
    assert ex.verdict is Verdict.DROPPED and "np_no_backend" in ex.reason


def test_nodeport_with_a_client_port_names_the_slot_backend_and_nat(maps: FakeMapSet) -> None:
    entry = maps.services.data[frontend(NODE, 30080)]
    table = maps.slots.read(entry.table_off, entry.table_size)
    seen = set()
    for port in range(40000, 40040):
        ex = explain(
            maps, parse_query(f"192.168.1.100:{port}", f"{NODE}:30080", ingress="eth0"), SETTINGS
        )
        flow = Flow(AddrPort(IPv4Address("192.168.1.100"), port), AddrPort(NODE, 30080), Proto.TCP)
        slot = flow4_hash(flow, SEED) % entry.table_size
        expected = maps.backends.data[int(table[slot])]
        assert ex.verdict is Verdict.TRANSLATED and ex.backend is not None
        assert ex.selection is not None and ex.selection.slot == slot
        assert ex.backend.backend == str(expected.backend)
        assert ex.nat is not None
        assert ex.nat.snat == (not expected.flags & BackendFlags.LOCAL)
        if ex.nat.snat:
            assert ex.nat.source == str(NODE) and 40000 <= (ex.nat.first_port or 0) <= 40063
        seen.add(ex.backend.backend)
    assert len(seen) == 4  # the client's port moves the flow over every backend


def test_without_a_client_port_the_outside_choice_is_not_reproducible(maps: FakeMapSet) -> None:
    ex = explain(maps, parse_query("192.168.1.100", f"{NODE}:30080", outside=True), SETTINGS)
    assert ex.selection is not None and not ex.selection.deterministic
    assert "client's port" in ex.selection.hash_inputs
    assert ex.nat is not None and ex.nat.snat and "another node" in ex.nat.reason


def test_external_traffic_policy_local_keeps_the_client_address(maps: FakeMapSet) -> None:
    ex = explain(maps, parse_query("192.168.1.100:5555", f"{NODE}:30081", outside=True), SETTINGS)
    assert ex.verdict is Verdict.TRANSLATED and ex.backend is not None
    assert ex.backend.backend == "10.244.1.11:8080" and ex.backend.local
    assert ex.nat is not None and not ex.nat.snat and "Local" in ex.nat.reason
    assert ex.frontend is not None and "etp_local" in ex.frontend.flags


def test_a_cluster_ip_is_never_served_from_outside(maps: FakeMapSet) -> None:
    ex = explain(maps, parse_query("192.168.1.100:5555", "10.96.0.10:80", outside=True), SETTINGS)
    assert ex.verdict is Verdict.NOT_TRANSLATED and ex.frontend is not None


def test_source_ranges_drop_other_clients(maps: FakeMapSet) -> None:
    ok = explain(maps, parse_query("192.168.1.100:5555", "192.168.1.50:80", outside=True), SETTINGS)
    assert ok.verdict is Verdict.TRANSLATED
    no = explain(maps, parse_query("192.168.1.200:5555", "192.168.1.50:80", outside=True), SETTINGS)
    assert no.verdict is Verdict.DROPPED and "loadBalancerSourceRanges" in no.reason


def test_a_live_flow_keeps_its_backend_from_conntrack(maps: FakeMapSet) -> None:
    client, front = AddrPort(IPv4Address("192.168.1.100"), 5555), AddrPort(NODE, 30080)
    maps.conntrack.data[Flow(client, front, Proto.TCP)] = ConntrackEntry(
        AddrPort(IPv4Address("10.244.9.9"), 8080), CtFlags.NONE, None, 1, 7, 2 * 10**12, 3, 300
    )
    ex = explain(maps, parse_query("192.168.1.100:5555", f"{NODE}:30080", outside=True), SETTINGS)
    assert ex.selection is not None and ex.selection.from_conntrack
    assert ex.backend is not None and ex.backend.backend == "10.244.9.9:8080"
    expired = Settings(SEED, now_ns=3 * 10**12)
    ex = explain(maps, parse_query("192.168.1.100:5555", f"{NODE}:30080", outside=True), expired)
    assert ex.selection is not None and not ex.selection.from_conntrack


def test_json_carries_the_whole_explanation_and_the_counters(maps: FakeMapSet) -> None:
    svc_id = maps.services.data[frontend(NODE, 30080)].svc_id
    maps.service_counters.data[svc_id] = ServiceCounters(np_flows=2, np_packets=9)
    ex = explain(maps, parse_query("192.168.1.100:1234", f"{NODE}:30080", outside=True), SETTINGS)
    document = json.loads(json.dumps(ex.to_json()))
    assert document["verdict"] == "translated"
    assert document["query"]["path"] == Path.OUTSIDE.value
    assert document["backend"]["backend"] == ex.backend.backend  # type: ignore[union-attr]
    assert document["counters"]["np_packets"] == 9
    assert "NodePort flows 2, packets 9" in render_text(ex)


@pytest.mark.parametrize(
    "client, target",
    [
        ("10.0.0.300", "10.96.0.10:80"),
        ("10.0.0.1", "10.96.0.10"),
        ("10.0.0.1:0", "10.96.0.10:80"),
        ("10.0.0.1", "10.96.0.10:80/SCTP"),
    ],
)
def test_bad_arguments_are_named(client: str, target: str) -> None:
    with pytest.raises(ConfigError, match="explain"):
        parse_query(client, target)
    with pytest.raises(ConfigError, match="sendmsg"):
        parse_query("10.0.0.1", "10.96.0.10:80/TCP", sendmsg=True)


def test_the_explain_command_line() -> None:
    args = parse_args(["explain", "10.0.0.1:4000", "10.96.0.10:80/UDP", "--ingress", "eth0"])
    assert (args.command, args.client, args.target, args.ingress) == (
        "explain",
        "10.0.0.1:4000",
        "10.96.0.10:80/UDP",
        "eth0",
    )
    with pytest.raises(SystemExit):  # one path at a time
        parse_args(["explain", "10.0.0.1", "10.96.0.10:80", "--ingress", "eth0", "--from-outside"])
