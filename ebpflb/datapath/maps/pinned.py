"""One pinned map, open: its fd and what the kernel says it is (BPF_OBJ_GET_INFO_BY_FD),
checked against the contract. KernelMapSet (kernel.py) opens every map this way, the slot
pool (slotpool.py) reopens its map after a grow, and `explain` opens the affinity map."""

from __future__ import annotations

import ctypes as ct
import os
from pathlib import Path

from ebpflb.datapath import contract
from ebpflb.datapath.syscall import bpfsys
from ebpflb.errors import MapError


class PinnedMap:
    """An open fd on a pinned map, closed with close() (or by the owning MapSet)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = path.name
        try:
            self.fd = bpfsys.obj_get(str(path))
        except bpfsys.BpfError as exc:
            raise MapError(f"cannot open pinned map {path}: {os.strerror(exc.errno)}") from exc
        try:
            self.info = bpfsys.map_info(self.fd, self.name)
        except bpfsys.BpfError as exc:
            os.close(self.fd)
            raise MapError(str(exc)) from exc
        self.capacity = self.info.max_entries

    def check(self, spec: contract.MapSpec) -> None:
        """MapError unless the pin holds what the contract says this map holds."""
        if self.info.type != spec.type:
            raise MapError(
                f"{self.path}: a map of type {self.info.type} in the kernel, "
                f"{spec.type.c_name} expected"
            )
        for side, ctype, size in (
            ("key", spec.key, self.info.key_size),
            ("value", spec.value, self.info.value_size),
        ):
            if ct.sizeof(ctype) != size:
                raise MapError(
                    f"{self.path}: {side} size {size} in the kernel, "
                    f"{ct.sizeof(ctype)} expected (pinned by another ebpflb version?)"
                )

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
