"""The MapSet over the pinned kernel maps.

Maps are opened by pin path, so the agent (after the loader compiled and pinned them) and
`ebpflb maps dump` (with no agent and no compiler) use the same code. Element operations go
through libbcc's syscall wrappers; ctypes layouts and byte order come from layout.py.
"""

from __future__ import annotations

import ctypes as ct
import errno
import itertools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt
from bcc.libbcc import lib
from bcc.utils import get_possible_cpus

from ebpflb.datapath import bpfsys, layout
from ebpflb.datapath.maps import (
    SLOTS_PER_ELEMENT,
    BackendEntry,
    MapName,
    ServiceEntry,
    SlotArray,
    SourceRange,
    slot_pairs,
)
from ebpflb.errors import MapError, MapFullError, NoPinsError
from ebpflb.model import Frontend, Proto

K = TypeVar("K")
V = TypeVar("V")

BPF_ANY = 0


@dataclass(frozen=True, slots=True)
class Codec(Generic[K]):
    """How one side (key or value) of a map converts between Python and C."""

    ctype: type[ct.Structure] | type[ct._SimpleCData[Any]]
    encode: Callable[[K], Any]
    decode: Callable[[Any], K]


U32: Codec[int] = Codec(ct.c_uint32, ct.c_uint32, lambda raw: int(raw.value))
FRONTEND: Codec[Frontend] = Codec(layout.Lb4SvcKey, layout.encode_frontend, layout.decode_frontend)
SERVICE: Codec[ServiceEntry] = Codec(layout.Lb4SvcVal, layout.encode_service, layout.decode_service)
BACKEND: Codec[BackendEntry] = Codec(
    layout.Lb4Backend, layout.encode_backend, layout.decode_backend
)
META: Codec[str] = Codec(layout.Lb4SvcMeta, layout.encode_meta, layout.decode_meta)
SOURCE_RANGE: Codec[SourceRange] = Codec(
    layout.SrcRange4Key, layout.encode_source_range, layout.decode_source_range
)
U8: Codec[int] = Codec(ct.c_uint8, ct.c_uint8, lambda raw: int(raw.value))


def _errno_error(what: str) -> MapError:
    err = ct.get_errno()
    return MapError(f"{what}: {os.strerror(err)}")


