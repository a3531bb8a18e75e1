"""The map layer as the control plane sees it: typed entries and Protocols.

``KernelMapSet`` (ebpflb.datapath.maps.kernel) implements them over the pinned BPF maps;
``FakeMapSet`` (ebpflb.datapath.maps.fake) over dicts, with the same capacity limits, so the
reconciler's "map full" paths and `maps dump` are tested without a kernel. Every value is
typed (addresses are IPv4Address or IPv6Address, ports host-order ints); how they are laid
out in the kernel is layout.py's business.

The maps the control plane reads and writes per family come in twins (ebpflb_svc4 and
ebpflb_svc6, ebpflb_ct4 and ebpflb_ct6, ...): a `FamilyKeyValueMap` (ebpflb.datapath.maps.family)
joins each pair behind one interface, the key's address saying which twin holds it.

The package holds the implementations next to this interface: kernel.py (with pinned.py,
elementio.py, codecs.py, layout.py, slotpool.py, growable.py, svcstats.py), fake.py,
family.py, pins.py (the pin directory) and dump.py (`maps dump`). Over 400 lines on
purpose: every entry type and every map's Protocol, read as one interface.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from ebpflb.datapath.contract import SLOTS_PER_ELEMENT, CtFlags, MapName, NatFlags
from ebpflb.errors import MapError
from ebpflb.model import Backend, BackendFlags, Frontend, IPAddress, Proto, SvcFlags, host_port

__all__ = [  # MapName and SLOTS_PER_ELEMENT are the contract's, re-exported for convenience
    "PRIMARY_IFINDEX",
    "SLOTS_PER_ELEMENT",
    "AddrPort",
    "AffinityMatch",
    "BackendEntry",
    "ConntrackEntry",
    "FamilyKeyValueMap",
    "Flow",
    "InterfaceAddresses",
    "KeyValueMap",
    "MapName",
    "MapSet",
    "NatEntry",
    "ServiceCounterMap",
    "ServiceCounters",
    "ServiceEntry",
    "SlotArray",
    "SlotPool",
    "SlotWrite",
    "SourceRange",
    "network_order",
    "slot_pairs",
    "write_one",
]

K = TypeVar("K")
V = TypeVar("V")

SlotArray = npt.NDArray[np.uint32]


@dataclass(frozen=True, slots=True)
class ServiceEntry:
    """Value of ebpflb_svc4 and ebpflb_svc6 (struct lb_svc_val). table_size == 0 means
    "refuse"."""

    svc_id: int
    table_off: int
    table_size: int
    backend_count: int
    flags: SvcFlags


@dataclass(frozen=True, slots=True)
class BackendEntry:
    """Value of ebpflb_be4 (struct lb4_backend) or, for an IPv6 backend, of ebpflb_be6
    (struct lb6_backend)."""

    backend: Backend
    flags: BackendFlags = BackendFlags.NONE


@dataclass(frozen=True, slots=True, order=True)
class SourceRange:
    """Key of ebpflb_srcrng4 (an IPv4 `network`) or ebpflb_srcrng6 (an IPv6 one): a prefix
    allowed to reach one LoadBalancer frontend of the same family. `<` fails between two
    families' networks of one service id: sort mixed ones by `network_order`."""

    svc_id: int
    network: IPv4Network | IPv6Network

    @property
    def family(self) -> int:
        """4 or 6: which twin holds it."""
        return self.network.version


def network_order(network: IPv4Network | IPv6Network) -> tuple[int, int, int]:
    """A network's own order in ints, IPv4 before IPv6 (ipaddress refuses to compare the
    two families)."""
    return (network.version, int(network.network_address), network.prefixlen)


@dataclass(frozen=True, slots=True, order=True)
class AffinityMatch:
    """Key of ebpflb_affpair4: a backend a frontend with session affinity may be sent to
    by a client's affinity entry; the value is the frontend's timeout in seconds."""

    svc_id: int
    backend_id: int


@dataclass(frozen=True, slots=True, order=True)
class AddrPort:
    """An address and a port, as one side of a flow (either family: the conntrack and NAT
    maps have a twin per family, as socket-LB's reverse entries)."""

    address: IPAddress
    port: int

    def __str__(self) -> str:
        return host_port(self.address, self.port)


@dataclass(frozen=True, slots=True, order=True)
class Flow:
    """Key of ebpflb_ct4 and ebpflb_rnat4 (struct flow4) or, for IPv6, of ebpflb_ct6 and
    ebpflb_rnat6 (struct flow6): one direction of a flow as the wire shows it, both ends of
    one family. Do not sort mixed families with `<`: sort by `order`."""

    source: AddrPort
    destination: AddrPort
    protocol: Proto

    @property
    def family(self) -> int:
        """4 or 6: which twin holds it."""
        return self.source.address.version

    @property
    def order(self) -> tuple[int, int, int, int, int, int]:
        """Flow's own order in ints, IPv4 before IPv6."""
        src, dst = self.source, self.destination
        return (
            src.address.version,
            int(src.address),
            src.port,
            int(dst.address),
            dst.port,
            self.protocol,
        )


