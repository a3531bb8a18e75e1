"""Which interfaces get the per-packet ClusterIP path (ebpflb/datapath/programs/podlb.py),
and the --pod-interfaces and --socket-lb options."""

from __future__ import annotations

import pytest

from ebpflb.cli import parse_args
from ebpflb.config import SocketLbScope
from ebpflb.datapath.programs import podlb
from ebpflb.datapath.programs.netdev import Interface


def links(*names: str) -> list[Interface]:
    return [Interface(name, index, ()) for index, name in enumerate(names, start=1)]


def test_patterns_pick_pods_host_side_interfaces_and_never_the_loopback() -> None:
    found = podlb.matching(links("lo", "eth0", "veth1a2b", "cali77", "lxc0", "vxlan.calico"),
                           ("veth*", "cali*", "lxc*", "l*"))  # fmt: skip
    assert [link.name for link in found] == ["veth1a2b", "cali77", "lxc0"]


def test_no_pattern_matches_nothing() -> None:
    assert podlb.matching(links("veth0", "eth0"), ()) == []


def test_pod_interfaces_option_takes_a_comma_list_and_defaults_to_common_cnis() -> None:
    default = parse_args(["run", "--manifests", "x"]).pod_interfaces
    assert {"veth*", "cali*", "lxc*", "eni*", "gke*", "azv*"} == set(default)
    args = parse_args(["run", "--manifests", "x", "--pod-interfaces", "veth*,cali*"])
    assert args.pod_interfaces == ("veth*", "cali*")
    assert parse_args(["run", "--manifests", "x", "--pod-interfaces="]).pod_interfaces == ()


def test_socket_lb_scope_option_and_its_refusal_of_other_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse_args(["run", "--manifests", "x"]).socket_lb is SocketLbScope.ALL
    args = parse_args(["run", "--manifests", "x", "--socket-lb", "hostns-only"])
    assert args.socket_lb is SocketLbScope.HOSTNS_ONLY
    with pytest.raises(SystemExit):
        parse_args(["run", "--manifests", "x", "--socket-lb", "pods"])
    assert "--socket-lb" in capsys.readouterr().err
