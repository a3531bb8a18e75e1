"""`maps dump` on the fake map set: every section (services, backends, counters, conntrack,
NAT) rendered from typed rows, as JSON and as text, without a kernel."""

from __future__ import annotations

import json
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import numpy as np
import pytest

from ebpflb.datapath.contract import Counter, CtFlags, NatFlags
from ebpflb.datapath.maps import (
    AddrPort,
    BackendEntry,
    ConntrackEntry,
    Flow,
    NatEntry,
    ServiceEntry,
    SourceRange,
    dump,
)
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.errors import ConfigError
from ebpflb.model import Backend, BackendFlags, Frontend, Proto, SvcFlags

NOW = 5_000_000_000_000  # CLOCK_MONOTONIC ns, injected
CLIENT = AddrPort(IPv4Address("198.51.100.7"), 40001)
NODE = IPv4Address("192.168.1.10")
LB_IP = IPv4Address("203.0.113.1")


def ip(text: str) -> IPv4Address:
    return IPv4Address(text)


@pytest.fixture
def maps() -> FakeMapSet:
    return filled_maps()


def filled_maps() -> FakeMapSet:
    maps = FakeMapSet(slot_pool_size=64)
    web = Backend(ip("10.244.1.11"), 8080, Proto.TCP)
    remote = Backend(ip("10.244.2.21"), 8080, Proto.TCP)
    maps.backends.put(1, BackendEntry(web, BackendFlags.LOCAL))
    maps.backends.put(2, BackendEntry(remote))
    maps.slots.write(0, np.array([1, 2, 1, 2, 2], dtype=np.uint32))
    maps.services.put(
        Frontend(ip("10.96.0.10"), 80, Proto.TCP), ServiceEntry(7, 0, 5, 2, SvcFlags.CLUSTER_IP)
    )
    maps.services.put(
        Frontend(LB_IP, 80, Proto.TCP),
        ServiceEntry(8, 0, 5, 2, SvcFlags.LOADBALANCER | SvcFlags.SOURCE_RANGES),
    )
    maps.services.put(
        Frontend(ip("10.96.0.99"), 53, Proto.UDP), ServiceEntry(9, 0, 0, 0, SvcFlags.CLUSTER_IP)
    )
    for svc_id, name in ((7, "default/web:http"), (8, "default/web:http"), (9, "x/dns:dns")):
        maps.service_meta.put(svc_id, name)
    maps.source_ranges.put(SourceRange(8, IPv4Network("198.51.100.0/24")), 1)
    frontend = AddrPort(LB_IP, 80)
    snat = AddrPort(NODE, 40123)
    maps.conntrack.put(
        Flow(CLIENT, frontend, Proto.TCP),
        ConntrackEntry(
            backend=AddrPort(remote.address, remote.port),
            flags=CtFlags.SNAT | CtFlags.REPLY_SEEN | CtFlags.ESTABLISHED,
            snat=snat,
            svc_id=8,
            backend_id=2,
            expires_ns=NOW + 21_600_000_000_000,
            packets=12,
            bytes=3456,
        ),
    )
    maps.reply_nat.put(
        Flow(AddrPort(remote.address, remote.port), snat, Proto.TCP),
        NatEntry(CLIENT, frontend, NatFlags.SNAT, NOW + 21_600_000_000_000),
    )
    maps.reply_nat.put(
        Flow(AddrPort(web.address, web.port), AddrPort(ip("198.51.100.8"), 5000), Proto.TCP),
        NatEntry(AddrPort(ip("198.51.100.8"), 5000), frontend, NatFlags.NONE, NOW - 1_500_000_000),
    )
    maps.stats[Counter.NP_NEW_FLOW] = 2
    maps.stats[Counter.SNAT_EXHAUSTED] = 1
    return maps