@dataclass(frozen=True, slots=True)
class ConntrackEntry:
    """Value of ebpflb_ct4 (struct ct4_entry) or ebpflb_ct6 (struct ct6_entry): where one
    NodePort/LoadBalancer/external-IP flow goes, in its key's family. `snat` is set
    exactly when `flags` has CtFlags.SNAT."""

    backend: AddrPort
    flags: CtFlags
    snat: AddrPort | None  # the node address and port the client's source becomes
    svc_id: int
    backend_id: int  # at creation; the backend may have left the service since
    expires_ns: int  # CLOCK_MONOTONIC (bpf_ktime_get_ns) after which the flow is dead
    packets: int  # client -> backend
    bytes: int


@dataclass(frozen=True, slots=True)
class NatEntry:
    """Value of ebpflb_rnat4 (struct rnat4_val) or ebpflb_rnat6 (struct rnat6_val): how
    replies get the client's view back. With NatFlags.SNAT it also holds its SNAT port (the
    key's destination) for the flow."""

    client: AddrPort
    frontend: AddrPort
    flags: NatFlags
    expires_ns: int  # CLOCK_MONOTONIC after which the entry (and SNAT port) may be reused


@dataclass(frozen=True, slots=True)
class ServiceCounters:
    """One frontend's ebpflb_svcstats element (struct lb_svc_stats), summed over CPUs."""

    sock_xlated: int = 0  # socket-LB connect()/sendmsg() calls translated to a backend
    refused: int = 0  # refused (socket-LB) or dropped (NodePort): no usable backend
    np_flows: int = 0  # NodePort/LoadBalancer/external-IP flows started
    np_packets: int = 0  # their packets translated towards a backend (tc or XDP)
    np_bytes: int = 0


class ServiceCounterMap(Protocol):
    """ebpflb_svcstats: per-CPU counters by service id, written by the programs."""

    @property
    def name(self) -> str: ...

    @property
    def capacity(self) -> int: ...

    def get(self, svc_id: int) -> ServiceCounters:
        """One id's counters summed over CPUs."""
        ...

    def read(self, upto: int) -> dict[int, ServiceCounters]:
        """The counters of ids 1..upto summed over CPUs, leaving out all-zero ones (ids are
        dense, so `upto` is about the number of frontends: a scrape reads no more)."""
        ...

    def reset(self, svc_ids: Sequence[int]) -> dict[int, MapError]:
        """Zero the ids' counters on every CPU (before a new frontend takes an id); the ids
        that failed, by index. Never raises."""
        ...


class KeyValueMap(Protocol[K, V]):
    """One BPF hash map with typed keys and values."""

    @property
    def name(self) -> str: ...

    @property
    def capacity(self) -> int: ...

    def get(self, key: K) -> V | None: ...

    def put(self, key: K, value: V) -> None:
        """Insert or replace; MapFullError when inserting into a full map."""

    def put_many(self, items: Sequence[tuple[K, V]]) -> dict[int, MapError]:
        """Insert or replace every item, in order, in as few syscalls as the kernel allows.

        Never raises for one item: the items that failed, by index, each with the error
        `put` would have raised (MapFullError for a full map). Every other item is written.
        """

    def delete(self, key: K) -> bool:
        """Remove the key; False (not an error) when it was absent."""

    def items(self) -> Iterator[tuple[K, V]]: ...

    def __len__(self) -> int: ...


class FamilyKeyValueMap(KeyValueMap[K, V], Protocol):
    """An IPv4 map and its IPv6 twin as one KeyValueMap (ebpflb.datapath.maps.family.FamilyMap):
    each key goes to its family's twin; `v4` and `v6` are the twins themselves, for what
    each counts, names and holds on its own (fill levels, budgets, error messages)."""

    @property
    def v4(self) -> KeyValueMap[K, V]: ...

    @property
    def v6(self) -> KeyValueMap[K, V]: ...

    def twin(self, family: int) -> KeyValueMap[K, V]:
        """`v4` for 4, `v6` for 6."""
        ...


PRIMARY_IFINDEX = 0  # no interface has it: the entry of the node's primary address


@dataclass(frozen=True, slots=True)
class InterfaceAddresses:
    """ebpflb_ifaddr4 and ebpflb_ifaddr6: ifindex -> the node address of each family that
    NodePort flows leaving by that interface are SNATed to, and PRIMARY_IFINDEX -> the
    node's primary address, for an egress interface without one (no entry at all: the
    programs count snat_no_addr)."""

    v4: Mapping[int, IPv4Address] = field(default_factory=dict)
    v6: Mapping[int, IPv6Address] = field(default_factory=dict)

    def of(self, family: int) -> Mapping[int, IPv4Address | IPv6Address]:
        """One family's entries."""
        return self.v4 if family == 4 else self.v6


