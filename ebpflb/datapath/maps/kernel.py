"""The MapSet over the pinned kernel maps.

Maps are opened by pin path, so the agent (after the loader compiled and pinned them) and
`ebpflb maps dump` (with no agent and no compiler) use the same code. Each map's layout is
checked against the contract (contract.MAPS) when it is opened; element I/O is
elementio.py's, conversions codecs.py's, the slot pool slotpool.py's.
"""

from __future__ import annotations

import ctypes as ct
import errno
import itertools
import time
from collections.abc import Iterator, Mapping, Sequence, Set
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from ebpflb.datapath import contract
from ebpflb.datapath.contract import Counter, MapName
from ebpflb.datapath.maps import AddrPort, InterfaceAddresses, codecs, growable, layout
from ebpflb.datapath.maps.codecs import Codec
from ebpflb.datapath.maps.elementio import (
    LOOKUP_CHUNK,
    ElementIO,
    count_entries,
    delete,
    errno_error,
    raw_items,
    raw_keys,
)
from ebpflb.datapath.maps.family import (
    FamilyMap,
    backend_family,
    flow_family,
    frontend_family,
    range_family,
)
from ebpflb.datapath.maps.pinned import PinnedMap
from ebpflb.datapath.maps.slotpool import KernelSlotPool
from ebpflb.datapath.maps.svcstats import KernelServiceCounters
from ebpflb.datapath.syscall import bpfsys, sockdiag
from ebpflb.datapath.syscall.uapi import BPF_ANY
from ebpflb.errors import MapError, MapFullError, NoPinsError

K = TypeVar("K")
V = TypeVar("V")


class KernelMap(Generic[K, V]):
    """A typed view of a pinned hash map (KeyValueMap protocol)."""

    def __init__(self, pinned: PinnedMap, key: Codec[K], value: Codec[V]) -> None:
        self.pinned = pinned
        self.name = pinned.name
        self.capacity = pinned.capacity
        self._key = key
        self._value = value
        self.io = ElementIO(pinned.fd, pinned.name, pinned.info.key_size, pinned.info.value_size)

    def get(self, key: K) -> V | None:
        raw_value = self.get_raw(key)
        return None if raw_value is None else self._value.decode(raw_value)

    def get_raw(self, key: K) -> Any:
        """The value as the kernel holds it (its ctypes mirror), or None."""
        raw_key = self._key.encode(key)
        raw_value = self._value.ctype()
        if bpfsys.lookup_elem(self.pinned.fd, ct.addressof(raw_key), ct.addressof(raw_value)):
            return None
        return raw_value

    def put(self, key: K, value: V) -> None:
        raw_key = self._key.encode(key)
        raw_value = self._value.encode(value)
        err = bpfsys.update_elem(
            self.pinned.fd, ct.addressof(raw_key), ct.addressof(raw_value), BPF_ANY
        )
        if err:
            raise self._update_error(key, err)

    def put_many(self, items: Sequence[tuple[K, V]]) -> dict[int, MapError]:
        if not items:
            return {}
        keys = self._key.to_buffer([k for k, _ in items])
        values = self._value.to_buffer([v for _, v in items])
        errors = self.io.update(codecs.address_of(keys), codecs.address_of(values), len(items))
        return {i: self._update_error(items[i][0], err) for i, err in errors.items()}

    def _update_error(self, key: K, err: int) -> MapError:
        if err == errno.E2BIG:
            return MapFullError(self.name, self.capacity, str(key))
        return errno_error(f"update {self.name}[{key}]", err)

    def delete(self, key: K) -> bool:
        return delete(self.pinned.fd, self._key.encode(key), f"{self.name}[{key}]")

    def items(self) -> Iterator[tuple[K, V]]:
        """A snapshot of the map taken now, decoded as it is iterated (a dump that shows
        the first 100 of 200,000 flows decodes a chunk, not the whole map)."""
        keys, values, count = self.io.read_all(self._key.ctype, self._value.ctype)
        return self._decoded(keys, values, count)

    def _decoded(self, keys: bytes, values: bytes, count: int) -> Iterator[tuple[K, V]]:
        for start in range(0, count, LOOKUP_CHUNK):
            n = min(LOOKUP_CHUNK, count - start)
            yield from zip(
                self._key.from_bytes(keys, n, start),
                self._value.from_bytes(values, n, start),
                strict=True,
            )

    def __len__(self) -> int:
        return sum(1 for _ in raw_keys(self.pinned.fd, self._key.ctype))


