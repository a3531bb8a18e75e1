"""Where the SNAT port range goes: never among the node's ephemeral ports, whose replies
would otherwise be taken for the replies of masqueraded flows (a host connection to a pod
on another node that happens to use a port an earlier NodePort flow was given)."""

from __future__ import annotations

import pytest

from ebpflb.cli import parse_args
from ebpflb.config import Config, place_snat_ports
from ebpflb.errors import ConfigError


def test_unset_range_goes_above_the_ephemeral_ports() -> None:
    placed = place_snat_ports(Config(), (32768, 60999))
    assert (placed.snat_port_min, placed.snat_port_max) == (61000, 65535)
    placed = place_snat_ports(Config(), (1024, 50000))
    assert (placed.snat_port_min, placed.snat_port_max) == (50001, 65535)


def test_unset_range_with_no_room_above_names_the_sysctl() -> None:
    with pytest.raises(ConfigError, match=r"ip_local_port_range 1024-65000 leaves 535 ports"):
        place_snat_ports(Config(), (1024, 65000))


@pytest.mark.parametrize("given", [(40000, 40063), (30000, 32768), (60999, 65535)])
def test_given_range_overlapping_is_refused(given: tuple[int, int]) -> None:
    config = Config(snat_port_min=given[0], snat_port_max=given[1], snat_port_auto=False)
    with pytest.raises(ConfigError, match=rf"snat-port-range {given[0]}-{given[1]} overlaps"):
        place_snat_ports(config, (32768, 60999))


@pytest.mark.parametrize("given", [(61000, 61063), (20000, 32767)])
def test_given_range_outside_is_kept(given: tuple[int, int]) -> None:
    config = Config(snat_port_min=given[0], snat_port_max=given[1], snat_port_auto=False)
    assert place_snat_ports(config, (32768, 60999)) is config


def test_the_flag_marks_the_range_as_given() -> None:
    args = parse_args(["run", "--manifests", "x", "--snat-port-range", "61000-61099"])
    assert args.snat_port_range == (61000, 61099)
    assert parse_args(["run", "--manifests", "x"]).snat_port_range is None