@dataclass(frozen=True, slots=True)
class SlotWrite:
    """One table to store at `offset` (even): all of it, or only the elements holding the
    `changed` slot indexes (a delta)."""

    offset: int
    table: SlotArray
    changed: npt.NDArray[np.int64] | None = None


class SlotPool(Protocol):
    """The Maglev slot pool: backend ids, stored two per element (struct lb_slot_pair).

    Tables start at even slots; writes go by whole elements, so a table's last element
    carries a padding slot that is never read (lookups stay below the table size)."""

    @property
    def name(self) -> str: ...

    @property
    def capacity(self) -> int:
        """Slots (twice the array's elements)."""
        ...

    @property
    def limit(self) -> int:
        """Slots the pool may grow to (`capacity` when it cannot grow)."""
        ...

    def grow(self, capacity: int) -> None:
        """Become `capacity` slots (even, above `capacity`, at most `limit`), every slot
        kept and readable by the datapath throughout. MapError if it cannot."""

    def write(
        self, offset: int, table: SlotArray, changed: npt.NDArray[np.int64] | None = None
    ) -> None:
        """Store the table at `offset` (even): all of it, or only the elements holding
        the `changed` slot indexes (a delta). MapError if it cannot."""

    def write_many(self, writes: Sequence[SlotWrite]) -> dict[int, MapError]:
        """Every write, in as few syscalls as possible; the ones that failed, by index (a
        failed write may be partly stored: its range must not be used). Never raises."""

    def read(self, offset: int, count: int) -> SlotArray:
        """The slots as they are now: a copy, or a read-only view of the pool that follows
        later writes (so read again rather than keep it across a write of the range)."""
        ...

    def release(self) -> None:
        """Let go of what the last reads and writes held (a memory mapping of the pool):
        called after each sync. The next read or write takes what it needs again."""


def slot_pairs(
    offset: int, table: SlotArray, changed: npt.NDArray[np.int64] | None
) -> tuple[npt.NDArray[np.uint32], SlotArray]:
    """(element indexes, their slot values flattened in pairs) for a SlotPool write."""
    if offset % SLOTS_PER_ELEMENT:
        raise ValueError(f"slot table offset {offset} is not even")
    padded = np.zeros(len(table) + len(table) % SLOTS_PER_ELEMENT, dtype=np.uint32)
    padded[: len(table)] = table
    pairs = padded.reshape(-1, SLOTS_PER_ELEMENT)
    index = (
        np.arange(len(pairs), dtype=np.int64)
        if changed is None
        else np.unique(np.asarray(changed, dtype=np.int64) // SLOTS_PER_ELEMENT)
    )
    keys = (index + offset // SLOTS_PER_ELEMENT).astype(np.uint32)
    return keys, np.ascontiguousarray(pairs[index]).reshape(-1)


def write_one(pool: SlotPool, write: SlotWrite) -> None:
    """`SlotPool.write` in terms of `write_many`, raising its error."""
    failures = pool.write_many([write])
    if failures:
        raise failures[0]


class MapSet(Protocol):
    """Every map the control plane writes."""

    @property
    def services(self) -> KeyValueMap[Frontend, ServiceEntry]: ...

    @property
    def backends(self) -> KeyValueMap[int, BackendEntry]: ...

    @property
    def service_meta(self) -> KeyValueMap[int, str]: ...

    @property
    def slots(self) -> SlotPool: ...

    @property
    def source_ranges(self) -> FamilyKeyValueMap[SourceRange, int]:
        """loadBalancerSourceRanges: ebpflb_srcrng4 + ebpflb_srcrng6, by the network."""
        ...

    @property
    def affinity_match(self) -> KeyValueMap[AffinityMatch, int]: ...

    @property
    def conntrack(self) -> FamilyKeyValueMap[Flow, ConntrackEntry]:
        """NodePort flows of both families (ebpflb_ct4 + ebpflb_ct6), written by the
        programs (the control plane reads them, and deletes stale UDP ones)."""
        ...

    @property
    def reply_nat(self) -> FamilyKeyValueMap[Flow, NatEntry]:
        """Reply translations and SNAT reservations of both families (ebpflb_rnat4 +
        ebpflb_rnat6), keyed by the reply's tuple."""
        ...

    @property
    def service_counters(self) -> ServiceCounterMap: ...

    def interface_addresses(self) -> InterfaceAddresses:
        """ifindex -> the node address SNAT uses on that interface, per family
        (ebpflb_ifaddr4, ebpflb_ifaddr6)."""
        ...

    def interface_mtus(self) -> dict[int, int]:
        """ifindex -> MTU (ebpflb_ifmtu)."""
        ...

    def counters(self) -> dict[str, int]:
        """Datapath event counters summed over CPUs, by Counter.label (STAT_* in C)."""
        ...

    def destroy_udp_sockets(self, left: Mapping[AddrPort, Set[AddrPort]]) -> int:
        """Abort the connected UDP sockets socket-LB sent to a backend that has since left
        the frontend they asked for (frontend -> backends that left); how many."""
        ...
