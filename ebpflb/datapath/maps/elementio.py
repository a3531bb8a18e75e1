"""Raw element reads and writes on one map fd, in as few syscalls as the kernel allows.

Many writes go in one BPF_MAP_UPDATE_BATCH and a whole map is read with
BPF_MAP_LOOKUP_BATCH (kernel 5.6+); where the kernel or a map type lacks them, found out
on first use, one syscall per element instead. Keys and values are contiguous byte
buffers laid out as the kernel wants them; what they mean is codecs.py's business.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
from collections.abc import Callable, Iterator
from typing import Any

from ebpflb.datapath.syscall import bpfsys
from ebpflb.datapath.syscall.uapi import BPF_ANY
from ebpflb.errors import MapError

# What a batch command answers where it does not exist: EINVAL before 5.6 (unknown
# command), ENOTSUPP (524, kernel-internal) or EOPNOTSUPP for a map type without it.
_BATCH_UNSUPPORTED = frozenset({errno.EINVAL, errno.EOPNOTSUPP, 524})
# Elements per BPF_MAP_LOOKUP_BATCH: a hash map answers ENOSPC if one bucket holds more.
LOOKUP_CHUNK = 4096


def errno_error(what: str, err: int) -> MapError:
    """MapError for a failed element command."""
    return MapError(f"{what}: {os.strerror(err)}")


class ElementIO:
    """Element writes and whole-map reads on one map fd, batched where the kernel can.

    Buffers are addresses of contiguous key and value arrays; the caller keeps them alive.
    `batched` turns False the first time the kernel refuses a batch command that the
    same element then passes alone (a kernel before 5.6, or a map type without batches).
    """

    def __init__(self, fd: int, name: str, key_size: int, value_size: int) -> None:
        self.fd = fd
        self.name = name
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
        key, value = self._key(keys, start), self._value(values, start)
        err, done = bpfsys.update_batch(self.fd, key, value, count)
        if not err:
            return done, 0
        # A failing batch reports how many elements it wrote before the failure; a kernel
        # that refuses the command outright (5.10 for an LPM trie) leaves the count as it
        # was asked, which would read as "all written" and skip past the end.
        return (0 if done >= count else done), err

    def _update_one(self, keys: int, values: int, index: int) -> int:
        """errno of writing one element, or 0."""
        key, value = self._key(keys, index), self._value(values, index)
        return bpfsys.update_elem(self.fd, key, value, BPF_ANY)

    def read_all(self, key_type: Any, value_type: Any) -> tuple[bytes, bytes, int]:
        """Every key and value (keys laid out contiguously, values likewise, count): one
        BPF_MAP_LOOKUP_BATCH per LOOKUP_CHUNK elements, else a walk with get_next_key."""
        found = self._lookup_all() if self.batched else None
        if found is None:
            pairs = list(raw_items(self.fd, key_type, value_type))
            found = (
                b"".join(bytes(k) for k, _ in pairs),
                b"".join(bytes(v) for _, v in pairs),
                len(pairs),
            )
        return found

    def _lookup_all(self) -> tuple[bytes, bytes, int] | None:
        """read_all with BPF_MAP_LOOKUP_BATCH; None when the kernel has none for this map."""
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
            err, count = bpfsys.lookup_batch(
                self.fd,
                ct.addressof(position) if total else 0,
                ct.addressof(next_position),
                ct.addressof(keys),
                ct.addressof(values),
                LOOKUP_CHUNK,
            )
            if err and err != errno.ENOENT:  # ENOENT: the last elements are in
                if not total and err in _BATCH_UNSUPPORTED:
                    self.batched = False
                    return None
                raise errno_error(f"batch lookup in {self.name}", err)
            key_chunks.append(keys.raw[: count * self.key_size])
            value_chunks.append(values.raw[: count * self.value_size])
            total += count
            if err or not count:
                return b"".join(key_chunks), b"".join(value_chunks), total
            ct.memmove(position, next_position, size)

    def _key(self, base: int, index: int) -> int:
        return base + index * self.key_size

    def _value(self, base: int, index: int) -> int:
        return base + index * self.value_size


def raw_keys(fd: int, key_type: Any) -> Iterator[Any]:
    """Every key of a hash map, as ctypes values (a snapshot walk with get_next_key)."""
    key = key_type()
    if bpfsys.get_next_key(fd, 0, ct.addressof(key)):
        return
    while True:
        yield key
        next_key = key_type()
        if bpfsys.get_next_key(fd, ct.addressof(key), ct.addressof(next_key)):
            return
        key = next_key


def raw_items(fd: int, key_type: Any, value_type: Any) -> Iterator[tuple[Any, Any]]:
    """Every (key, value) of a hash map, as ctypes values; keys deleted meanwhile skipped."""
    for raw_key in raw_keys(fd, key_type):
        raw_value = value_type()
        if not bpfsys.lookup_elem(fd, ct.addressof(raw_key), ct.addressof(raw_value)):
            yield raw_key, raw_value


def delete(fd: int, key: Any, what: str) -> bool:
    """Delete one key (a ctypes value); False when it was not there (not an error)."""
    err = bpfsys.delete_elem(fd, ct.addressof(key))
    if not err:
        return True
    if err == errno.ENOENT:
        return False
    raise errno_error(f"delete {what}", err)


def count_entries(io: ElementIO, limit: int) -> int:
    """How many elements the map holds, at most `limit` (its max_entries: a bound, since the
    programs keep inserting meanwhile). Exact, by BPF_MAP_LOOKUP_BATCH in chunks of
    LOOKUP_CHUNK into one reused buffer: the kernel has no keys-only batch and no element
    count for user space, so values are copied too, and nothing is decoded or kept. Without
    batches (before 5.6, or an LPM trie), one get_next_key per element."""
    if io.batched:
        counted = _count_batched(io, limit)
        if counted is not None:
            return counted
    key = ct.create_string_buffer(max(io.key_size, 1))
    next_key = ct.create_string_buffer(max(io.key_size, 1))
    if bpfsys.get_next_key(io.fd, 0, ct.addressof(key)):
        return 0
    total = 1
    while total < limit and not bpfsys.get_next_key(
        io.fd, ct.addressof(key), ct.addressof(next_key)
    ):
        key, next_key = next_key, key
        total += 1
    return total


def _count_batched(io: ElementIO, limit: int) -> int | None:
    keys = ct.create_string_buffer(LOOKUP_CHUNK * io.key_size)
    values = ct.create_string_buffer(LOOKUP_CHUNK * io.value_size)
    size = max(io.key_size, 8)  # a batch's position: see ElementIO._lookup_all
    position, next_position = ct.create_string_buffer(size), ct.create_string_buffer(size)
    total = 0
    first = True
    while total < limit:
        err, count = bpfsys.lookup_batch(
            io.fd,
            0 if first else ct.addressof(position),
            ct.addressof(next_position),
            ct.addressof(keys),
            ct.addressof(values),
            LOOKUP_CHUNK,
        )
        if err and err != errno.ENOENT:
            if first and err in _BATCH_UNSUPPORTED:
                return None
            raise errno_error(f"batch lookup in {io.name}", err)
        total += count
        if err or not count:
            break
        first = False
        ct.memmove(position, next_position, size)
    return min(total, limit)