class PinnedMap:
    """An open fd on a pinned map, closed with close() (or by the owning MapSet)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = path.name
        try:
            self.fd = bpfsys.obj_get(str(path))
        except OSError as exc:
            raise MapError(f"cannot open pinned map {path}: {exc.strerror}") from exc
        self.info = bpfsys.map_info(self.fd)
        self.capacity = self.info.max_entries

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class KernelMap(Generic[K, V]):
    """A typed view of a pinned hash map (KeyValueMap protocol)."""

    def __init__(self, pinned: PinnedMap, key: Codec[K], value: Codec[V]) -> None:
        self.pinned = pinned
        self.name = pinned.name
        self.capacity = pinned.capacity
        self._key = key
        self._value = value
        for side, codec, size in (
            ("key", key, pinned.info.key_size),
            ("value", value, pinned.info.value_size),
        ):
            if ct.sizeof(codec.ctype) != size:
                raise MapError(
                    f"{pinned.path}: {side} size {size} in the kernel, "
                    f"{ct.sizeof(codec.ctype)} expected (pinned by another ebpflb version?)"
                )

    def get(self, key: K) -> V | None:
        raw_key = self._key.encode(key)
        raw_value = self._value.ctype()
        if lib.bpf_lookup_elem(self.pinned.fd, ct.byref(raw_key), ct.byref(raw_value)) < 0:
            return None
        return self._value.decode(raw_value)

    def put(self, key: K, value: V) -> None:
        raw_key = self._key.encode(key)
        raw_value = self._value.encode(value)
        if lib.bpf_update_elem(self.pinned.fd, ct.byref(raw_key), ct.byref(raw_value), BPF_ANY) < 0:
            if ct.get_errno() == errno.E2BIG:
                raise MapFullError(self.name, self.capacity, str(key))
            raise _errno_error(f"update {self.name}[{key}]")

    def delete(self, key: K) -> bool:
        raw_key = self._key.encode(key)
        if lib.bpf_delete_elem(self.pinned.fd, ct.byref(raw_key)) < 0:
            if ct.get_errno() == errno.ENOENT:
                return False
            raise _errno_error(f"delete {self.name}[{key}]")
        return True

    def items(self) -> Iterator[tuple[K, V]]:
        for raw_key, raw_value in raw_items(self.pinned.fd, self._key.ctype, self._value.ctype):
            yield self._key.decode(raw_key), self._value.decode(raw_value)

    def __len__(self) -> int:
        return sum(1 for _ in raw_keys(self.pinned.fd, self._key.ctype))


def raw_keys(fd: int, key_type: Any) -> Iterator[Any]:
    """Every key of a hash map, as ctypes values (a snapshot walk with get_next_key)."""
    key = key_type()
    if lib.bpf_get_first_key(fd, ct.byref(key), ct.sizeof(key)) < 0:
        return
    while True:
        yield key
        next_key = key_type()
        if lib.bpf_get_next_key(fd, ct.byref(key), ct.byref(next_key)) < 0:
            return
        key = next_key


def raw_items(fd: int, key_type: Any, value_type: Any) -> Iterator[tuple[Any, Any]]:
    """Every (key, value) of a hash map, as ctypes values; keys deleted meanwhile skipped."""
    for raw_key in raw_keys(fd, key_type):
        raw_value = value_type()
        if lib.bpf_lookup_elem(fd, ct.byref(raw_key), ct.byref(raw_value)) == 0:
            yield raw_key, raw_value


class KernelSlotPool:
    """The Maglev slot pool array (two slots per element), written with
    BPF_MAP_UPDATE_BATCH (kernel 5.6+)."""

    def __init__(self, pinned: PinnedMap) -> None:
        self.pinned = pinned
        self.name = pinned.name
        self.capacity = pinned.capacity * SLOTS_PER_ELEMENT

    def write(
        self, offset: int, table: SlotArray, changed: npt.NDArray[np.int64] | None = None
    ) -> None:
        keys, values = slot_pairs(offset, table, changed)
        if len(keys) == 0:
            return
        if int(keys.max()) >= self.pinned.capacity:
            raise MapError(
                f"{self.name}: slot {offset + len(table)} beyond capacity {self.capacity}"
            )
        count = ct.c_uint32(len(keys))
        res = lib.bpf_update_batch(
            self.pinned.fd,
            keys.ctypes.data_as(ct.c_void_p),
            values.ctypes.data_as(ct.c_void_p),
            ct.byref(count),
        )
        if res < 0:
            raise _errno_error(f"batch update of {len(keys)} slot pairs in {self.name}")

    def read(self, offset: int, count: int) -> SlotArray:
        if count == 0:
            return np.zeros(0, dtype=np.uint32)
        first = offset // SLOTS_PER_ELEMENT
        n_pairs = (offset + count + 1) // SLOTS_PER_ELEMENT - first
        keys = np.zeros(n_pairs, dtype=np.uint32)
        values: SlotArray = np.zeros(n_pairs * SLOTS_PER_ELEMENT, dtype=np.uint32)
        # A batch lookup starts at the key *after* in_batch (NULL: at key 0); ENOENT means
        # it reached the array's end.
        in_batch = ct.c_uint32(first - 1)
        out_batch = ct.c_uint32(0)
        n = ct.c_uint32(n_pairs)
        res = lib.bpf_lookup_batch(
            self.pinned.fd,
            ct.byref(in_batch) if first else None,
            ct.byref(out_batch),
            keys.ctypes.data_as(ct.c_void_p),
            values.ctypes.data_as(ct.c_void_p),
            ct.byref(n),
        )
        if res < 0 and ct.get_errno() != errno.ENOENT:
            raise _errno_error(f"batch lookup of {n_pairs} slot pairs in {self.name}")
        if n.value != n_pairs:
            raise MapError(f"{self.name}: read {n.value} of {n_pairs} slot pairs at {offset}")
        start = offset - first * SLOTS_PER_ELEMENT
        return values[start : start + count].copy()


class KernelMapSet:
    """Every pinned ebpflb map, opened by path (MapSet protocol)."""

    def __init__(self, bpffs_dir: Path) -> None:
        self.bpffs_dir = bpffs_dir
        missing = [m.value for m in MapName if not (bpffs_dir / m.value).exists()]
        if len(missing) == len(MapName):
            raise NoPinsError(f"no ebpflb maps pinned under {bpffs_dir}")
        if missing:
            raise NoPinsError(f"incomplete ebpflb pins under {bpffs_dir}: missing {missing}")
        self._pins = {m: PinnedMap(bpffs_dir / m.value) for m in MapName}
        self.services = KernelMap(self._pins[MapName.SERVICES], FRONTEND, SERVICE)
        self.backends = KernelMap(self._pins[MapName.BACKENDS], U32, BACKEND)
        self.service_meta = KernelMap(self._pins[MapName.SERVICE_META], U32, META)
        self.slots = KernelSlotPool(self._pins[MapName.SLOTS])
        self.source_ranges = KernelMap(self._pins[MapName.SOURCE_RANGES], SOURCE_RANGE, U8)
        self._ncpus = len(get_possible_cpus())

    def counters(self) -> dict[str, int]:
        pinned = self._pins[MapName.STATS]
        values = (ct.c_uint64 * self._ncpus)()
        totals: dict[str, int] = {}
        for counter in layout.Counter:
            key = ct.c_uint32(counter)
            if lib.bpf_lookup_elem(pinned.fd, ct.byref(key), ct.byref(values)) < 0:
                raise _errno_error(f"lookup {pinned.name}[{counter.name}]")
            totals[counter.name.lower()] = sum(values)
        return totals

    def conntrack(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Live and expired NodePort flows (ebpflb_ct4), for dumps."""
        pinned = self._pins[MapName.CONNTRACK]
        now = time.monotonic_ns()  # CLOCK_MONOTONIC, like bpf_ktime_get_ns()
        flows = []
        items = raw_items(pinned.fd, layout.Flow4, layout.Ct4Entry)
        for raw_key, val in itertools.islice(items, limit):
            source, frontend = layout.format_flow(raw_key)
            flags = layout.CtFlags(val.flags)
            flows.append(
                {
                    "proto": Proto(raw_key.proto).name,
                    "client": source,
                    "frontend": frontend,
                    "backend": layout.format_endpoint(val.backend_addr, val.backend_port),
                    "snat": layout.format_endpoint(val.nat_addr, val.nat_port)
                    if flags & layout.CtFlags.SNAT
                    else None,
                    "flags": [f.name.lower() for f in layout.CtFlags if f in flags and f.name],
                    "svc_id": val.svc_id,
                    "expires_in": round((val.expires - now) / 1e9, 1),
                    "packets": val.packets,
                    "bytes": val.bytes,
                }
            )
        return flows

    def reply_nat(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Reply translations and SNAT reservations (ebpflb_rnat4), for dumps."""
        pinned = self._pins[MapName.REPLY_NAT]
        now = time.monotonic_ns()
        entries = []
        items = raw_items(pinned.fd, layout.Flow4, layout.Rnat4Val)
        for raw_key, val in itertools.islice(items, limit):
            backend, reply_to = layout.format_flow(raw_key)
            entries.append(
                {
                    "proto": Proto(raw_key.proto).name,
                    "backend": backend,
                    "reply_to": reply_to,
                    "client": layout.format_endpoint(val.client_addr, val.client_port),
                    "frontend": layout.format_endpoint(val.frontend_addr, val.frontend_port),
                    "snat": bool(val.flags & layout.RNAT_F_SNAT),
                    "expires_in": round((val.expires - now) / 1e9, 1),
                }
            )
        return entries

    def expire_flows(self) -> int:
        """Delete reply translations idle past their deadline; conntrack is LRU and checks
        its own deadlines, but nothing else frees an idle SNAT reservation's memory."""
        pinned = self._pins[MapName.REPLY_NAT]
        now = time.monotonic_ns()
        expired = [
            raw_key
            for raw_key, val in raw_items(pinned.fd, layout.Flow4, layout.Rnat4Val)
            if val.expires < now
        ]
        for raw_key in expired:
            lib.bpf_delete_elem(pinned.fd, ct.byref(raw_key))
        return len(expired)

    def set_interface_addresses(self, addresses: dict[int, IPv4Address]) -> None:
        """ifindex -> node address used as the SNAT source on that interface."""
        pinned = self._pins[MapName.IFACE_ADDRS]
        for raw_key in list(raw_keys(pinned.fd, ct.c_uint32)):
            if int(raw_key.value) not in addresses:
                lib.bpf_delete_elem(pinned.fd, ct.byref(raw_key))
        for ifindex, address in addresses.items():
            key = ct.c_uint32(ifindex)
            value = ct.c_uint32(layout.addr_to_be32(address))
            if lib.bpf_update_elem(pinned.fd, ct.byref(key), ct.byref(value), BPF_ANY) < 0:
                raise _errno_error(f"update {pinned.name}[{ifindex}]")

    def map_infos(self) -> dict[str, bpfsys.MapInfo]:
        return {m.value: p.info for m, p in self._pins.items()}

    def close(self) -> None:
        for pinned in self._pins.values():
            pinned.close()

    def __enter__(self) -> KernelMapSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
