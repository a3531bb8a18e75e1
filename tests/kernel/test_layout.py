"""The ctypes mirrors in ebpflb/datapath/layout.py against the types BCC generates from
bpf/lib/structs.h (Cilium's alignchecker idea): same size, same field offsets and sizes."""

from __future__ import annotations

import ctypes as ct
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ebpflb.config import Config
from ebpflb.datapath import layout, loader
from ebpflb.datapath.maps import MapName

MIRRORS = {
    MapName.SERVICES: (layout.Lb4SvcKey, layout.Lb4SvcVal),
    MapName.BACKENDS: (ct.c_uint32, layout.Lb4Backend),
    MapName.SLOTS: (ct.c_uint32, layout.Lb4SlotPair),
    MapName.SERVICE_META: (ct.c_uint32, layout.Lb4SvcMeta),
    MapName.REVERSE_SOCK: (layout.Lb4RevskKey, layout.Lb4RevskVal),
    MapName.STATS: (ct.c_uint32, ct.c_uint64),
}


def fields(struct: type) -> list[tuple[str, int, int]]:
    """(name, offset, size) of each field; a scalar is one unnamed field."""
    if not hasattr(struct, "_fields_"):
        return [("", 0, ct.sizeof(struct))]
    return [
        (name, getattr(struct, name).offset, getattr(struct, name).size)
        for name, *_ in struct._fields_
    ]


@pytest.fixture(scope="module")
def compiled() -> Iterator[object]:
    pins = Path("/sys/fs/bpf") / f"ebpflb-layout-{uuid.uuid4().hex[:8]}"
    config = Config(
        bpffs_dir=pins,
        slot_pool_size=1024,
        maglev_max_table_size=1021,
        max_services=16,
        max_backends=16,
        rev_sk_max=16,
    )
    loader.ensure_bpffs(pins)
    bpf = loader.compile_program(
        loader.BPF_DIR / "sock_lb.c", config.cflags() + loader.Features(False).cflags()
    )
    try:
        yield bpf
    finally:
        bpf.cleanup()
        for pin in pins.iterdir():
            pin.unlink()
        pins.rmdir()


@pytest.mark.parametrize("name", list(MIRRORS), ids=lambda m: m.value)
def test_mirrors_match_bcc_types(compiled: object, name: MapName) -> None:
    table = compiled[name.value.encode()]  # type: ignore[index]
    key, leaf = MIRRORS[name]
    # Per-CPU tables expose the per-CPU array as Leaf and one CPU's value as sLeaf.
    for mine, bccs in ((key, table.Key), (leaf, getattr(table, "sLeaf", table.Leaf))):
        assert ct.sizeof(mine) == ct.sizeof(bccs), f"{name.value}: {mine} vs {bccs}"
        assert fields(mine) == fields(bccs), f"{name.value}: field layout differs"


def test_counter_enum_matches_consts_header() -> None:
    header = (loader.BPF_DIR / "lib" / "consts.h").read_text()
    for counter in layout.Counter:
        assert f"#define STAT_{counter.name} " in header
        line = next(x for x in header.splitlines() if x.startswith(f"#define STAT_{counter.name} "))
        assert int(line.split()[2]) == counter.value
    assert f"#define STAT_MAX             {layout.STATS_SIZE}" in header
