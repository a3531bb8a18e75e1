"""The Maglev slot pool and NodePort conntrack start small and grow (issue 15, "Kernel
memory that follows the cluster"): connections to a Service keep being translated while
Services added past the pool's initial size make the agent swap in larger pools; NodePort
flows made before a conntrack grow keep their translation after it; the grows are counted;
a restarted agent adopts the grown pool and rewrites nothing.

State is read from the pins (`maps dump --json`), the kernel's map info and /metrics,
never from the log."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import numpy as np
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether

from ebpflb.config import Config
from ebpflb.datapath import contract
from ebpflb.datapath.contract import MapName
from ebpflb.datapath.maps import growable
from ebpflb.datapath.maps.elementio import ElementIO
from ebpflb.datapath.maps.pins import drop_incompatible, ensure_bpffs
from ebpflb.datapath.syscall import bpfsys
from lab.harness.connload import Load
from lab.harness.netns import Cgroup, Topology
from tests.kernel.conftest import PODS, AgentFactory, served_by
from tests.kernel.datapath.test_capacity import dump, wait_for
from tests.kernel.nodeport import packet_cases as pc
from tests.kernel.nodeport.packet_cases import Program
from tests.kernel.nodeport.packet_runner import build, open_datapath

WEB = "10.96.0.10:80"
ADDED = 12  # Services of 3 endpoints: 510 slots each, 7,140 with the examples' two
INITIAL, LIMIT = 1024, 16384  # slots; the examples' two tables fill 1024
NEEDED = (2 + ADDED) * 510
RATE = 300.0


def services(count: int) -> str:
    """default/grow-N at 10.96.1.N, each with the three pods as endpoints."""
    docs = []
    for n in range(1, count + 1):
        endpoints = "".join(
            f'  - addresses: ["{ip}"]\n    conditions: {{ready: true}}\n' for ip in PODS.values()
        )
        docs.append(
            f"apiVersion: v1\nkind: Service\nmetadata: {{name: grow-{n}, namespace: default}}\n"
            f"spec: {{clusterIP: 10.96.1.{n}, ports: [{{name: http, port: 80,"
            " targetPort: 8080}]}\n"
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
            f"metadata:\n  name: grow-{n}-1\n  namespace: default\n"
            f"  labels: {{kubernetes.io/service-name: grow-{n}}}\n"
            "addressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n" + endpoints
        )
    return "---\n".join(docs)


def pool_pairs(bpffs: Path) -> tuple[int, int]:
    """(max_entries of the pinned pool, id of the pool the programs' ref map holds)."""
    return pool_pairs_of(bpffs, MapName.SLOTS)


def test_the_pool_grows_under_traffic_and_a_restart_adopts_it(
    topology: Topology, cgroup: Cgroup, manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    args = ("--manifests", str(manifests), "--slot-pool-initial", str(INITIAL))
    args += ("--maglev-max-table-size", "1021")  # it must fit in the limit
    agent = start_agent(*args, "--slot-pool-size", str(LIMIT))
    assert pool_pairs(bpffs)[0] == INITIAL // 2
    scrape = agent.metrics()
    assert scrape.value("ebpflb_map_capacity", map="ebpflb_slots") == INITIAL
    assert not scrape.value("ebpflb_map_grows_total", map="ebpflb_slots")

    load = Load(topology, topology.node_ns, cgroup, WEB, seconds=6, rate=RATE)
    (manifests / "grow.yaml").write_text(services(ADDED))
    wait_for(lambda: len(dump(bpffs)) >= 3 + ADDED, timeout=30)
    result = load.result()
    assert not result["failures"], result
    assert result["ok"] >= RATE * 6 * 0.8 and set(result["servers"]) == set(PODS)

    pairs, pool_id = pool_pairs(bpffs)
    # By a quarter at a time, in steps of 1024: 1024, 2048, 3072, 4096, 5120, 7168.
    assert NEEDED <= pairs * 2 <= NEEDED * 5 // 4 + 1024 < LIMIT
    scrape = agent.metrics()
    assert scrape.value("ebpflb_map_capacity", map="ebpflb_slots") == pairs * 2
    assert scrape.value("ebpflb_map_grows_total", map="ebpflb_slots") == 5
    for n in (1, ADDED):  # tables written before and after the last grow
        counts = served_by(topology.requests(topology.node_ns, "tcp", f"10.96.1.{n}:80", 9, cgroup))
        assert set(counts) <= set(PODS) and sum(counts.values()) == 9

    # A restart opens the grown pool from the pins: same map, same size, nothing rewritten.
    before = dump(bpffs)
    assert agent.stop() == 0
    second = start_agent(*args, "--slot-pool-size", str(LIMIT))
    assert pool_pairs(bpffs) == (pairs, pool_id)
    first = second.status()["sync"]["first"]
    assert (first["added"], first["updated"], first["removed"]) == (0, 0, 0)
    assert not second.metrics().value("ebpflb_map_grows_total", map="ebpflb_slots")
    assert dump(bpffs) == before
    counts = served_by(topology.requests(topology.node_ns, "tcp", WEB, 9, cgroup))
    assert sum(counts.values()) == 9


def test_an_older_pool_is_copied_into_a_growable_one(bpffs: Path) -> None:
    """Upgrading from an ebpflb whose pool was a plain pinned array: its tables are copied
    into the growable pool pinned in its place, which the ref map then holds, so the new
    programs read the tables the service entries name before the first sync."""
    config = Config(bpffs_dir=bpffs, slot_pool_initial=1024, slot_pool_size=1 << 20)
    ensure_bpffs(bpffs)
    spec = contract.MAPS[MapName.SLOTS]
    old = bpfsys.map_create(
        int(spec.type), 4, 8, 1 << 17, "an old pool", flags=contract.BPF_F_MMAPABLE
    )
    try:
        with mmap.mmap(old, (1 << 17) * 8) as memory:
            slots = np.frombuffer(memory, dtype=np.uint32)
            slots[: 1 << 18] = np.arange(1 << 18, dtype=np.uint32)
            del slots
        bpfsys.obj_pin(old, str(bpffs / MapName.SLOTS.value))
    finally:
        os.close(old)
    drop_incompatible(config)
    growable.ensure(config)
    pairs, _ = pool_pairs(bpffs)
    assert pairs == 1 << 17  # the old pool's size, not the initial one
    fd = bpfsys.obj_get(str(bpffs / MapName.SLOTS.value))
    try:
        info = bpfsys.map_info(fd, "pool")
        assert info.flags == contract.BPF_F_MMAPABLE | contract.BPF_F_INNER_MAP
        with mmap.mmap(fd, pairs * 8) as memory:
            copied = np.frombuffer(memory, dtype=np.uint32)
            assert np.array_equal(copied, np.arange(1 << 18, dtype=np.uint32))
            del copied
    finally:
        os.close(fd)


FLOWS = 4200  # SNATed NodePort flows: more than half of the 8,192-entry initial table


def test_conntrack_grows_and_every_flow_keeps_its_translation() -> None:
    """NodePort flows made before a conntrack grow go on after it, translated as before
    (same backend, same SNAT port), without a new flow being created for any of them.
    Half-open flows live EBPFLB_CT_TCP_SYN_TIMEOUT (60 s): longer here, since 4,200 SYNs, the
    grow and 4,200 ACKs take minutes under emulation (the kernel matrix)."""
    with open_datapath(ct_tcp_syn_timeout=3600) as dp:
        assert pool_pairs_of(dp.config.bpffs_dir, MapName.CONNTRACK)[0] == 8192
        dp.forget_flows()
        syns = [dp.run(Program.TC_INGRESS, frame(port, "S"), "eth0") for port in ports()]
        assert dp.maps.counters()["np_new_flow"] >= FLOWS
        flows = dict(dp.maps.conntrack.items())
        assert len(flows) == FLOWS
        assert dp.maps.grow_conntrack(dp.config.ct_max) == (8192, 16384)
        assert pool_pairs_of(dp.config.bpffs_dir, MapName.CONNTRACK)[0] == 16384
        assert dict(dp.maps.conntrack.items()) == flows
        new_flows = dp.maps.counters()["np_new_flow"]
        acks = [dp.run(Program.TC_INGRESS, frame(port, "A"), "eth0") for port in ports()]
        assert dp.maps.counters()["np_new_flow"] == new_flows  # every ACK found its flow
        for syn, ack in zip(syns, acks, strict=True):
            assert ack.verdict == syn.verdict
            assert addressing(ack.data) == addressing(syn.data)
        assert dp.maps.grow_conntrack(dp.config.ct_max) is None  # at its limit


def ports() -> range:
    return range(20000, 20000 + FLOWS)


def frame(port: int, flags: str) -> bytes:
    return build(pc.client(port, (pc.NODE, 30081), tcp_flags=flags), int)


def addressing(data: bytes) -> tuple[str, str, int, int]:
    packet = Ether(data)
    return packet[IP].src, packet[IP].dst, packet[TCP].sport, packet[TCP].dport


def pool_pairs_of(bpffs: Path, name: MapName) -> tuple[int, int]:
    """(max_entries of the pinned map, id of the map its ref map holds), the same map."""
    fd = bpfsys.obj_get(str(bpffs / name.value))
    ref = bpfsys.obj_get(str(bpffs / contract.GROWABLE[name].value))
    try:
        info = bpfsys.map_info(fd, name.value)
        held = growable._ref_get(ref, contract.GROWABLE[name].value)
        assert held == info.id, "the programs use another map than the pinned one"
        return info.max_entries, held
    finally:
        os.close(fd)
        os.close(ref)


def test_an_upgrade_copies_hash_maps_into_their_new_layout(bpffs: Path) -> None:
    """ebpflb_rnat4 pinned preallocated by an older ebpflb: its entries (the reply
    translations of live NodePort flows) are copied into the map without preallocation
    that replaces it, instead of the map being recreated empty."""
    config = Config(bpffs_dir=bpffs)
    ensure_bpffs(bpffs)
    spec = contract.MAPS[MapName.REPLY_NAT]
    assert spec.flags == contract.BPF_F_NO_PREALLOC
    key_size, value_size = ctypes.sizeof(spec.key), ctypes.sizeof(spec.value)
    old = bpfsys.map_create(int(spec.type), key_size, value_size, 1024, "an old rnat4")
    try:
        keys = ctypes.create_string_buffer(bytes(range(key_size)) * 3, key_size * 3)
        for i in range(3):
            keys[i * key_size] = bytes([i])  # three different keys
        values = ctypes.create_string_buffer(b"\x07" * value_size * 3, value_size * 3)
        ElementIO(old, "old", key_size, value_size).update(
            ctypes.addressof(keys), ctypes.addressof(values), 3
        )
        bpfsys.obj_pin(old, str(bpffs / MapName.REPLY_NAT.value))
    finally:
        os.close(old)
    assert drop_incompatible(config) == []
    fd = bpfsys.obj_get(str(bpffs / MapName.REPLY_NAT.value))
    try:
        info = bpfsys.map_info(fd, "rnat4")
        assert (info.flags, info.max_entries) == (spec.flags, config.rnat_max)
        _, copied, count = ElementIO(fd, "new", key_size, value_size).read_all(spec.key, spec.value)
        assert count == 3 and copied == b"\x07" * value_size * 3
    finally:
        os.close(fd)
