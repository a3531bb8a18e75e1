"""Where the SNAT port range goes: never among the node's ephemeral ports, whose replies
would otherwise be taken for the replies of masqueraded flows (a host connection to a pod
on another node that happens to use a port an earlier NodePort flow was given)."""

from __future__ import annotations

import pytest

from ebpflb.cli import parse_args
from ebpflb.config import Config, place_snat_ports
from ebpflb.errors import ConfigError


@pytest.mark.parametrize(
    ("ephemeral", "placed"),
    [
        ((32768, 60999), (1024, 29999)),  # Linux's default: the larger gap is below
        ((1024, 50000), (50001, 65535)),
        ((40000, 65535), (1024, 29999)),
        ((20000, 40000), (40001, 65535)),
    ],
)
def test_unset_range_takes_the_larger_gap_outside_ephemeral_and_nodeports(
    ephemeral: tuple[int, int], placed: tuple[int, int]
) -> None:
    config = place_snat_ports(Config(), ephemeral)
    assert (config.snat_port_min, config.snat_port_max) == placed


def test_unset_range_with_no_room_names_the_sysctl() -> None:
    with pytest.raises(ConfigError, match=r"ip_local_port_range 1024-65000 leaves fewer than"):
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
