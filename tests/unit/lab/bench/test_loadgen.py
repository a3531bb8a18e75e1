"""The load generator's build cache and argument checks (gcc needed, root not)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ebpflb.errors import ConfigError, EbpflbError
from lab.bench import loadgen

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")


@needs_gcc
def test_build_reuses_the_binary_and_rebuilds_when_the_source_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    first = loadgen.build(cache)
    assert first.parent == cache and first.stat().st_mode & 0o111
    stamp = (first.stat().st_ino, first.stat().st_mtime_ns)

    # A cache hit never runs gcc: with gcc "gone", the same binary comes back untouched.
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert loadgen.build(cache) == first
    assert (first.stat().st_ino, first.stat().st_mtime_ns) == stamp
    monkeypatch.undo()

    changed = tmp_path / "connbench.c"
    changed.write_text(loadgen.SOURCE.read_text() + "/* changed */\n")
    second = loadgen.build(cache, source=changed)
    assert second != first and second.exists() and first.exists()
    assert sorted(p.name for p in cache.iterdir()) == sorted([first.name, second.name])
    usage = subprocess.run([second], capture_output=True, text=True)
    assert usage.returncode == 2 and "missing subcommand" in usage.stderr


def test_binary_name_depends_on_source_and_flags() -> None:
    name = loadgen.binary_name(b"int main(void) { return 0; }")
    assert name == loadgen.binary_name(b"int main(void) { return 0; }")
    assert name != loadgen.binary_name(b"int main(void) { return 1; }")
    assert name != loadgen.binary_name(b"int main(void) { return 0; }", ("-O0",))


def test_missing_gcc_names_the_debian_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="apt-get install gcc"):
        loadgen.build(tmp_path)


@needs_gcc
def test_a_compile_error_quotes_gcc_and_leaves_no_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("int main(void) { return undeclared; }\n")
    cache = tmp_path / "cache"
    with pytest.raises(EbpflbError, match="undeclared"):
        loadgen.build(cache, source=broken)
    assert list(cache.iterdir()) == []


@needs_gcc
@pytest.mark.parametrize(
    "args",
    [
        ["latency", "--port", "80", "--index", "1", "--connects", "5"],  # no --base
        ["latency", "--base", "10.0.0.0", "--port", "80", "--connects", "5"],  # no target
        ["latency", "--base", "10.0.0.0", "--port", "80", "--index", "1", "--random", "5"],
        ["latency", "--base", "10.0.0.0", "--port", "80", "--index", "1.5", "--connects", "5"],
        ["rate", "--base", "10.0.0.0", "--port", "80", "--index", "1"],  # no --seconds
        ["rate", "--base", "255.255.255.255", "--port", "80", "--index", "1", "--seconds", "1"],
        ["serve", "--port", "70000"],
        ["serve", "--port", "80", "--bogus", "1"],
    ],
)
def test_connbench_rejects_bad_arguments(tmp_path: Path, args: list[str]) -> None:
    done = subprocess.run([loadgen.build(tmp_path), *args], capture_output=True, text=True)
    assert done.returncode == 2, done
    assert done.stderr.startswith("connbench: ") and done.stdout == ""


def test_clients_need_exactly_one_target() -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        loadgen.latency("unused", "10.0.0.0", 80, 1)
    with pytest.raises(ConfigError, match="exactly one"):
        loadgen.rate("unused", "10.0.0.0", 80, 1, index=1, random_count=2)


def test_rate_is_connections_per_second() -> None:
    assert loadgen.RateResult(500, 2.0, 0, None).rate == 250
    assert loadgen.RateResult(0, 0.0, 3, "ECONNREFUSED: Connection refused").rate == 0