def test_json_has_every_section_from_typed_rows(maps: FakeMapSet) -> None:
    report = json.loads(json.dumps(dump.collect(maps, now_ns=NOW)))  # JSON-serialisable
    services = {s["frontend"]: s for s in report["services"]}
    assert list(services) == ["10.96.0.10:80/TCP", "10.96.0.99:53/UDP", "203.0.113.1:80/TCP"]
    web = services["10.96.0.10:80/TCP"]
    assert web["service"] == "default/web:http" and web["type"] == "ClusterIP"
    assert web["backends"] == [
        {"address": "10.244.1.11:8080", "slots": 2, "id": 1, "flags": ["local"]},
        {"address": "10.244.2.21:8080", "slots": 3, "id": 2},
    ]
    assert "flags" not in web and "source_ranges" not in web
    lb = services["203.0.113.1:80/TCP"]
    assert lb["type"] == "LoadBalancer" and lb["flags"] == ["source_ranges"]
    assert lb["source_ranges"] == ["198.51.100.0/24"]
    assert services["10.96.0.99:53/UDP"]["backends"] == []
    assert report["backends"] == [
        {"id": 1, "address": "10.244.1.11:8080", "protocol": "TCP", "flags": ["local"]},
        {"id": 2, "address": "10.244.2.21:8080", "protocol": "TCP"},
    ]
    assert report["summary"] == {
        "frontends": 3,
        "backends": 2,
        "slots_used": 10,
        "slot_pool_size": 64,
        "slot_memory_bytes": 40,
    }
    assert report["counters"]["np_new_flow"] == 2 and report["counters"]["snat_exhausted"] == 1
    assert set(report["counters"]) == {c.label for c in Counter}
    assert report["conntrack"] == [
        {
            "proto": "TCP",
            "client": "198.51.100.7:40001",
            "frontend": "203.0.113.1:80",
            "backend": "10.244.2.21:8080",
            "snat": "192.168.1.10:40123",
            "flags": ["snat", "reply_seen", "established"],
            "svc_id": 8,
            "expires_in": 21600.0,
            "packets": 12,
            "bytes": 3456,
        }
    ]
    assert report["nat"] == [
        {
            "proto": "TCP",
            "backend": "10.244.1.11:8080",
            "reply_to": "198.51.100.8:5000",
            "client": "198.51.100.8:5000",
            "frontend": "203.0.113.1:80",
            "snat": False,
            "expires_in": -1.5,
        },
        {
            "proto": "TCP",
            "backend": "10.244.2.21:8080",
            "reply_to": "192.168.1.10:40123",
            "client": "198.51.100.7:40001",
            "frontend": "203.0.113.1:80",
            "snat": True,
            "expires_in": 21600.0,
        },
    ]


def test_tables_list_every_slot(maps: FakeMapSet) -> None:
    report = dump.collect(maps, tables=True, now_ns=NOW)
    web = report["services"][0]
    assert web["maglev"]["table"] == [
        "10.244.1.11:8080",
        "10.244.2.21:8080",
        "10.244.1.11:8080",
        "10.244.2.21:8080",
        "10.244.2.21:8080",
    ]
    assert "table" not in report["services"][1]["maglev"]  # refusing: no table


def test_flows_are_limited_and_can_be_left_out(maps: FakeMapSet) -> None:
    assert len(dump.collect(maps, flows=1, now_ns=NOW)["nat"]) == 1
    report = dump.collect(maps, flows=0, now_ns=NOW)
    assert report["conntrack"] == [] and report["nat"] == []


