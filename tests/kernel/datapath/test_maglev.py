"""Maglev tables in the kernel: what the pinned slot pool holds is exactly the module's
table, and socket-LB traffic follows the slots (here made unequal with weights)."""

from __future__ import annotations

import collections
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from ebpflb import maglev
from ebpflb.config import Config
from ebpflb.datapath.maps.kernel import KernelMapSet
from ebpflb.datapath.programs import loader
from ebpflb.desired import DesiredFrontend, WeightedBackend
from ebpflb.model import Backend, Frontend, NamespacedName, Proto, ServicePortName, SvcFlags
from ebpflb.reconcile import Reconciler
from lab.harness.netns import Cgroup, Topology
from tests.kernel.conftest import PODS, TCP_PORT

VIP = Frontend(IPv4Address("10.96.0.10"), 80, Proto.TCP)
WEIGHTS = {"pod1": 1, "pod2": 2, "pod3": 5}
OWNER = NamespacedName("default", "weighted")


@pytest.fixture
def programmed(bpffs: Path, cgroup: Cgroup) -> Iterator[KernelMapSet]:
    """The real socket-LB programs on the test cgroup, maps written by the reconciler."""
    socket_lb = loader.SocketLB(Config(bpffs_dir=bpffs, cgroup_dir=cgroup.path))
    try:
        socket_lb.attach(cgroup.path)
        with KernelMapSet(bpffs) as maps:
            want = DesiredFrontend(
                VIP,
                ServicePortName(OWNER, "http", Proto.TCP),
                SvcFlags.CLUSTER_IP,
                tuple(
                    WeightedBackend(Backend(IPv4Address(PODS[pod]), TCP_PORT, Proto.TCP), weight)
                    for pod, weight in WEIGHTS.items()
                ),
            )
            result = Reconciler(maps).apply({OWNER: {VIP: want}})
            assert result.errors == []
            yield maps
    finally:
        socket_lb.close()


def dump_tables(bpffs: Path) -> dict[str, dict[str, object]]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ebpflb",
            "maps",
            "dump",
            "--json",
            "--tables",
            "--bpffs",
            str(bpffs),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return {s["frontend"]: s for s in json.loads(done.stdout)["services"]}


def test_pinned_table_is_the_modules_table(programmed: KernelMapSet, bpffs: Path) -> None:
    dumped = dump_tables(bpffs)[str(VIP)]["maglev"]
    assert isinstance(dumped, dict)
    size = dumped["table_size"]
    assert size == maglev.table_size_for(len(WEIGHTS))
    expected = maglev.build_table(
        {f"{PODS[pod]}:{TCP_PORT}": weight for pod, weight in WEIGHTS.items()}, size
    )
    assert dumped["table"] == [expected.backends[i] for i in expected.slots]


def test_traffic_follows_the_slots(
    programmed: KernelMapSet, bpffs: Path, topology: Topology, cgroup: Cgroup
) -> None:
    table = dump_tables(bpffs)[str(VIP)]
    slots = {b["address"]: b["slots"] for b in table["backends"]}  # type: ignore[union-attr]
    size = sum(slots.values())
    n = 800
    results = topology.requests(topology.node_ns, "tcp", f"{VIP.address}:{VIP.port}", n, cgroup)
    assert all(r["ok"] for r in results)
    served = collections.Counter(str(r["server"]) for r in results)
    for pod in WEIGHTS:
        share = slots[f"{PODS[pod]}:{TCP_PORT}"] / size
        # connect() picks a uniformly random slot: a binomial count per backend. Five
        # standard deviations: a correct datapath fails this about once in 10^6 runs,
        # while equal shares (1/3 each) would miss pod3's 5/8 by over 20 deviations.
        sigma = math.sqrt(n * share * (1 - share))
        assert abs(served[pod] - n * share) < 5 * sigma, (pod, served, slots)
