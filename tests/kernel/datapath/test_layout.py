"""The contract (ebpflb/datapath/contract/) against what the kernel really gets: for every
map, the key and value mirrors against the Key/Leaf types BCC generates from the C source
(Cilium's alignchecker idea: same size, same field names, offsets and sizes), and the
pinned map's type, sizes, max_entries and flags against the contract's table."""

from __future__ import annotations

import ctypes as ct
import dataclasses
import json
import os
import uuid
from collections.abc import Iterator
from ipaddress import IPv4Address
from pathlib import Path
from types import SimpleNamespace

import pytest
from bcc import BPF
from bcc.libbcc import lib

from ebpflb.config import Config
from ebpflb.datapath import contract
from ebpflb.datapath.contract import MapName
from ebpflb.datapath.maps import BackendEntry, codecs, growable
from ebpflb.datapath.maps.elementio import ElementIO, raw_items
from ebpflb.datapath.maps.kernel import BackendArray
from ebpflb.datapath.maps.pinned import PinnedMap
from ebpflb.datapath.maps.pins import (
    drop_incompatible,
    ensure_bpffs,
    expected_map_layout,
    pinned_layout,
)
from ebpflb.datapath.programs import compiler, loader
from ebpflb.datapath.syscall import bpfsys
from ebpflb.model import Backend, BackendFlags, Proto

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


def bcc_types(bpf: BPF, name: str) -> object:
    """BCC's Key and Leaf types of a map, as its Table has them (BCC's Python has no Table
    class for socket storage: its types are decoded the way get_table decodes them)."""
    if contract.MAPS[MapName(name)].type is not contract.MapType.SK_STORAGE:
        return bpf[name.encode()]
    if lib.bpf_table_fd(bpf.module, name.encode()) < 0:
        raise KeyError(name)
    key, leaf = (
        BPF._decode_table_type(json.loads(describe(bpf.module, name.encode()).decode()))
        for describe in (lib.bpf_table_key_desc, lib.bpf_table_leaf_desc)
    )
    return SimpleNamespace(Key=key, Leaf=leaf)


@pytest.fixture(scope="module")
def compiled() -> Iterator[tuple[Path, dict[str, object]]]:
    """Both program files compiled into one private pin directory; BCC's table of every
    map (from the file that declares it first)."""
    pins = Path("/sys/fs/bpf") / f"ebpflb-layout-{uuid.uuid4().hex[:8]}"
    config = dataclasses.replace(CONFIG, bpffs_dir=pins)
    ensure_bpffs(pins)
    growable.ensure(config)  # as the loader does: BCC opens the pinned ref maps
    flags = contract.cflags(config) + loader.Features(False).cflags()
    programs = [
        compiler.compile_program(loader.BPF_DIR / source, flags)
        for source in ("sock_lb.c", "nodeport.c")
    ]
    tables: dict[str, object] = {}
    try:
        for bpf in programs:
            for name in MapName:
                try:
                    tables.setdefault(name.value, bcc_types(bpf, name.value))
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


def test_an_older_backend_hash_is_replaced_by_the_array_with_its_backends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Upgrading from an ebpflb whose ebpflb_be4 was a hash: the pin becomes an array
    holding the same backends at the same ids (so the restarted agent rewrites nothing and
    the new programs find them), with one log line; the old map itself lives on for the
    programs still attached to it."""
    pins = Path("/sys/fs/bpf") / f"ebpflb-upgrade-{uuid.uuid4().hex[:8]}"
    config = dataclasses.replace(CONFIG, bpffs_dir=pins)
    ensure_bpffs(pins)
    path = pins / MapName.BACKENDS.value
    spec = contract.MAPS[MapName.BACKENDS]
    old = bpfsys.map_create(
        contract.MapType.HASH, 4, 8, config.max_backends, "an old backend hash", name=path.name
    )
    backends = {
        1: BackendEntry(Backend(IPv4Address("10.244.1.11"), 8080, Proto.TCP)),
        7: BackendEntry(Backend(IPv4Address("10.244.1.12"), 53, Proto.UDP), BackendFlags.LOCAL),
        config.max_backends: BackendEntry(Backend(IPv4Address("10.244.1.13"), 80, Proto.TCP)),
    }
    try:
        keys = codecs.U32.to_buffer(list(backends))
        values = codecs.BACKEND.to_buffer(list(backends.values()))
        io = ElementIO(old, path.name, 4, 8)
        assert io.update(codecs.address_of(keys), codecs.address_of(values), 3) == {}
        bpfsys.obj_pin(old, str(path))
        with caplog.at_level("WARNING", logger="ebpflb.datapath.maps.pins"):
            assert drop_incompatible(config) == []
        assert pinned_layout(path) == spec.layout(config)
        (line,) = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
        assert "replaced by an array" in line and "3 of 3 backends carried over" in line
        pinned = PinnedMap(path)
        try:
            array = BackendArray(pinned, codecs.U32, codecs.BACKEND)
            assert dict(array.items()) == backends
            assert array.get(2) is None and len(array) == 3
        finally:
            pinned.close()
        # The old hash still holds them for the programs that use it until replaced.
        assert (
            dict(
                (int(k.value), codecs.BACKEND.decode(v))
                for k, v in raw_items(old, ct.c_uint32, contract.Lb4Backend)
            )
            == backends
        )
    finally:
        os.close(old)
        for pin in pins.iterdir():
            pin.unlink()
        pins.rmdir()


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
