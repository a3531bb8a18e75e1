"""The contract (ebpflb/datapath/contract.py) against what the kernel really gets: for every
map, the key and value mirrors against the Key/Leaf types BCC generates from the C source
(Cilium's alignchecker idea: same size, same field names, offsets and sizes), and the
pinned map's type, sizes, max_entries and flags against the contract's table."""

from __future__ import annotations

import ctypes as ct
import dataclasses
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ebpflb.config import Config
from ebpflb.datapath import bpfsys, contract, growable, loader
from ebpflb.datapath.contract import MapName
from ebpflb.datapath.pins import ensure_bpffs, expected_map_layout, pinned_layout

# Every size different, so a map following the wrong size is caught.
CONFIG = Config(
    slot_pool_size=1024,
    maglev_max_table_size=1021,
    max_services=16,
    max_backends=24,
    rev_sk_max=40,
    ct_max=56,
    rnat_max=72,
    src_range_max=88,
)


def fields(struct: type) -> list[tuple[str, int, int]]:
    """(name, offset, size) of each field; a scalar is one unnamed field."""
    if not hasattr(struct, "_fields_"):
        return [("", 0, ct.sizeof(struct))]
    return [
        (name, getattr(struct, name).offset, getattr(struct, name).size)
        for name, *_ in struct._fields_
    ]


@pytest.fixture(scope="module")
def compiled() -> Iterator[tuple[Path, dict[str, object]]]:
    """Both program files compiled into one private pin directory; BCC's table of every
    map (from the file that declares it first)."""
    pins = Path("/sys/fs/bpf") / f"ebpflb-layout-{uuid.uuid4().hex[:8]}"
    config = dataclasses.replace(CONFIG, bpffs_dir=pins)
    ensure_bpffs(pins)
    growable.ensure(config)  # as the loader does: BCC opens the pinned ref maps
    flags = config.cflags() + loader.Features(False).cflags()
    programs = [
        loader.compile_program(loader.BPF_DIR / source, flags)
        for source in ("sock_lb.c", "nodeport.c")
    ]
    tables: dict[str, object] = {}
    try:
        for bpf in programs:
            for name in MapName:
                try:
                    tables.setdefault(name.value, bpf[name.value.encode()])
                except KeyError:
                    continue
        yield pins, tables
    finally:
        for bpf in programs:
            bpf.cleanup()
        for pin in pins.iterdir():
            pin.unlink()
        pins.rmdir()


@pytest.mark.parametrize(
    "name", [m for m in MapName if m not in contract.GROWABLE], ids=lambda m: m.value
)
def test_mirrors_match_bcc_types(compiled: tuple[Path, dict[str, object]], name: MapName) -> None:
    _, tables = compiled
    assert name.value in tables, f"{name.value} is not declared in bpf/lib/maps.h"
    table = tables[name.value]
    spec = contract.MAPS[name]
    # Per-CPU tables expose the per-CPU array as Leaf and one CPU's value as sLeaf.
    leaf = getattr(table, "sLeaf", table.Leaf)  # type: ignore[attr-defined]
    for mine, bccs in ((spec.key, table.Key), (spec.value, leaf)):  # type: ignore[attr-defined]
        assert ct.sizeof(mine) == ct.sizeof(bccs), f"{name.value}: {mine} vs {bccs}"
        assert fields(mine) == fields(bccs), f"{name.value}: field layout differs"


@pytest.mark.parametrize("name", list(MapName), ids=lambda m: m.value)
def test_pinned_maps_have_the_contract_layout(
    compiled: tuple[Path, dict[str, object]], name: MapName
) -> None:
    pins, _ = compiled
    config = dataclasses.replace(CONFIG, bpffs_dir=pins)
    fd = bpfsys.obj_get(str(pins / name.value))
    try:
        info = bpfsys.map_info(fd, name.value)
    finally:
        os.close(fd)
    actual = contract.MapLayout(
        info.type, info.key_size, info.value_size, info.max_entries, info.flags
    )
    assert actual == contract.MAPS[name].layout(config)
    assert pinned_layout(pins / name.value) == expected_map_layout(config)[name.value]


@pytest.mark.parametrize("name", list(contract.GROWABLE), ids=lambda m: m.value)
def test_a_growable_map_is_the_one_its_ref_map_holds(
    compiled: tuple[Path, dict[str, object]], name: MapName
) -> None:
    """The programs reach the map through its ref map: both pins name the same map."""
    pins, _ = compiled
    fd = bpfsys.obj_get(str(pins / name.value))
    ref = bpfsys.obj_get(str(pins / contract.GROWABLE[name].value))
    try:
        assert growable._ref_get(ref, "ref") == bpfsys.map_info(fd, name.value).id
    finally:
        os.close(fd)
        os.close(ref)