class BackendArray(KernelMap[int, V]):
    """ebpflb_be4: an array indexed by backend id (1..capacity; 0 is never allocated), seen
    as a KeyValueMap. An array cannot delete: `delete` writes an all-zero element, which the
    programs treat as no backend (lb_backend_lookup), and `get`, `items` and `len` leave
    such elements out."""

    def __init__(self, pinned: PinnedMap, key: Codec[int], value: Codec[V]) -> None:
        super().__init__(pinned, key, value)
        self.capacity = pinned.capacity - 1  # element 0 is never used

    def get(self, key: int) -> V | None:
        raw_value = self.get_raw(key) if 0 < key <= self.capacity else None
        if raw_value is None or not any(bytes(raw_value)):
            return None
        return self._value.decode(raw_value)

    def delete(self, key: int) -> bool:
        if self.get(key) is None:
            return False
        zero, raw_key = self._value.ctype(), self._key.encode(key)
        errors = self.io.update(ct.addressof(raw_key), ct.addressof(zero), 1)
        if errors:
            raise errno_error(f"clear {self.name}[{key}]", errors[0])
        return True

    def items(self) -> Iterator[tuple[int, V]]:
        keys, values, count = self.io.read_all(self._key.ctype, self._value.ctype)
        keys, values, count = layout.drop_zero_values(keys, values, count, self.io.value_size)
        return self._decoded(keys, values, count)

    def __len__(self) -> int:
        _, values, count = self.io.read_all(self._key.ctype, self._value.ctype)
        return layout.count_nonzero_values(values, count, self.io.value_size)


def _expire(io: ElementIO, key: type[ct.Structure], value: type[ct.Structure], now: int) -> int:
    """Delete the entries of one reply-NAT table whose deadline is before `now`."""
    keys, values, count = io.read_all(key, value)
    # Only the deadlines are needed: read them in place, no entry decoded.
    deadlines = np.frombuffer(values, dtype=layout.record_dtype(value), count=count)["expires"]
    expired = np.flatnonzero(deadlines < now).tolist()
    size = io.key_size
    for index in expired:
        raw_key = key.from_buffer_copy(keys, index * size)
        delete(io.fd, raw_key, f"{io.name} entry")
    return len(expired)


