"""Frames whose headers sit in page fragments are translated like any other.

An skb need not hold its headers in its linear data: AF_PACKET's TX_RING (trafgen, the
packet generator `ebpflb bench pps` uses) builds each frame from pages of the ring, and so
can a NIC driver that splits headers or a tun/tap device. A tc program then reaches only
the Ethernet header by direct access. ebpflb's NodePort programs parsed such a frame as too
short and passed it on untranslated, so the node delivered it to itself: a UDP flood from
trafgen through a NodePort reached no backend. They now pull the headers they parse into
the linear data first (bpf_skb_pull_data, only when they are not there).

Through the real agent on the bench topology: COUNT frames from the external namespace
through trafgen's TX_RING to the UDP NodePort must all reach the backends translated, each
counted by an nftables netdev chain at the backends' ingress.
"""

from __future__ import annotations

import time

import pytest

from lab.bench import pktgen, pps
from lab.bench.modes import ebpflb_agent
from lab.bench.scenario import Family
from lab.bench.settings import Mode, PpsSettings

pytestmark = pytest.mark.kernel

COUNT = 32
WAIT_S = 10.0


@pytest.mark.parametrize("family", list(Family), ids=str)
def test_nodeport_translates_frames_with_paged_headers(family: Family) -> None:
    if not pktgen.available():
        pytest.fail("trafgen not found: `make setup` installs netsniff-ng")
    settings = PpsSettings(family=family, quiet_timeout=5)
    services = pps.udp_services(settings)
    with (
        pps.network(settings) as topo,
        ebpflb_agent(topo, services, memory=None, xdp=False),
    ):
        config = pps.frames(topo, Mode.EBPFLB, settings)
        pktgen.send(topo.external, "eth0", config, COUNT)
        deadline = time.monotonic() + WAIT_S
        while (counts := pps.sink_counts(topo))[0] < COUNT and time.monotonic() < deadline:
            time.sleep(0.1)
    delivered, misdelivered = counts
    assert (delivered, misdelivered) == (COUNT, 0), (
        f"{COUNT} frames sent through the NodePort: {delivered} reached the backends"
        f" translated, {misdelivered} at another port"
    )
