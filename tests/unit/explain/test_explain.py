"""`ebpflb explain` against maps the reconciler wrote (FakeMapSet): each path and verdict,
and the slot it computes against the table itself. tests/kernel/agent/test_explain.py checks the
same explanations against where real traffic goes."""

from __future__ import annotations

import json
import sys
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from ebpflb.cli import parse_args
from ebpflb.datapath.contract import CtFlags
from ebpflb.datapath.maps import (
    AddrPort,
    AffinityMatch,
    ConntrackEntry,
    Flow,
    InterfaceAddresses,
    ServiceCounters,
    ServiceEntry,
)
from ebpflb.datapath.maps.fake import FakeMap, FakeMapSet
from ebpflb.desired import DesiredFrontend, NodeView, WeightedBackend, frontends_for_port
from ebpflb.errors import ConfigError
from ebpflb.explain import Path, Verdict, explain
from ebpflb.explain.affinity import AffinityEntry, AffinityKey, Folded6, decode_key, encode_key
from ebpflb.explain.engine import Settings
from ebpflb.explain.flowhash import addr6_fold, flow4_hash, flow6_hash, jhash_3words, mix64
from ebpflb.explain.model import parse_query
from ebpflb.explain.render import render_text
from ebpflb.model import (
    Backend,
    BackendFlags,
    Endpoint,
    Frontend,
    NamespacedName,
    Proto,
    Scope,
    ServicePort,
    ServicePortName,
    ServiceType,
    SvcFlags,
    TrafficPolicy,
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
    maps.iface_addrs = InterfaceAddresses({2: NODE})
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
    maps.conntrack.put(
        Flow(client, front, Proto.TCP),
        ConntrackEntry(
            AddrPort(IPv4Address("10.244.9.9"), 8080), CtFlags.NONE, None, 1, 7, 2 * 10**12, 3, 300
        ),
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


# ---- the semantics: internal scope, REJECT, session affinity, why no frontend -------------

N1, N2 = IPv4Address("192.168.1.1"), IPv4Address("192.168.2.1")  # N2: outside NodePort CIDRs
VIEW = NodeView("n1", (N1, N2), nodeport_cidrs=(IPv4Network("192.168.1.0/24"),))
MIXED = (
    Endpoint(IPv4Address("10.244.1.11"), 8080, node_name="n1"),
    Endpoint(IPv4Address("10.244.2.21"), 8080, node_name="n2"),
    Endpoint(IPv4Address("10.244.2.22"), 8080, node_name="n2"),
)
NOW = 10**12
CLUSTER_IPS = ["etp", "etpremote", "itp", "gone", "goneudp", "sticky"]  # 10.96.1.1-6


def service_port(name: str, proto: Proto = Proto.TCP, **kw: object) -> ServicePort:
    base: dict[str, object] = dict(
        name=ServicePortName(NamespacedName("default", name), "http", proto),
        type=ServiceType.NODE_PORT,
        cluster_ips=(IPv4Address(f"10.96.1.{CLUSTER_IPS.index(name) + 1}"),),
        port=80,
        target_port=8080,
    )
    base.update(kw)
    return ServicePort(**base)  # type: ignore[arg-type]


SEMANTICS = {
    # eTP Local with one endpoint here, two elsewhere: outside reaches pod 11 only.
    "etp": (
        service_port("etp", node_port=30100, external_traffic_policy=TrafficPolicy.LOCAL),
        MIXED,
    ),
    # eTP Local with endpoints on other nodes only: outside dropped, in-node served.
    "etpremote": (
        service_port("etpremote", node_port=30101, external_traffic_policy=TrafficPolicy.LOCAL),
        MIXED[1:],
    ),
    "itp": (
        service_port(
            "itp", type=ServiceType.CLUSTER_IP, internal_traffic_policy=TrafficPolicy.LOCAL
        ),
        MIXED[1:],
    ),
    "gone": (service_port("gone", node_port=30102), ()),
    "goneudp": (service_port("goneudp", Proto.UDP, node_port=30103), ()),
    "sticky": (service_port("sticky", node_port=30104, affinity_timeout=60), MIXED),
}


@pytest.fixture
def sem() -> FakeMapSet:
    maps = FakeMapSet()
    desired = {
        NamespacedName("default", name): {
            fe.frontend: fe for fe in frontends_for_port(port, endpoints, VIEW)
        }
        for name, (port, endpoints) in SEMANTICS.items()
    }
    assert not Reconciler(maps).apply(desired).errors
    maps.iface_addrs = InterfaceAddresses({2: N1})
    return maps


def test_in_node_clients_of_an_etp_local_frontend_use_its_internal_scope(sem: FakeMapSet) -> None:
    ex = explain(sem, parse_query("10.244.1.5", f"{N1}:30101"), SETTINGS)
    assert ex.verdict is Verdict.TRANSLATED and ex.frontend is not None
    assert ex.frontend.scope == "internal" and ex.frontend.frontend.endswith("/internal")
    assert [s.name for s in ex.steps] == ["frontend", "internal scope", "selection"]
    assert "SVC_F_INTERNAL_SCOPE" in ex.steps[1].outcome
    assert {c.backend for c in ex.candidates} == {"10.244.2.21:8080", "10.244.2.22:8080"}
    # From outside the same address is the external entry: no local endpoint, dropped (not
    # rejected: the service has endpoints, elsewhere).
    out = explain(sem, parse_query("192.168.1.100:4000", f"{N1}:30101", outside=True), SETTINGS)
    assert out.verdict is Verdict.DROPPED and out.frontend is not None
    assert out.frontend.scope == "external" and "externalTrafficPolicy: Local" in out.reason
    # With a local endpoint: outside gets it only, in-node clients every endpoint.
    inside = explain(sem, parse_query("10.244.1.5", f"{N1}:30100"), SETTINGS)
    assert len(inside.candidates) == 3
    out = explain(sem, parse_query("192.168.1.100:4000", f"{N1}:30100", outside=True), SETTINGS)
    assert out.backend is not None and out.backend.backend == "10.244.1.11:8080"


def test_a_missing_internal_entry_leaves_the_external_one(sem: FakeMapSet) -> None:
    sem.services.data.pop(Frontend(N1, 30100, Proto.TCP, Scope.INTERNAL))
    ex = explain(sem, parse_query("10.244.1.5", f"{N1}:30100"), SETTINGS)
    assert ex.frontend is not None and ex.frontend.scope == "external"
    assert "external entry stays in use" in ex.steps[1].outcome
    assert [c.backend for c in ex.candidates] == ["10.244.1.11:8080"]


def test_internal_traffic_policy_local_without_a_local_endpoint_refuses(sem: FakeMapSet) -> None:
    ex = explain(sem, parse_query("10.244.1.5", "10.96.1.3:80"), SETTINGS)
    assert ex.verdict is Verdict.REFUSED and "internalTrafficPolicy: Local" in ex.reason


def test_no_endpoint_anywhere_is_answered_with_a_rst_or_icmp(sem: FakeMapSet) -> None:
    tcp = explain(sem, parse_query("192.168.1.100:4000", f"{N1}:30102", outside=True), SETTINGS)
    assert tcp.verdict is Verdict.REJECTED and "TCP RST" in tcp.reason
    assert tcp.steps[-1].name == "reject" and "XDP passes" in tcp.steps[-1].outcome
    assert tcp.frontend is not None and "reject" in tcp.frontend.flags
    assert "verdict: rejected" in render_text(tcp)
    udp = explain(sem, parse_query("192.168.1.100:4000", f"{N1}:30103/UDP", outside=True), SETTINGS)
    assert udp.verdict is Verdict.REJECTED and "ICMP port unreachable" in udp.reason
    # Socket-LB refuses (the flag is for tc/XDP).
    sock = explain(sem, parse_query("10.244.1.5", f"{N1}:30102"), SETTINGS)
    assert sock.verdict is Verdict.REFUSED
    assert json.loads(json.dumps(tcp.to_json()))["verdict"] == "rejected"


def sticky_entry(maps: FakeMapSet, address: IPv4Address = N1) -> ServiceEntry:
    entry = maps.services.data[Frontend(address, 30104, Proto.TCP)]
    assert entry.flags & SvcFlags.AFFINITY
    return entry


def backend_id(maps: FakeMapSet, address: str) -> int:
    return next(i for i, b in maps.backends.data.items() if str(b.backend.address) == address)


def affinity_table() -> FakeMap[AffinityKey, AffinityEntry]:
    return FakeMap("ebpflb_aff4", 64)


def test_a_fresh_affinity_entry_decides_at_the_nodeport(sem: FakeMapSet) -> None:
    entry, table = sticky_entry(sem), affinity_table()
    client = IPv4Address("192.168.1.100")
    remote = backend_id(sem, "10.244.2.22")
    table.data[AffinityKey(client, entry.svc_id)] = AffinityEntry(NOW - 30 * 10**9, remote)
    for port in (4000, 4001, 4002, None):
        source = f"{client}:{port}" if port else str(client)
        query = parse_query(source, f"{N1}:30104", ingress="eth0")
        ex = explain(sem, query, SETTINGS, table)
        assert ex.verdict is Verdict.TRANSLATED and ex.backend is not None
        assert ex.backend.backend == "10.244.2.22:8080" and ex.backend.backend_id == remote
        assert ex.selection is not None and ex.selection.from_affinity
        assert ex.affinity is not None and ex.affinity.outcome == "hit"
        assert ex.affinity.keyed_by == "source address" and ex.affinity.timeout_s == 60
        assert ex.nat is not None and ex.nat.snat  # the backend runs on another node
        if port is not None:  # the SNAT port still follows the 5-tuple's hash
            assert 40000 <= (ex.nat.first_port or 0) <= 40063
    text = render_text(ex)
    assert "(session affinity)" in text and "followed" in text
    document = json.loads(json.dumps(ex.to_json()))
    assert document["affinity"]["entries"][0]["backend"] == "10.244.2.22:8080"


def test_an_expired_or_unmatched_affinity_entry_is_ignored(sem: FakeMapSet) -> None:
    entry, table = sticky_entry(sem), affinity_table()
    client = IPv4Address("192.168.1.100")
    key = AffinityKey(client, entry.svc_id)
    query = parse_query(f"{client}:4000", f"{N1}:30104", ingress="eth0")
    maglev = explain(sem, query, SETTINGS, table)  # no entry: the 5-tuple's slot
    assert maglev.affinity is not None and maglev.affinity.outcome == "miss"
    assert maglev.selection is not None and maglev.selection.slot is not None
    assert "remembered" in maglev.steps[-3].outcome
    other = next(c for c in maglev.candidates if c.backend_id != maglev.backend.backend_id)  # type: ignore[union-attr]
    table.data[key] = AffinityEntry(NOW - 61 * 10**9, other.backend_id)  # timeout 60 s
    ex = explain(sem, query, SETTINGS, table)
    assert ex.affinity is not None and ex.affinity.outcome == "miss"
    assert "expired" in ex.steps[-3].outcome and ex.backend == maglev.backend
    table.data[key] = AffinityEntry(NOW - 10**9, other.backend_id)
    sem.affinity_match.data.pop(AffinityMatch(entry.svc_id, other.backend_id))
    ex = explain(sem, query, SETTINGS, table)
    assert "not in ebpflb_affpair4" in ex.steps[-3].outcome and ex.backend == maglev.backend


def test_socket_lb_affinity_is_per_network_namespace(sem: FakeMapSet) -> None:
    entry, table = sticky_entry(sem), affinity_table()
    cluster_ip = sem.services.data[Frontend(IPv4Address("10.96.1.6"), 80, Proto.TCP)]
    assert cluster_ip.flags & SvcFlags.AFFINITY
    mine = backend_id(sem, "10.244.2.21")
    table.data[AffinityKey(777, cluster_ip.svc_id)] = AffinityEntry(NOW - 10**9, mine)
    table.data[AffinityKey(888, cluster_ip.svc_id)] = AffinityEntry(NOW - 100 * 10**9, mine)
    # The address key of another frontend is not this one's.
    table.data[AffinityKey(IPv4Address("10.244.1.5"), entry.svc_id)] = AffinityEntry(NOW, mine)
    known = explain(
        sem, parse_query("10.244.1.5", "10.96.1.6:80", netns_cookie=777), SETTINGS, table
    )
    assert known.backend is not None and known.backend.backend == "10.244.2.21:8080"
    assert known.affinity is not None and known.affinity.client == "netns cookie 777"
    assert known.verdict is Verdict.TRANSLATED and "10.244.2.21:8080" in known.reason
    stale = explain(
        sem, parse_query("10.244.1.5", "10.96.1.6:80", netns_cookie=888), SETTINGS, table
    )
    assert stale.backend is None and stale.affinity is not None
    assert stale.affinity.outcome == "miss"
    unknown = explain(sem, parse_query("10.244.1.5", "10.96.1.6:80"), SETTINGS, table)
    assert unknown.affinity is not None and unknown.affinity.outcome == "unknown"
    assert {e.client for e in unknown.affinity.entries} == {"netns cookie 777", "netns cookie 888"}
    assert [e.followed for e in sorted(unknown.affinity.entries, key=lambda e: e.client)] == [
        True,
        False,
    ]
    assert "--netns-cookie" in unknown.steps[1].outcome
    not_read = explain(sem, parse_query("10.244.1.5", "10.96.1.6:80"), SETTINGS)
    assert not_read.affinity is not None and "not read" in not_read.steps[1].outcome


def test_the_affinity_key_is_laid_out_as_the_c_code_stores_it() -> None:
    key = AffinityKey(IPv4Address("192.168.100.100"), 7)
    raw = bytes(encode_key(key))
    assert raw[:8] == IPv4Address("192.168.100.100").packed + bytes(4)
    assert raw[8:12] == (7).to_bytes(4, sys.byteorder) and raw[12] == 0
    assert decode_key(encode_key(key)) == key and not key.netns
    cookie = AffinityKey(2**40 + 5, 7)
    assert bytes(encode_key(cookie))[12] == 1 and decode_key(encode_key(cookie)) == cookie


def test_an_address_left_out_of_nodeport_addresses_is_named(sem: FakeMapSet) -> None:
    ex = explain(sem, parse_query("192.168.1.100:4000", f"{N2}:30104", outside=True), SETTINGS)
    assert ex.verdict is Verdict.NOT_TRANSLATED
    assert f"NodePort on {N1} only" in ex.steps[0].outcome  # 127.0.0.1 not listed
    assert "--nodeport-addresses" in ex.steps[0].outcome


def test_an_unknown_address_may_be_a_proxy_mode_load_balancer(sem: FakeMapSet) -> None:
    ex = explain(sem, parse_query("10.244.1.5", "203.0.113.9:443"), SETTINGS)
    assert ex.verdict is Verdict.NOT_TRANSLATED and "ipMode: Proxy" in ex.steps[0].outcome


def test_netns_cookie_is_for_socket_lb() -> None:
    with pytest.raises(ConfigError, match="netns-cookie"):
        parse_query("10.0.0.1", "10.96.0.10:80", outside=True, netns_cookie=5)
    args = parse_args(["explain", "10.0.0.1", "10.96.0.10:80", "--netns-cookie", "4097"])
    assert args.netns_cookie == 4097


# ---- IPv6 from outside: NodePort, LoadBalancer with source ranges, affinity ---------------

# bpf/lib/hash.h compiled with gcc (x86_64, a harness filling struct flow6 with inet_pton
# and htons): flow6_hash of the two flows in test_the_ipv6_hash_mirrors_give_the_c_functions_values,
# addr6_fold of their two client addresses.
FLOW6_TCP, FLOW6_UDP = 2324389118, 2031984854
FOLD1, FOLD2 = 13262257714643340288, 288235860892058624

NODE6 = IPv6Address("2001:db8::1")
CLIENT6 = IPv6Address("2001:db8:c::1")
ETH0 = 2


def be6(n: int, local: bool) -> WeightedBackend:
    flags = BackendFlags.LOCAL if local else BackendFlags.NONE
    return WeightedBackend(Backend(IPv6Address(f"fd00:244::{n}"), 8080, Proto.TCP), flags=flags)


ALL6 = (be6(11, True), be6(12, True), be6(21, False), be6(22, False))


@pytest.fixture
def maps6() -> FakeMapSet:
    """An IPv6 NodePort, an IPv6 LoadBalancer IP with an IPv6 source range and an IPv4
    one with its own IPv4 range, the node's addresses of both families on eth0."""
    maps = FakeMapSet()
    lb6 = Frontend(IPv6Address("2001:db8:1b::50"), 80, Proto.TCP)
    lb4 = frontend("192.168.1.50", 80)
    sticky6 = Frontend(NODE6, 30104, Proto.TCP)
    services = {
        "web6": [want("web6", Frontend(NODE6, 30080, Proto.TCP), SvcFlags.NODE_PORT, ALL6)],
        "lb": [
            want(
                "lb",
                lb6,
                SvcFlags.LOADBALANCER | SvcFlags.SOURCE_RANGES,
                ALL6,
                source_ranges=(IPv6Network("2001:db8:c::/48"),),
            ),
            want(
                "lb",
                lb4,
                SvcFlags.LOADBALANCER | SvcFlags.SOURCE_RANGES,
                ALL,
                source_ranges=(IPv4Network("192.168.1.100/32"),),
            ),
        ],
        "sticky6": [
            want(
                "sticky6",
                sticky6,
                SvcFlags.NODE_PORT | SvcFlags.AFFINITY,
                ALL6,
                affinity_timeout=60,
            )
        ],
    }
    result = Reconciler(maps).apply(
        {
            NamespacedName("default", name): {w.frontend: w for w in wants}
            for name, wants in services.items()
        }
    )
    assert not result.errors
    maps.iface_addrs = InterfaceAddresses({ETH0: NODE}, {ETH0: NODE6})
    return maps


def test_the_ipv6_hash_mirrors_give_the_c_functions_values() -> None:
    # Reference values from bpf/lib/hash.h's flow6_hash and addr6_fold compiled with gcc
    # (seed EBPFLB_FLOW_HASH_SEED 0x6562706c): the flows below, built as the C fills them.
    tcp = Flow(AddrPort(CLIENT6, 40000), AddrPort(IPv6Address("2001:db8::10"), 30080), Proto.TCP)
    udp = Flow(
        AddrPort(IPv6Address("fd00:1:2:3:4:5:6:7"), 53),
        AddrPort(IPv6Address("2001:db8:ffff::1"), 5353),
        Proto.UDP,
    )
    assert flow6_hash(tcp, SEED) == FLOW6_TCP
    assert flow6_hash(udp, SEED) == FLOW6_UDP
    assert addr6_fold(CLIENT6) == FOLD1
    assert addr6_fold(IPv6Address("fd00:1:2:3:4:5:6:7")) == FOLD2


def test_an_ipv6_nodeport_packet_gets_the_flow6_hash_slot_and_the_ipv6_snat_source(
    maps6: FakeMapSet,
) -> None:
    entry = maps6.services.data[Frontend(NODE6, 30080, Proto.TCP)]
    table = maps6.slots.read(entry.table_off, entry.table_size)
    seen = set()
    for port in range(40000, 40040):
        query = parse_query(f"[{CLIENT6}]:{port}", f"[{NODE6}]:30080", ingress="eth0")
        ex = explain(maps6, query, SETTINGS)
        flow = Flow(AddrPort(CLIENT6, port), AddrPort(NODE6, 30080), Proto.TCP)
        slot = flow6_hash(flow, SEED) % entry.table_size
        expected = maps6.backends.data[int(table[slot])]
        assert ex.verdict is Verdict.TRANSLATED and ex.backend is not None
        assert ex.selection is not None and ex.selection.slot == slot
        assert "flow6_hash" in ex.selection.hash_inputs
        assert ex.backend.backend == str(expected.backend)
        assert ex.nat is not None and ex.nat.snat == (not expected.flags & BackendFlags.LOCAL)
        if ex.nat.snat:  # ebpflb_ifaddr6's address of eth0, not the IPv4 one
            assert ex.nat.source == str(NODE6) and "IPv6 address" in ex.nat.reason
        seen.add(ex.backend.backend)
    assert len(seen) == 4


def test_ipv6_source_ranges_are_the_ipv6_frontends_own(maps6: FakeMapSet) -> None:
    lb6 = "[2001:db8:1b::50]:80"
    ok = explain(maps6, parse_query(f"[{CLIENT6}]:5555", lb6, outside=True), SETTINGS)
    assert ok.verdict is Verdict.TRANSLATED
    assert "2001:db8:c::/48 (ebpflb_srcrng6)" in ok.steps[1].outcome
    no = explain(maps6, parse_query("[2001:db8:d::1]:5555", lb6, outside=True), SETTINGS)
    assert no.verdict is Verdict.DROPPED and "loadBalancerSourceRanges" in no.reason
    # The IPv4 frontend of the service keeps its own IPv4 range.
    v4 = explain(
        maps6, parse_query("192.168.1.100:5555", "192.168.1.50:80", outside=True), SETTINGS
    )
    assert v4.verdict is Verdict.TRANSLATED and "(ebpflb_srcrng4)" in v4.steps[1].outcome


def test_a_live_ipv6_flow_keeps_its_backend_from_ebpflb_ct6(maps6: FakeMapSet) -> None:
    client, front = AddrPort(CLIENT6, 5555), AddrPort(NODE6, 30080)
    target = AddrPort(IPv6Address("fd00:244::99"), 8080)
    maps6.conntrack.put(
        Flow(client, front, Proto.TCP),
        ConntrackEntry(target, CtFlags.NONE, None, 1, 7, 2 * 10**12, 3, 300),
    )
    assert len(maps6.conntrack6) == 1 and not maps6.conntrack4.data
    query = parse_query(f"[{CLIENT6}]:5555", f"[{NODE6}]:30080", outside=True)
    ex = explain(maps6, query, SETTINGS)
    assert ex.selection is not None and ex.selection.from_conntrack
    assert ex.backend is not None and ex.backend.backend == "[fd00:244::99]:8080"


def test_an_ipv6_client_s_affinity_is_keyed_by_its_folded_address(maps6: FakeMapSet) -> None:
    entry = maps6.services.data[Frontend(NODE6, 30104, Proto.TCP)]
    remote = backend_id(maps6, "fd00:244::22")
    table = affinity_table()
    table.data[AffinityKey(Folded6(addr6_fold(CLIENT6)), entry.svc_id)] = AffinityEntry(
        NOW - 10**9, remote
    )
    query = parse_query(f"[{CLIENT6}]:4000", f"[{NODE6}]:30104", ingress="eth0")
    ex = explain(maps6, query, SETTINGS, table)
    assert ex.affinity is not None and ex.affinity.outcome == "hit"
    assert ex.backend is not None and ex.backend.backend_id == remote
    assert "folded" in ex.affinity.keyed_by and str(CLIENT6) in ex.affinity.keyed_by
    # Another address of the same /64 folds elsewhere: its own (missing) entry.
    other = parse_query("[2001:db8:c::2]:4000", f"[{NODE6}]:30104", ingress="eth0")
    assert explain(maps6, other, SETTINGS, table).affinity.outcome == "miss"  # type: ignore[union-attr]


def test_the_ipv6_affinity_key_is_laid_out_as_the_c_code_stores_it() -> None:
    key = AffinityKey.for_source(CLIENT6, 7)
    raw = encode_key(key)
    assert raw.client == addr6_fold(CLIENT6) == FOLD1 and raw.netns == 2  # AFF_CLIENT_ADDR6
    assert decode_key(raw) == key and not key.netns
    assert AffinityKey.for_source(IPv4Address("192.0.2.1"), 7).kind == 0  # AFF_CLIENT_ADDR4


def test_from_outside_the_two_addresses_are_of_one_family() -> None:
    with pytest.raises(ConfigError, match="one family"):
        parse_query(f"[{CLIENT6}]:4000", "192.168.1.1:30080", outside=True)
    with pytest.raises(ConfigError, match="IPv4-mapped"):
        parse_query("192.168.1.100:4000", "[::ffff:192.168.1.1]:30080", ingress="eth0")
    ok = parse_query(f"[{CLIENT6}]:4000", f"[{NODE6}]:30080", outside=True)
    assert ok.address == NODE6 and ok.path is Path.OUTSIDE


# ---- the per-packet path on pods' interfaces (--from-pod) ----------------------------------


def test_a_pod_packet_to_a_clusterip_is_dnated_by_the_flow_hash_keeping_its_address(
    maps: FakeMapSet,
) -> None:
    entry = maps.services.data[frontend("10.96.0.10", 80)]
    table = maps.slots.read(entry.table_off, entry.table_size)
    client = "10.244.3.7"
    seen = set()
    for port in range(40000, 40040):
        ex = explain(maps, parse_query(f"{client}:{port}", "10.96.0.10:80", pod=True), SETTINGS)
        flow = Flow(
            AddrPort(IPv4Address(client), port), AddrPort(IPv4Address("10.96.0.10"), 80), Proto.TCP
        )
        slot = flow4_hash(flow, SEED) % entry.table_size
        assert ex.verdict is Verdict.TRANSLATED and ex.query.path is Path.POD
        assert ex.backend is not None and ex.backend.backend_id == int(table[slot])
        assert ex.nat is not None and not ex.nat.snat
        seen.add(ex.backend.backend)
    assert len(seen) == 4
    assert "per-packet path" in render_text(ex)


def test_a_pod_landing_on_itself_is_snated_to_the_node(maps: FakeMapSet) -> None:
    entry = maps.services.data[frontend("10.96.0.10", 80)]
    table = maps.slots.read(entry.table_off, entry.table_size)
    # A port whose flow hash picks the client's own address: hairpin.
    for port in range(40000, 41000):
        for client in LOCAL:
            flow = Flow(
                AddrPort(IPv4Address(client), port),
                AddrPort(IPv4Address("10.96.0.10"), 80),
                Proto.TCP,
            )
            picked = maps.backends.data[int(table[flow4_hash(flow, SEED) % entry.table_size])]
            if str(picked.backend.address) == client:
                ex = explain(
                    maps, parse_query(f"{client}:{port}", "10.96.0.10:80", pod=True), SETTINGS
                )
                assert ex.nat is not None and ex.nat.snat and "hairpin" in ex.nat.reason
                assert ex.nat.source == str(NODE)
                return
    raise AssertionError("no port lands a local pod on itself")


def test_a_pod_packet_to_a_clusterip_without_endpoints_is_answered(maps: FakeMapSet) -> None:
    ex = explain(maps, parse_query("10.244.3.7:4000", "10.96.0.99:80", pod=True), SETTINGS)
    assert ex.verdict is Verdict.REJECTED and "ECONNREFUSED" in ex.reason


def test_from_pod_on_the_command_line() -> None:
    args = parse_args(["explain", "10.244.3.7:4000", "10.96.0.10:80", "--from-pod"])
    assert args.from_pod and not args.from_outside
    with pytest.raises(SystemExit):
        parse_args(["explain", "10.244.3.7", "10.96.0.10:80", "--from-pod", "--from-outside"])