class KernelMapSet:
    """Every pinned ebpflb map, opened by path (MapSet protocol)."""

    def __init__(self, bpffs_dir: Path, slot_limit: int | None = None) -> None:
        """`slot_limit`: slots the pool may grow to (the agent's --slot-pool-size); None
        for a reader, which never grows it."""
        self.bpffs_dir = bpffs_dir
        missing = [m.value for m in MapName if not (bpffs_dir / m.value).exists()]
        if len(missing) == len(MapName):
            raise NoPinsError(f"no ebpflb maps pinned under {bpffs_dir}")
        if missing:
            raise NoPinsError(f"incomplete ebpflb pins under {bpffs_dir}: missing {missing}")
        self._pins: dict[MapName, PinnedMap] = {}
        try:
            for name, spec in contract.MAPS.items():
                self._pins[name] = PinnedMap(bpffs_dir / name.value)
                self._pins[name].check(spec)
        except MapError:
            self.close()
            raise
        pins = self._pins
        self.services = FamilyMap(
            KernelMap(pins[MapName.SERVICES], codecs.FRONTEND, codecs.SERVICE),
            KernelMap(pins[MapName.SERVICES6], codecs.FRONTEND6, codecs.SERVICE),
            frontend_family,
        )
        self.backends4 = BackendArray(pins[MapName.BACKENDS], codecs.U32, codecs.BACKEND)
        self.backends6 = BackendArray(pins[MapName.BACKENDS6], codecs.U32, codecs.BACKEND6)
        self.backends = FamilyMap(self.backends4, self.backends6, backend_family)
        self.service_meta = KernelMap(pins[MapName.SERVICE_META], codecs.U32, codecs.META)
        self.slots = KernelSlotPool(pins[MapName.SLOTS], slot_limit)
        self.source_ranges = FamilyMap(
            KernelMap(pins[MapName.SOURCE_RANGES], codecs.SOURCE_RANGE, codecs.U8),
            KernelMap(pins[MapName.SOURCE_RANGES6], codecs.SOURCE_RANGE6, codecs.U8),
            range_family,
        )
        self.conntrack = FamilyMap(
            KernelMap(pins[MapName.CONNTRACK], codecs.FLOW, codecs.CONNTRACK),
            KernelMap(pins[MapName.CONNTRACK6], codecs.FLOW6, codecs.CONNTRACK6),
            flow_family,
        )
        self.reply_nat4 = KernelMap(pins[MapName.REPLY_NAT], codecs.FLOW, codecs.NAT)
        self.reply_nat6 = KernelMap(pins[MapName.REPLY_NAT6], codecs.FLOW6, codecs.NAT6)
        self.reply_nat = FamilyMap(self.reply_nat4, self.reply_nat6, flow_family)
        self.affinity_match = KernelMap(
            pins[MapName.AFFINITY_MATCH], codecs.AFFINITY_MATCH, codecs.U32
        )
        self._ncpus = bpfsys.possible_cpus()
        stats = pins[MapName.SERVICE_STATS]
        self.service_counters = KernelServiceCounters(
            stats.fd, stats.name, stats.capacity, self._ncpus
        )

    def counters(self) -> dict[str, int]:
        pinned = self._pins[MapName.STATS]
        values = (ct.c_uint64 * self._ncpus)()
        totals: dict[str, int] = {}
        for counter in Counter:
            key = ct.c_uint32(counter)
            err = bpfsys.lookup_elem(pinned.fd, ct.addressof(key), ct.addressof(values))
            if err:
                raise errno_error(f"lookup {pinned.name}[{counter.name}]", err)
            totals[counter.label] = sum(values)
        return totals

    def expire_flows(self) -> int:
        """Delete reply translations (both families) idle past their deadline; conntrack
        is LRU and checks its own deadlines, but nothing else frees an idle SNAT
        reservation's memory."""
        now = time.monotonic_ns()  # CLOCK_MONOTONIC, like bpf_ktime_get_ns()
        return _expire(self.reply_nat4.io, contract.Flow4, contract.Rnat4Val, now) + _expire(
            self.reply_nat6.io, contract.Flow6, contract.Rnat6Val, now
        )

    def destroy_udp_sockets(self, left: Mapping[AddrPort, Set[AddrPort]]) -> int:
        """The sockets in ebpflb_revsk4 and ebpflb_revsk6 sent to a backend that left
        (syscall/sockdiag.py)."""
        wanted = {
            (f.address, f.port): {(b.address, b.port) for b in backends}
            for f, backends in left.items()
        }
        entries = itertools.chain(self._reverse_entries(4), self._reverse_entries(6))
        return sockdiag.destroy_udp_sockets(sockdiag.stale_cookies(entries, wanted))

    def _reverse_entries(self, family: int) -> Iterator[sockdiag.Entry]:
        """(cookie, backend address, port, frontend address, port) of one family's
        socket-LB reverse entries."""
        name = MapName.REVERSE_SOCK if family == 4 else MapName.REVERSE_SOCK6
        key_type, value_type = (
            (contract.Lb4RevskKey, contract.Lb4RevskVal)
            if family == 4
            else (contract.Lb6RevskKey, contract.Lb6RevskVal)
        )
        pinned = self._pins[name]
        io = ElementIO(pinned.fd, pinned.name, ct.sizeof(key_type), ct.sizeof(value_type))
        keys, values, count = io.read_all(key_type, value_type)
        for i in range(count):
            key = key_type.from_buffer_copy(keys, i * io.key_size)
            val = value_type.from_buffer_copy(values, i * io.value_size)
            yield (int(key.cookie), *layout.decode_reverse(key, val))

    def set_interface_addresses(self, addresses: InterfaceAddresses) -> None:
        """ifindex -> node address used as the SNAT source on that interface, per family
        (ebpflb_ifaddr4, ebpflb_ifaddr6): entries of interfaces not named are deleted."""
        v4 = {i: ct.c_uint32(layout.addr_to_be32(a)) for i, a in addresses.v4.items()}
        v6 = {i: layout.encode_addr6(a) for i, a in addresses.v6.items()}
        for name, values in ((MapName.IFACE_ADDRS, v4), (MapName.IFACE_ADDRS6, v6)):
            pinned = self._pins[name]
            for raw_key in list(raw_keys(pinned.fd, ct.c_uint32)):
                if int(raw_key.value) not in values:
                    delete(pinned.fd, raw_key, f"{pinned.name}[{raw_key.value}]")
            for ifindex, value in values.items():
                key = ct.c_uint32(ifindex)
                err = bpfsys.update_elem(pinned.fd, ct.addressof(key), ct.addressof(value), BPF_ANY)
                if err:
                    raise errno_error(f"update {pinned.name}[{ifindex}]", err)

    def set_interface_mtus(self, mtus: Mapping[int, int]) -> None:
        """ifindex -> MTU (ebpflb_ifmtu): entries of interfaces not named are deleted."""
        pinned = self._pins[MapName.IFACE_MTUS]
        for raw_key in list(raw_keys(pinned.fd, ct.c_uint32)):
            if int(raw_key.value) not in mtus:
                delete(pinned.fd, raw_key, f"{pinned.name}[{raw_key.value}]")
        for ifindex, mtu in mtus.items():
            key, value = ct.c_uint32(ifindex), ct.c_uint32(mtu)
            err = bpfsys.update_elem(pinned.fd, ct.addressof(key), ct.addressof(value), BPF_ANY)
            if err:
                raise errno_error(f"update {pinned.name}[{ifindex}]", err)

    def interface_mtus(self) -> dict[int, int]:
        pinned = self._pins[MapName.IFACE_MTUS]
        return {
            int(k.value): int(v.value) for k, v in raw_items(pinned.fd, ct.c_uint32, ct.c_uint32)
        }

    def interface_addresses(self) -> InterfaceAddresses:
        v4, v6 = self._pins[MapName.IFACE_ADDRS], self._pins[MapName.IFACE_ADDRS6]
        return InterfaceAddresses(
            {
                int(k.value): layout.be32_to_addr(int(v.value))
                for k, v in raw_items(v4.fd, ct.c_uint32, ct.c_uint32)
            },
            {
                int(k.value): layout.decode_addr6(v)
                for k, v in raw_items(v6.fd, ct.c_uint32, contract.Addr6)
            },
        )

    def map_infos(self) -> dict[str, bpfsys.MapInfo]:
        """What the kernel said of each map when opened (the slot pool: since it last grew)."""
        infos = {m.value: p.info for m, p in self._pins.items()}
        infos[MapName.SLOTS.value] = self.slots.pinned.info
        return infos

    def count_entries(self, name: MapName) -> int:
        """Elements in a hash, LRU or LPM map now, at most its max_entries (see
        elementio.count_entries: exact, in batches of 4096)."""
        if name is MapName.BACKENDS:
            return len(self.backends4)  # an array: its written elements
        if name is MapName.BACKENDS6:
            return len(self.backends6)
        pinned = self._pins[name]
        io = ElementIO(pinned.fd, pinned.name, pinned.info.key_size, pinned.info.value_size)
        return count_entries(io, pinned.capacity)

    def grow_conntrack(
        self, limit: int, name: MapName = MapName.CONNTRACK
    ) -> tuple[int, int] | None:
        """Double ebpflb_ct4 or ebpflb_ct6 (`name`; at most to `limit`) once it is half
        full (growable.py): (entries before, after), or None when it stays. Each family's
        table grows on its own: an IPv4-only cluster never spends memory on IPv6 flows."""
        family = {MapName.CONNTRACK: 4, MapName.CONNTRACK6: 6}.get(name)
        if family is None:
            raise ValueError(f"{name.value} is not a conntrack table")
        pinned = self._pins[name]
        before = pinned.capacity
        if before >= limit or self.count_entries(name) * 2 < before:
            return None
        growable.grow_table(self.bpffs_dir, name, min(limit, before * 2))
        pinned.close()  # the old table goes with its last user
        self._pins[name] = grown = PinnedMap(pinned.path)
        if family == 4:
            self.conntrack.v4 = KernelMap(grown, codecs.FLOW, codecs.CONNTRACK)
        else:
            self.conntrack.v6 = KernelMap(grown, codecs.FLOW6, codecs.CONNTRACK6)
        return before, grown.capacity

    def close(self) -> None:
        if hasattr(self, "slots"):
            self.slots.close()
        for pinned in self._pins.values():
            pinned.close()

    def __enter__(self) -> KernelMapSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