EXPECTED_TEXT = """\
FRONTEND            SERVICE           TYPE                                                 SLOTS  BACKEND (SLOTS)
10.96.0.10:80/TCP   default/web:http  ClusterIP                                            5      10.244.1.11:8080 (2) [local]
                                                                                                  10.244.2.21:8080 (3)
10.96.0.99:53/UDP   x/dns:dns         ClusterIP                                            0      (no usable endpoint: refusing)
203.0.113.1:80/TCP  default/web:http  LoadBalancer [source_ranges] (from 198.51.100.0/24)  5      10.244.1.11:8080 (2) [local]
                                                                                                  10.244.2.21:8080 (3)

3 frontends, 2 backends, 10 of 64 slots used (0.0 KiB)
datapath: np_new_flow=2, snat_exhausted=1

CONNTRACK (NodePort/LoadBalancer/external IP flows)
TCP 198.51.100.7:40001 -> 203.0.113.1:80 => 10.244.2.21:8080 snat 192.168.1.10:40123 [snat,reply_seen,established] expires=21600.0s packets=12 bytes=3456

NAT (reply tuple -> client view)
TCP 10.244.1.11:8080 -> 198.51.100.8:5000 => 203.0.113.1:80 -> 198.51.100.8:5000 expires=-1.5s
TCP 10.244.2.21:8080 -> 192.168.1.10:40123 => 203.0.113.1:80 -> 198.51.100.7:40001 snat expires=21600.0s"""  # noqa: E501


def test_text(maps: FakeMapSet) -> None:
    """One line per backend, the frontend's columns on its first; counters that are not
    zero; then the flows."""
    assert dump.render_text(dump.collect(maps, now_ns=NOW)) == EXPECTED_TEXT


def test_text_of_empty_maps() -> None:
    text = dump.render_text(dump.collect(FakeMapSet(slot_pool_size=64), now_ns=NOW))
    assert text.splitlines() == [
        "FRONTEND  SERVICE  TYPE  SLOTS  BACKEND (SLOTS)",
        "",
        "0 frontends, 0 backends, 0 of 64 slots used (0.0 KiB)",
    ]


def test_a_service_selection_keeps_only_its_rows_in_every_section(maps: FakeMapSet) -> None:
    select = dump.Selection.parse(service="default/web")
    report = dump.collect(maps, now_ns=NOW, select=select)
    assert [s["frontend"] for s in report["services"]] == [
        "10.96.0.10:80/TCP",
        "203.0.113.1:80/TCP",
    ]
    assert [b["address"] for b in report["backends"]] == ["10.244.1.11:8080", "10.244.2.21:8080"]
    assert len(report["conntrack"]) == 1 and len(report["nat"]) == 2  # all web's (the LB IP)
    assert "counters" not in report  # datapath-wide, not the service's
    assert report["selection"] == {"service": "default/web", "frontend": None}
    assert report["summary"]["frontends"] == 2

    dns = dump.collect(maps, now_ns=NOW, select=dump.Selection.parse(service="x/dns"))
    assert [s["service"] for s in dns["services"]] == ["x/dns:dns"]
    assert dns["backends"] == [] and dns["conntrack"] == [] and dns["nat"] == []
    # A name that only starts like another service's is another service.
    assert dump.collect(maps, select=dump.Selection.parse(service="default/we"))["services"] == []


def test_a_frontend_selection_keeps_that_frontend_and_its_flows(maps: FakeMapSet) -> None:
    cluster_ip = dump.collect(
        maps, now_ns=NOW, select=dump.Selection.parse(frontend="10.96.0.10:80/TCP")
    )
    assert [s["frontend"] for s in cluster_ip["services"]] == ["10.96.0.10:80/TCP"]
    assert len(cluster_ip["backends"]) == 2
    assert cluster_ip["conntrack"] == [] and cluster_ip["nat"] == []  # socket-LB: no flows
    lb = dump.collect(maps, now_ns=NOW, select=dump.Selection.parse(frontend="203.0.113.1:80/TCP"))
    assert [s["frontend"] for s in lb["services"]] == ["203.0.113.1:80/TCP"]
    assert [f["svc_id"] for f in lb["conntrack"]] == [8] and len(lb["nat"]) == 2
    udp = dump.collect(maps, select=dump.Selection.parse(frontend="203.0.113.1:80/UDP"))
    assert udp["services"] == [] and udp["nat"] == []


