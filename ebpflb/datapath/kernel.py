"""The MapSet over the pinned kernel maps.

Maps are opened by pin path, so the agent (after the loader compiled and pinned them) and
`ebpflb maps dump` (with no agent and no compiler) use the same code. Element operations go
through libbcc's syscall wrappers; ctypes layouts and byte order come from layout.py.

Bulk work costs few syscalls: many writes go in one BPF_MAP_UPDATE_BATCH and a whole map is
read with BPF_MAP_LOOKUP_BATCH (kernel 5.6+; where the kernel or a map type lacks them,
found out on first use, one syscall per element instead). The slot pool, when created with
BPF_F_MMAPABLE, is mapped into this process and read and written as memory: a full sync
stores millions of slots, which costs about 0.2 us each through a syscall.
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import errno
import itertools
import mmap
import os
import time
from collections.abc import Callable, Iterator, Sequence
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
    SlotWrite,
    SourceRange,
    slot_pairs,
    write_one,
)
from ebpflb.errors import MapError, MapFullError, NoPinsError
from ebpflb.model import Frontend, Proto

K = TypeVar("K")
V = TypeVar("V")

BPF_ANY = 0
BPF_F_MMAPABLE = 1 << 10
# What a batch command answers where it does not exist: EINVAL before 5.6 (unknown
# command), ENOTSUPP (524, kernel-internal) or EOPNOTSUPP for a map type without it.
_BATCH_UNSUPPORTED = frozenset({errno.EINVAL, errno.EOPNOTSUPP, 524})
# Elements per BPF_MAP_LOOKUP_BATCH: a hash map answers ENOSPC if one bucket holds more.
LOOKUP_CHUNK = 4096


@dataclass(frozen=True, slots=True)
class Codec(Generic[K]):
    """How one side (key or value) of a map converts between Python and C: one element
    through its ctypes mirror, many at once through its numpy one where there is one."""

    ctype: type[ct.Structure] | type[ct._SimpleCData[Any]]
    encode: Callable[[K], Any]
    decode: Callable[[Any], K]
    dtype: np.dtype[Any] | None = None
    encode_many: Callable[[Sequence[K]], layout.Records] | None = None
    decode_many: Callable[[layout.Records], list[K]] | None = None

    def to_buffer(self, values: Sequence[K]) -> layout.Records | ct.Array[Any]:
        """The values laid out as the kernel wants them, contiguous."""
        if self.encode_many is not None:
            return self.encode_many(values)
        return (self.ctype * len(values))(*(self.encode(v) for v in values))

    def from_bytes(self, raw: bytes, count: int) -> list[K]:
        """`count` values laid out contiguously in `raw`."""
        if self.dtype is not None and self.decode_many is not None:
            return self.decode_many(np.frombuffer(raw, dtype=self.dtype, count=count))
        size = ct.sizeof(self.ctype)
        return [self.decode(self.ctype.from_buffer_copy(raw, i * size)) for i in range(count)]


def _address(buffer: layout.Records | ct.Array[Any]) -> int:
    return buffer.ctypes.data if isinstance(buffer, np.ndarray) else ct.addressof(buffer)


U32: Codec[int] = Codec(
    ct.c_uint32,
    ct.c_uint32,
    lambda raw: int(raw.value),
    layout.U32_DTYPE,
    layout.u32s_to_array,
    layout.u32s_from_array,
)
FRONTEND: Codec[Frontend] = Codec(
    layout.Lb4SvcKey,
    layout.encode_frontend,
    layout.decode_frontend,
    layout.SVC_KEY_DTYPE,
    layout.frontends_to_array,
    layout.frontends_from_array,
)
SERVICE: Codec[ServiceEntry] = Codec(
    layout.Lb4SvcVal,
    layout.encode_service,
    layout.decode_service,
    layout.SVC_VAL_DTYPE,
    layout.services_to_array,
    layout.services_from_array,
)
BACKEND: Codec[BackendEntry] = Codec(
    layout.Lb4Backend,
    layout.encode_backend,
    layout.decode_backend,
    layout.BACKEND_DTYPE,
    layout.backends_to_array,
    layout.backends_from_array,
)
META: Codec[str] = Codec(
    layout.Lb4SvcMeta,
    layout.encode_meta,
    layout.decode_meta,
    layout.META_DTYPE,
    layout.metas_to_array,
    layout.metas_from_array,
)
SOURCE_RANGE: Codec[SourceRange] = Codec(
    layout.SrcRange4Key, layout.encode_source_range, layout.decode_source_range
)
U8: Codec[int] = Codec(ct.c_uint8, ct.c_uint8, lambda raw: int(raw.value))


def _errno_error(what: str, err: int | None = None) -> MapError:
    err = ct.get_errno() if err is None else err
    return MapError(f"{what}: {os.strerror(err)}")


class ElementIO:
    """Raw element writes and whole-map reads on one map fd, batched where the kernel can.

    Buffers are addresses of contiguous key and value arrays; the caller keeps them alive.
    `batched` turns False the first time the kernel refuses a batch command that the
    same element then passes alone (a kernel before 5.6, or a map type without batches).
    """

    def __init__(self, fd: int, key_size: int, value_size: int) -> None:
        self.fd = fd
        self.key_size = key_size
        self.value_size = value_size
        self.batched = True

    def update(
        self,
        keys: int,
        values: int,
        count: int,
        resume: Callable[[int], int] = lambda index: index + 1,
    ) -> dict[int, int]:
        """Write `count` elements in order; the errno of each one that failed, by index.
        After element i fails, writing goes on at `resume(i)`."""
        errors: dict[int, int] = {}
        start = 0
        while start < count:
            unsupported = False
            if self.batched:
                done, err = self._update_batch(keys, values, start, count - start)
                if not err:
                    break
                start += done  # the kernel wrote these before the failing one
                unsupported = not done and err in _BATCH_UNSUPPORTED
            # Element `start` failed in a batch (or batches are off): alone, it says why.
            err = self._update_one(keys, values, start)
            if not err:
                self.batched = self.batched and not unsupported
                start += 1
                continue
            errors[start] = err
            start = resume(start)
        return errors

    def _update_batch(self, keys: int, values: int, start: int, count: int) -> tuple[int, int]:
        """(elements written, errno of the one that failed or 0)."""
        done = ct.c_uint32(count)
        key, value = self._key(keys, start), self._value(values, start)
        if lib.bpf_update_batch(self.fd, key, value, ct.byref(done)) == 0:
            return done.value, 0
        return done.value, ct.get_errno()

    def _update_one(self, keys: int, values: int, index: int) -> int:
        """errno of writing one element, or 0."""
        key, value = self._key(keys, index), self._value(values, index)
        return 0 if lib.bpf_update_elem(self.fd, key, value, BPF_ANY) == 0 else ct.get_errno()

    def lookup_all(self) -> tuple[bytes, bytes, int] | None:
        """Every key and value of a hash map with BPF_MAP_LOOKUP_BATCH: (keys laid out
        contiguously, values likewise, count); None when the kernel has no batch lookup
        for this map (use raw_items)."""
        keys = ct.create_string_buffer(LOOKUP_CHUNK * self.key_size)
        values = ct.create_string_buffer(LOOKUP_CHUNK * self.value_size)
        # Where a batch ends is opaque: a bucket number (u32) for a hash map, the last key
        # for other map types. Room for either.
        size = max(self.key_size, 8)
        position, next_position = ct.create_string_buffer(size), ct.create_string_buffer(size)
        key_chunks: list[bytes] = []
        value_chunks: list[bytes] = []
        total = 0
        while True:
            count = ct.c_uint32(LOOKUP_CHUNK)
            res = lib.bpf_lookup_batch(
                self.fd,
                ct.cast(position, ct.POINTER(ct.c_uint32)) if total else None,
                ct.cast(next_position, ct.POINTER(ct.c_uint32)),
                ct.addressof(keys),
                ct.addressof(values),
                ct.byref(count),
            )
            err = ct.get_errno() if res < 0 else 0
            if res < 0 and err != errno.ENOENT:  # ENOENT: the last elements are in
                if not total and err in _BATCH_UNSUPPORTED:
                    self.batched = False
                    return None
                raise _errno_error("batch lookup", err)
            key_chunks.append(keys.raw[: count.value * self.key_size])
            value_chunks.append(values.raw[: count.value * self.value_size])
            total += count.value
            if res < 0 or not count.value:
                return b"".join(key_chunks), b"".join(value_chunks), total
            ct.memmove(position, next_position, size)

    def _key(self, base: int, index: int) -> ct.c_void_p:
        return ct.c_void_p(base + index * self.key_size)

    def _value(self, base: int, index: int) -> ct.c_void_p:
        return ct.c_void_p(base + index * self.value_size)


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
        self.io = ElementIO(pinned.fd, pinned.info.key_size, pinned.info.value_size)

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
            raise self._update_error(key, ct.get_errno())

    def put_many(self, items: Sequence[tuple[K, V]]) -> dict[int, MapError]:
        if not items:
            return {}
        keys = self._key.to_buffer([k for k, _ in items])
        values = self._value.to_buffer([v for _, v in items])
        errors = self.io.update(_address(keys), _address(values), len(items))
        return {i: self._update_error(items[i][0], err) for i, err in errors.items()}

    def _update_error(self, key: K, err: int) -> MapError:
        if err == errno.E2BIG:
            return MapFullError(self.name, self.capacity, str(key))
        return _errno_error(f"update {self.name}[{key}]", err)

    def delete(self, key: K) -> bool:
        raw_key = self._key.encode(key)
        if lib.bpf_delete_elem(self.pinned.fd, ct.byref(raw_key)) < 0:
            if ct.get_errno() == errno.ENOENT:
                return False
            raise _errno_error(f"delete {self.name}[{key}]")
        return True

    def items(self) -> Iterator[tuple[K, V]]:
        found = self.io.lookup_all() if self.io.batched else None
        if found is None:
            pairs = list(raw_items(self.pinned.fd, self._key.ctype, self._value.ctype))
            found = (
                b"".join(bytes(k) for k, _ in pairs),
                b"".join(bytes(v) for _, v in pairs),
                len(pairs),
            )
        keys, values, count = found
        return zip(
            self._key.from_bytes(keys, count), self._value.from_bytes(values, count), strict=True
        )

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
    """The Maglev slot pool array (two slots per element).

    Mapped into memory when the array was created with BPF_F_MMAPABLE (the maps header
    asks for it): tables are then written and read as a numpy array over the kernel's own
    pages, the way a BPF program sees them. A pool pinned without the flag (by an older
    ebpflb) is written with BPF_MAP_UPDATE_BATCH and read with BPF_MAP_LOOKUP_BATCH.
    """

    def __init__(self, pinned: PinnedMap) -> None:
        self.pinned = pinned
        self.name = pinned.name
        self.capacity = pinned.capacity * SLOTS_PER_ELEMENT
        self.io = ElementIO(pinned.fd, pinned.info.key_size, pinned.info.value_size)
        self._mmap: mmap.mmap | None = None
        self._slots: SlotArray | None = None  # the mapped pool, one uint32 per slot
        if pinned.info.flags & BPF_F_MMAPABLE:
            size = self.capacity * np.dtype(np.uint32).itemsize
            try:
                self._mmap = mmap.mmap(pinned.fd, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE)
            except OSError as exc:
                raise MapError(f"cannot map {pinned.path} into memory: {exc.strerror}") from exc
            self._slots = np.frombuffer(self._mmap, dtype=np.uint32, count=self.capacity)

    @property
    def mapped(self) -> bool:
        return self._slots is not None

    def write(
        self, offset: int, table: SlotArray, changed: npt.NDArray[np.int64] | None = None
    ) -> None:
        write_one(self, SlotWrite(offset, table, changed))

    def write_many(self, writes: Sequence[SlotWrite]) -> dict[int, MapError]:
        failures: dict[int, MapError] = {}
        fitting = []
        for index, write in enumerate(writes):
            if write.offset % SLOTS_PER_ELEMENT:
                failures[index] = MapError(f"{self.name}: table offset {write.offset} is odd")
            elif write.offset + len(write.table) > self.capacity:
                failures[index] = MapError(
                    f"{self.name}: slot {write.offset + len(write.table)} beyond capacity"
                    f" {self.capacity}"
                )
            else:
                fitting.append(index)
        if self._slots is not None:
            for index in fitting:
                self._store(self._slots, writes[index])
        else:
            failures.update(self._update_batch(writes, fitting))
        return dict(sorted(failures.items()))

    @staticmethod
    def _store(slots: SlotArray, write: SlotWrite) -> None:
        """Memory stores of 4-byte slots, like the kernel's own element update: a reader
        sees each slot old or new, never torn."""
        start = write.offset
        if write.changed is None:
            slots[start : start + len(write.table)] = write.table
            if len(write.table) % SLOTS_PER_ELEMENT:
                slots[start + len(write.table)] = 0  # the padding slot, as a pair write has it
        else:
            slots[start + write.changed] = write.table[write.changed]

    def _update_batch(self, writes: Sequence[SlotWrite], indexes: list[int]) -> dict[int, MapError]:
        """All the writes' elements in one BPF_MAP_UPDATE_BATCH (more after a failure)."""
        if not indexes:
            return {}
        pairs = [slot_pairs(writes[i].offset, writes[i].table, writes[i].changed) for i in indexes]
        keys = np.concatenate([k for k, _ in pairs])
        values = np.concatenate([v for _, v in pairs])
        ends = np.cumsum([len(k) for k, _ in pairs])  # element after each write's last

        def after_write_of(element: int) -> int:
            """The next write's first element: the rest of a failed write is not needed."""
            return int(ends[np.searchsorted(ends, element, side="right")])

        errors = self.io.update(
            keys.ctypes.data, values.ctypes.data, len(keys), resume=after_write_of
        )
        failures = {}
        for element, err in errors.items():
            index = indexes[int(np.searchsorted(ends, element, side="right"))]
            failures[index] = _errno_error(
                f"batch update of {len(writes[index].table)} slots at {writes[index].offset}"
                f" in {self.name}",
                err,
            )
        return failures

    def read(self, offset: int, count: int) -> SlotArray:
        if self._slots is not None:
            view = self._slots[offset : offset + count]
            view.flags.writeable = False
            return view
        return self._read_batch(offset, count)

    def _read_batch(self, offset: int, count: int) -> SlotArray:
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

    def close(self) -> None:
        """Unmap the pool; views handed out keep the mapping alive until they are gone."""
        self._slots = None
        if self._mmap is not None:
            # A view still referenced keeps the mapping: it goes with the last one.
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None


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
        self.slots.close()
        for pinned in self._pins.values():
            pinned.close()

    def __enter__(self) -> KernelMapSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
