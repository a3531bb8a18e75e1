"""ebpflb_svcstats over its pin: per-CPU counters of each frontend, by service id
(ServiceCounterMap protocol).

A scrape reads ids 1..upto with BPF_MAP_LOOKUP_BATCH (service ids are dense, so that is
about the number of frontends, not the map's capacity) and sums the CPUs with numpy; a
reset writes zeros on every CPU in one BPF_MAP_UPDATE_BATCH.
"""

from __future__ import annotations

import ctypes as ct
import errno
from collections.abc import Sequence
from dataclasses import fields

import numpy as np
import numpy.typing as npt

from ebpflb.datapath import contract
from ebpflb.datapath.maps import ServiceCounters
from ebpflb.datapath.maps.elementio import _BATCH_UNSUPPORTED, ElementIO, errno_error
from ebpflb.datapath.syscall import bpfsys
from ebpflb.errors import MapError

FIELDS = tuple(f.name for f in fields(ServiceCounters))
READ_CHUNK = 4096  # elements per batch lookup
Sums = npt.NDArray[np.uint64]


class KernelServiceCounters:
    def __init__(self, fd: int, name: str, capacity: int, ncpus: int) -> None:
        self.name = name
        self.capacity = capacity
        self._fd = fd
        self._ncpus = ncpus
        # The kernel copies a per-CPU value for every possible CPU, each rounded to 8 bytes.
        self._per_cpu = -(-ct.sizeof(contract.LbSvcStats) // 8) * 8
        self._io = ElementIO(fd, name, 4, self._per_cpu * ncpus)

    def _sum(self, raw: bytes, count: int) -> Sums:
        """(count, fields) counters summed over CPUs from `count` per-CPU values."""
        words = self._per_cpu // 8
        values = np.frombuffer(raw, dtype=np.uint64, count=count * self._ncpus * words)
        summed: Sums = values.reshape(count, self._ncpus, words)[:, :, : len(FIELDS)].sum(axis=1)
        return summed

    def get(self, svc_id: int) -> ServiceCounters:
        key = ct.c_uint32(svc_id)
        raw = ct.create_string_buffer(self._io.value_size)
        err = bpfsys.lookup_elem(self._fd, ct.addressof(key), ct.addressof(raw))
        if err:
            raise errno_error(f"lookup {self.name}[{svc_id}]", err)
        return ServiceCounters(*(int(v) for v in self._sum(raw.raw, 1)[0]))

    def read(self, upto: int) -> dict[int, ServiceCounters]:
        upto = min(upto, self.capacity - 1)
        if upto < 1:
            return {}
        found: dict[int, ServiceCounters] = {}
        for start in range(1, upto + 1, READ_CHUNK):
            count = min(READ_CHUNK, upto + 1 - start)
            keys, sums = self._read_range(start, count)
            for index in np.flatnonzero(sums.any(axis=1)).tolist():
                found[int(keys[index])] = ServiceCounters(*(int(v) for v in sums[index]))
        return found

    def _read_range(self, start: int, count: int) -> tuple[npt.NDArray[np.uint32], Sums]:
        """Keys and CPU-summed counters of elements start..start+count-1."""
        if self._io.batched:
            keys = (ct.c_uint32 * count)()
            values = ct.create_string_buffer(count * self._io.value_size)
            # An array batch resumes after the key in `position`: start - 1 (never -1: ids
            # start at 1, and element 0 is skipped by starting there).
            position, next_position = ct.c_uint32(start - 1), ct.c_uint32(0)
            err, n = bpfsys.lookup_batch(
                self._fd,
                ct.addressof(position),
                ct.addressof(next_position),
                ct.addressof(keys),
                ct.addressof(values),
                count,
            )
            if not err or err == errno.ENOENT:
                ids = np.frombuffer(bytes(keys), dtype=np.uint32, count=n)
                return ids, self._sum(values.raw, n)
            if err not in _BATCH_UNSUPPORTED:
                raise errno_error(f"batch lookup in {self.name}", err)
            self._io.batched = False
        ids = np.arange(start, start + count, dtype=np.uint32)
        sums = np.array([list(self._as_tuple(self.get(int(i)))) for i in ids], dtype=np.uint64)
        return ids, sums.reshape(count, len(FIELDS))

    @staticmethod
    def _as_tuple(counters: ServiceCounters) -> tuple[int, ...]:
        return tuple(getattr(counters, name) for name in FIELDS)

    def reset(self, svc_ids: Sequence[int]) -> dict[int, MapError]:
        if not svc_ids:
            return {}
        keys = (ct.c_uint32 * len(svc_ids))(*svc_ids)
        zeros = ct.create_string_buffer(len(svc_ids) * self._io.value_size)
        errors = self._io.update(ct.addressof(keys), ct.addressof(zeros), len(svc_ids))
        return {i: errno_error(f"reset {self.name}[{svc_ids[i]}]", e) for i, e in errors.items()}
