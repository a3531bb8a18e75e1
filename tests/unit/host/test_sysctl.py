from __future__ import annotations

from pathlib import Path

import pytest

from ebpflb.host import sysctl


def _refuse(self: Path, data: str) -> int:
    raise OSError(30, "Read-only file system")


def _proc(tmp_path: Path, value: str | None) -> Path:
    path = tmp_path / sysctl.CLOSE_WAIT
    if value is not None:
        path.parent.mkdir(parents=True)
        path.write_text(value)
    return tmp_path


def test_sets_the_close_wait_timeout_as_kube_proxy(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "60\n")
    (outcome,) = sysctl.ensure_conntrack(3600, proc)
    assert outcome.ok and outcome.before == 60
    assert (proc / sysctl.CLOSE_WAIT).read_text() == "3600\n"


def test_a_right_value_is_not_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = _proc(tmp_path, "3600\n")
    monkeypatch.setattr(Path, "write_text", _refuse)  # a write would fail the outcome
    (outcome,) = sysctl.ensure_conntrack(3600, proc)
    assert outcome.ok and outcome.before == 3600


def test_absent_nf_conntrack_is_nothing_to_set(tmp_path: Path) -> None:
    (outcome,) = sysctl.ensure_conntrack(3600, _proc(tmp_path, None))
    assert outcome.ok and outcome.before is None


def test_a_read_only_proc_sys_is_an_error_naming_the_file(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "60\n")
    target = proc / sysctl.CLOSE_WAIT
    target.unlink()
    target.mkdir()  # reading works on no file of this kind: a directory cannot be written
    (outcome,) = sysctl.ensure_conntrack(3600, proc)
    assert not outcome.ok
    assert str(target) in (outcome.error or "")


def test_an_unwritable_value_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = _proc(tmp_path, "60\n")
    monkeypatch.setattr(Path, "write_text", _refuse)
    (outcome,) = sysctl.ensure_conntrack(3600, proc)
    assert not outcome.ok and outcome.before == 60
    assert outcome.error is not None and "Read-only file system" in outcome.error
