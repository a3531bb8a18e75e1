"""`ebpflb bench compare --family ipv6` without a kernel: the IPv6 services the bench
serves (and that ebpflb's own translator reads as such), the option, the report's record
of the family, and a NodePort figure the run could not measure: "-" in the table, the
reason in the report, "not measured" verdicts instead of judged ones."""

from __future__ import annotations

import dataclasses
import json
from ipaddress import IPv6Address, ip_address

import pytest

from ebpflb.cli import parse_args
from ebpflb.k8s.translate import translate_service, translate_slice
from lab.bench import command, scenario, targets
from lab.bench.manifests import documents
from lab.bench.records import codec
from lab.bench.records.compare import CompareRun, DataPlane, SizeResult
from lab.bench.render import render
from lab.bench.scenario import PLANS, Family
from lab.bench.settings import CompareSettings, Mode
from tests.unit.lab.bench.test_report import MACHINE, size

V6 = Family.IPV6


def test_ipv6_addresses_follow_the_ipv4_arithmetic() -> None:
    services = scenario.bench_services(5, 3, family=V6)
    assert services[0].vip == "fd00:96::1" and services[4].vip == "fd00:96::5"
    assert services[1].endpoints == ("fd00:128::2", "fd00:128::2:2", "fd00:128::4:2")
    plan = PLANS[V6]
    last = scenario.bench_services(scenario.MAX_SERVICES, scenario.MAX_ENDPOINTS, family=V6)[-1]
    assert ip_address(last.vip) in plan.service_cidr
    assert all(ip_address(ip) in plan.endpoint_cidr for ip in last.endpoints)
    assert len(set(last.endpoints)) == scenario.MAX_ENDPOINTS
    # The IPv4 plan is the one the published figures were measured with.
    assert scenario.bench_services(1, 2)[0].endpoints == ("10.128.0.1", "10.130.0.1")


def test_ipv6_objects_are_single_stack_ipv6_for_the_agent() -> None:
    services = scenario.bench_services(3, 3, family=V6)
    svc = services[-1]  # the NodePort service
    spec = scenario.service_object(svc)["spec"]
    assert spec["ipFamilies"] == ["IPv6"] and spec["ipFamilyPolicy"] == "SingleStack"
    assert spec["clusterIPs"] == [svc.vip] == [spec["clusterIP"]]
    assert scenario.slice_object(svc)["addressType"] == "IPv6"
    service = translate_service(scenario.service_object(svc))
    assert service.skipped is None
    (port,) = service.ports.values()
    assert port.cluster_ips == (IPv6Address(svc.vip),)
    assert port.node_port == scenario.NODE_PORT  # programmed on the node's IPv6 address
    slice_ = translate_slice(scenario.slice_object(svc, not_ready=1))
    assert slice_.skipped is None and slice_.family == 6
    # The manifest file (bench sync --source manifests) carries the same objects.
    text = documents(services)[-2]
    assert "  ipFamilies:\n  - IPv6\n" in text and f"  - {svc.vip}\n" in text
    assert "addressType: IPv6" in documents(services)[-1]


def test_family_option() -> None:
    def parse(*argv: str) -> CompareSettings:
        args = parse_args(["bench", *argv])
        return command.compare_settings(args)

    assert parse("--quick").family is Family.IPV4
    assert parse("--quick", "--family", "ipv6").family is V6
    with pytest.raises(SystemExit):
        parse("--family", "ipv5")


def _ipv6_run(reason: str | None) -> CompareRun:
    """A run whose ebpflb NodePort figures are missing for `reason` (None: measured)."""
    base = size(1000)
    modes = []
    for result in base.modes:
        if result.mode in (Mode.EBPFLB, Mode.EBPFLB_XDP) and reason:
            result = dataclasses.replace(
                result,
                data=dataclasses.replace(result.data, nodeport=None, nodeport_not_measured=reason),
            )
        modes.append(result)
    sizes = (SizeResult(base.services, tuple(modes)),)
    settings = CompareSettings(services=(1000,), family=V6)
    return CompareRun(MACHINE, settings, sizes, 1.0, (), targets.judge(sizes))


REASON = "ebpflb does not program NodePorts over IPv6 yet: [fd00:240::1]:30080"


def test_a_nodeport_not_measured_is_said_not_judged() -> None:
    run = _ipv6_run(REASON)
    nodeport = [v for v in run.targets if "NodePort" in v.target]
    assert {v.target for v in nodeport} == {
        "NodePort via tc at least as fast as iptables-legacy",
        "NodePort via tc at least as fast as nftables",
        "NodePort via XDP measurably faster than tc",
    }
    assert all(v.ok is None and v.outcome == "not measured" for v in nodeport)
    assert all(v.detail == REASON for v in nodeport)
    # The other targets are judged as in any run.
    assert all(v.ok is not None for v in run.targets if v not in nodeport)
    measured = _ipv6_run(None)
    assert all(v.ok is not None for v in measured.targets)


def test_the_report_keeps_the_family_and_the_reason() -> None:
    run = _ipv6_run(REASON)
    again = codec.from_json(json.loads(codec.to_json(run)))
    assert again == run
    assert isinstance(again, CompareRun) and again.settings.family is V6
    ebpflb = again.sizes[0].get(Mode.EBPFLB)
    assert ebpflb is not None and ebpflb.data == DataPlane(
        ebpflb.data.latency, ebpflb.data.connections, None, REASON
    )
    text = render(again)
    assert "; ipv6;" in text.splitlines()[0]
    # The address in the reason survives rich's markup (brackets are its tags).
    where = "ebpflb at 1,000, ebpflb-xdp at 1,000"
    assert f"NodePort not measured ({where}): {REASON}" in " ".join(text.split())
    ebpflb_rows = [line for line in text.splitlines() if "│ ebpflb " in line]
    assert ebpflb_rows and ebpflb_rows[0].rstrip(" │").endswith("-")


def test_reports_without_a_family_are_ipv4() -> None:
    data = json.loads(codec.to_json(_ipv6_run(None)))
    del data["settings"]["family"]
    report = codec.from_json(data)
    assert isinstance(report, CompareRun) and report.settings.family is Family.IPV4
