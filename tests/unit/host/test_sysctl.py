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


def _kept(proc: Path, errors: list[str] | None = None) -> sysctl.ConntrackSysctls:
    return sysctl.ConntrackSysctls(
        3600, lambda o: errors.append(o.key) if errors is not None else None, proc
    )


def test_sets_the_close_wait_timeout_as_kube_proxy(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "60\n")
    (outcome,) = _kept(proc).ensure()
    assert outcome.ok and outcome.before == 60
    assert (proc / sysctl.CLOSE_WAIT).read_text() == "3600\n"


def test_a_right_value_is_not_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = _proc(tmp_path, "3600\n")
    monkeypatch.setattr(Path, "write_text", _refuse)  # a write would fail the outcome
    (outcome,) = _kept(proc).ensure()
    assert outcome.ok and outcome.before == 3600


def test_absent_nf_conntrack_is_nothing_to_set(tmp_path: Path) -> None:
    (outcome,) = _kept(_proc(tmp_path, None)).ensure()
    assert outcome.ok and outcome.before is None


def test_a_read_only_proc_sys_is_an_error_naming_the_file(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "60\n")
    target = proc / sysctl.CLOSE_WAIT
    target.unlink()
    target.mkdir()  # reading works on no file of this kind: a directory cannot be written
    (outcome,) = _kept(proc).ensure()
    assert not outcome.ok
    assert str(target) in (outcome.error or "")


def test_an_unwritable_value_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = _proc(tmp_path, "60\n")
    monkeypatch.setattr(Path, "write_text", _refuse)
    (outcome,) = _kept(proc).ensure()
    assert not outcome.ok and outcome.before == 60
    assert outcome.error is not None and "Read-only file system" in outcome.error


def test_set_once_nf_conntrack_loads_after_the_agent_started(tmp_path: Path) -> None:
    kept = _kept(_proc(tmp_path, None))
    (outcome,) = kept.ensure()
    assert outcome.before is None
    _proc(tmp_path, "60\n")  # the module loaded: the kernel's default
    (outcome,) = kept.ensure()  # the next full resync
    assert outcome.ok and outcome.before == 60
    assert (tmp_path / sysctl.CLOSE_WAIT).read_text() == "3600\n"


def test_a_lasting_failure_is_counted_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    errors: list[str] = []
    kept = _kept(_proc(tmp_path, "60\n"), errors)
    monkeypatch.setattr(Path, "write_text", _refuse)
    for _ in range(3):
        (outcome,) = kept.ensure()
        assert not outcome.ok
    assert errors == ["net.netfilter.nf_conntrack_tcp_timeout_close_wait"]
    monkeypatch.undo()
    (outcome,) = kept.ensure()
    assert outcome.ok
    (tmp_path / sysctl.CLOSE_WAIT).write_text("60\n")  # reset by someone else
    monkeypatch.setattr(Path, "write_text", _refuse)
    kept.ensure()  # failing again after a success: counted again
    assert len(errors) == 2
