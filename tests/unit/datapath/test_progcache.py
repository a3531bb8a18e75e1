"""The program cache's pure parts: finding and rewriting map fds in bytecode, entries."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ebpflb.datapath.programs import progcache
from ebpflb.datapath.syscall import uapi


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def ld_map(dst: int, fd: int) -> bytes:
    return insn(0x18, dst, uapi.BPF_PSEUDO_MAP_FD, imm=fd) + insn(0)


CODE = ld_map(1, 7) + insn(0xB7, 2, imm=5) + ld_map(3, 9) + ld_map(1, 7) + insn(0x95)


def test_map_fds_in_order_of_first_use() -> None:
    assert progcache.map_fds(CODE) == [7, 9]
    assert progcache.map_fds(insn(0xB7, imm=1) + insn(0x95)) == []


def test_an_unknown_pseudo_load_is_not_cached() -> None:
    map_value = insn(0x18, 1, 2, imm=7) + insn(0)  # BPF_PSEUDO_MAP_VALUE: global data
    assert progcache.map_fds(map_value + insn(0x95)) is None


def test_patching_rewrites_only_map_loads() -> None:
    patched = progcache.patch_map_fds(CODE, {7: 100, 9: 200})
    assert progcache.map_fds(patched) == [100, 200]
    assert patched[16:24] == CODE[16:24]  # mov r2, 5 untouched
    assert len(patched) == len(CODE)


def test_an_entry_survives_json() -> None:
    entry = progcache.Entry(
        (progcache.MapRecord("ebpflb_svc4", 1, 8, 16, 64, 0),),
        {"ebpflb_connect4": (progcache.patch_map_fds(CODE, {7: 0, 9: 0}), (0,))},
    )
    assert progcache.Entry.from_json(entry.to_json()) == entry


def test_a_corrupt_or_foreign_entry_is_a_miss(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    assert progcache.load(tmp_path / "bad.json") is None
    (tmp_path / "old.json").write_text('{"format": 0, "maps": [], "functions": {}}')
    assert progcache.load(tmp_path / "old.json") is None
    assert progcache.load(tmp_path / "missing.json") is None


def test_the_key_follows_source_flags_and_programs() -> None:
    key = progcache.cache_key("src", ["-DA=1"], ["f"], "0.26")
    assert key == progcache.cache_key("src", ["-DA=1"], ["f"], "0.26")
    for other in (
        progcache.cache_key("src2", ["-DA=1"], ["f"], "0.26"),
        progcache.cache_key("src", ["-DA=2"], ["f"], "0.26"),
        progcache.cache_key("src", ["-DA=1"], ["g"], "0.26"),
        progcache.cache_key("src", ["-DA=1"], ["f"], "0.27"),
    ):
        assert other != key


def test_on_by_default_elsewhere_or_off_as_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(progcache.CACHE_ENV, raising=False)
    assert progcache.cache_dir() == Path("/var/lib/ebpflb/programs")
    monkeypatch.setenv(progcache.CACHE_ENV, "/tmp/x")
    assert progcache.cache_dir() == Path("/tmp/x")
    monkeypatch.setenv(progcache.CACHE_ENV, "")
    assert progcache.cache_dir() is None


def test_the_bcc_version_is_read_without_importing_bcc() -> None:
    import subprocess
    import sys

    version = progcache.bcc_version()
    assert version not in {"none", "unknown"} and version[0].isdigit()
    # In a fresh interpreter: this session's collection imports bcc for the kernel tests.
    code = (
        "import sys; from ebpflb.datapath.programs import progcache; progcache.bcc_version();"
        " print('bcc' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_an_entry_keeps_the_headers_it_was_compiled_with() -> None:
    maps = (progcache.MapRecord("ebpflb_svc4", 1, 12, 16, 4096, 1),)
    entry = progcache.Entry(maps, {"connect4": (b"\x00" * 8, ())}, "bundled /t (6.1.0-57-amd64)")
    assert progcache.Entry.from_json(entry.to_json()).headers == "bundled /t (6.1.0-57-amd64)"
    # An entry stored before the headers were recorded still loads, saying nothing of them.
    legacy = entry.to_json().replace(', "headers": "bundled /t (6.1.0-57-amd64)"', "")
    assert '"headers"' not in legacy
    assert progcache.Entry.from_json(legacy).headers == ""