def test_a_selection_renders_as_text_saying_so(maps: FakeMapSet) -> None:
    text = dump.render_text(dump.collect(maps, now_ns=NOW, select=dump.Selection.parse("x/dns")))
    assert text.splitlines()[1].startswith("10.96.0.99:53/UDP  x/dns:dns  ClusterIP")
    assert "(only service x/dns: datapath counters left out)" in text
    assert "datapath:" not in text and "CONNTRACK" not in text


@pytest.mark.parametrize(
    ("service", "frontend"),
    [("web", None), ("a/b/c", None), (None, "10.96.0.10"), (None, "10.96.0.10:x/TCP"),
     (None, "10.96.0.10:80/SCTP"), (None, "10.96.0.10:0/TCP"), (None, "web:80/TCP")],
)  # fmt: skip
def test_a_malformed_selection_names_the_flag(service: str | None, frontend: str | None) -> None:
    with pytest.raises(ConfigError, match="--service" if service else "--frontend"):
        dump.Selection.parse(service, frontend)


def test_ipv6_flows_and_nat_entries_are_shown_after_the_ipv4_ones(maps: FakeMapSet) -> None:
    """ebpflb_ct6 and ebpflb_rnat6 next to their IPv4 twins: IPv6 rows after IPv4 ones
    (addresses of two families never compared), selected by their IPv6 frontend."""
    lb6 = AddrPort(IPv6Address("2001:db8:1b::1"), 80)
    client6 = AddrPort(IPv6Address("2001:db8:c::7"), 40001)
    backend6 = AddrPort(IPv6Address("fd00:244::21"), 8080)
    snat6 = AddrPort(IPv6Address("2001:db8::10"), 40123)
    maps.backends.put(3, BackendEntry(Backend(backend6.address, backend6.port, Proto.TCP)))
    maps.services.put(
        Frontend(lb6.address, 80, Proto.TCP),
        ServiceEntry(10, 6, 1, 1, SvcFlags.LOADBALANCER | SvcFlags.SOURCE_RANGES),
    )
    maps.slots.write(6, np.array([3], dtype=np.uint32))
    maps.service_meta.put(10, "default/web6:http")
    maps.source_ranges.put(SourceRange(10, IPv6Network("2001:db8:c::/48")), 1)
    maps.conntrack.put(
        Flow(client6, lb6, Proto.TCP),
        ConntrackEntry(backend6, CtFlags.SNAT, snat6, 10, 3, NOW + 10**9, 1, 80),
    )
    maps.reply_nat.put(
        Flow(backend6, snat6, Proto.TCP), NatEntry(client6, lb6, NatFlags.SNAT, NOW + 10**9)
    )
    assert len(maps.conntrack6) == 1 and len(maps.reply_nat6) == 1
    report = dump.collect(maps, now_ns=NOW)
    assert [f["client"] for f in report["conntrack"]] == [str(CLIENT), f"[{client6.address}]:40001"]
    six = report["conntrack"][1]
    assert six["backend"] == "[fd00:244::21]:8080" and six["snat"] == "[2001:db8::10]:40123"
    assert report["nat"][-1]["client"] == "[2001:db8:c::7]:40001"
    lb = next(s for s in report["services"] if s["svc_id"] == 10)
    assert lb["source_ranges"] == ["2001:db8:c::/48"]
    text = dump.render_text(report)
    assert "TCP [2001:db8:c::7]:40001 -> [2001:db8:1b::1]:80 => [fd00:244::21]:8080" in text
    selected = dump.collect(
        maps, now_ns=NOW, select=dump.Selection.parse(frontend="[2001:db8:1b::1]:80/TCP")
    )
    assert [f["svc_id"] for f in selected["conntrack"]] == [10]
    assert [n["frontend"] for n in selected["nat"]] == ["[2001:db8:1b::1]:80"]
