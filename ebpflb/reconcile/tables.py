"""Maglev tables in backend ids, built for many plans with one compiled call.

Plans with the same backends, weights and size (a port's ClusterIP and NodePorts) share
one table. A plan whose table cannot be built fails alone: when the batched build raises,
the tables are built one by one and only the ones that raise fail.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import numpy as np

from ebpflb import maglev
from ebpflb.datapath.maps import SlotArray
from ebpflb.errors import MaglevError
from ebpflb.model import Backend
from ebpflb.reconcile.records import Plan
from ebpflb.reconcile.state import EMPTY_TABLE, BackendIds, table_ids


def maglev_name(backend: Backend) -> str:
    """str(backend), the name Maglev hashes, without ipaddress's slow formatting."""
    packed = backend.address.packed
    if len(packed) == 4:
        return f"{socket.inet_ntoa(packed)}:{backend.port}"
    return str(backend)  # IPv6: "[address]:port"


def build_tables(
    plans: Sequence[Plan], seed: str
) -> tuple[list[SlotArray], dict[int, MaglevError]]:
    """Each plan's table in backend ids, and the plans whose table failed, by index (their
    table is empty)."""
    unique: dict[tuple[int, tuple[int, ...], tuple[int, ...]], int] = {}
    specs: list[Plan] = []
    which = []
    for plan in plans:
        key = (plan.size, plan.ids, tuple(b.weight for b in plan.usable))
        if key not in unique:
            unique[key] = len(specs)
            specs.append(plan)
        which.append(unique[key])
    names = [[maglev_name(b.backend) for b in spec.usable] for spec in specs]
    weighted = [
        dict(zip(spec_names, (b.weight for b in spec.usable), strict=True))
        for spec, spec_names in zip(specs, names, strict=True)
    ]
    built: list[maglev.MaglevTable | MaglevError]
    try:
        built = list(maglev.build_tables(weighted, [s.size for s in specs], seed=seed))
    except MaglevError:
        built = [
            _build_one(backends, spec.size, seed)
            for backends, spec in zip(weighted, specs, strict=True)
        ]
    in_ids: list[SlotArray | MaglevError] = []
    for spec, spec_names, built_table in zip(specs, names, built, strict=True):
        if isinstance(built_table, MaglevError):
            in_ids.append(built_table)
            continue
        by_name = dict(zip(spec_names, spec.ids, strict=True))
        id_of_index = np.array([by_name[n] for n in built_table.backends], dtype=np.uint32)
        in_ids.append(id_of_index[built_table.slots])
    tables: list[SlotArray] = []
    failures: dict[int, MaglevError] = {}
    for index, spec_index in enumerate(which):
        table = in_ids[spec_index]
        if isinstance(table, MaglevError):
            failures[index] = table
            tables.append(EMPTY_TABLE)
        else:
            tables.append(table)
    return tables, failures


def _build_one(backends: dict[str, int], size: int, seed: str) -> maglev.MaglevTable | MaglevError:
    try:
        return maglev.build_table(backends, size, seed=seed)
    except MaglevError as exc:
        return exc


def ids_in(plan: Plan, table: SlotArray) -> BackendIds:
    """The backend ids a plan's table names. With equal weights every backend takes a slot
    each round, so all of them; with unequal ones a light backend may get none."""
    if len({b.weight for b in plan.usable}) == 1:
        return tuple(sorted(plan.ids))
    return table_ids(table)
