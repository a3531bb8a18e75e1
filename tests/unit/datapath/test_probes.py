"""What the agent does with the kernel feature probe's findings (made-up findings here; the
probes themselves run in tests/kernel/datapath/test_probes.py)."""

from __future__ import annotations

import errno
import struct
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ebpflb.cli import parse_args
from ebpflb.datapath import probes
from ebpflb.datapath.probes import trials
from ebpflb.datapath.syscall import bpfsys, uapi
from ebpflb.errors import KernelSetupError

ALL = {key: True for key in probes.BY_KEY}


def without(*keys: str) -> dict[str, bool]:
    return {**ALL, **{key: False for key in keys}}


def test_a_kernel_with_everything_costs_nothing() -> None:
    verdict = probes.assess(ALL, nodeport=True, xdp=True)
    assert verdict.missing_required == () and verdict.lost == ()


def test_linux_5_10_runs_without_set_retval_and_says_what_is_lost() -> None:
    verdict = probes.assess(without("set_retval"), nodeport=True, xdp=True)
    assert verdict.missing_required == ()
    (line,) = verdict.lost
    assert "bpf_set_retval" in line and "5.18" in line and "EPERM" in line


@pytest.mark.parametrize(
    "key", ["connect4", "sendmsg4", "recvmsg4", "getpeername4", "mmapable_array"]
)
def test_a_missing_socket_lb_feature_stops_every_start(key: str) -> None:
    for nodeport in (False, True):
        verdict = probes.assess(without(key), nodeport=nodeport, xdp=False)
        assert [f.key for f in verdict.missing_required] == [key]


@pytest.mark.parametrize("key", ["tc", "redirect_neigh"])
def test_a_missing_nodeport_feature_stops_only_a_start_with_interfaces(key: str) -> None:
    assert [
        f.key for f in probes.assess(without(key), nodeport=True, xdp=False).missing_required
    ] == [key]
    verdict = probes.assess(without(key), nodeport=False, xdp=False)
    assert verdict.missing_required == ()
    (line,) = verdict.lost
    assert "--interfaces" in line


def test_every_missing_optional_feature_gets_exactly_one_line() -> None:
    optional = [k for k, f in probes.BY_KEY.items() if f.need is not probes.Need.ALWAYS]
    verdict = probes.assess(without(*optional), nodeport=False, xdp=True)
    assert verdict.missing_required == ()
    assert len(verdict.lost) == len(optional)
    for key in optional:
        assert sum(probes.BY_KEY[key].name in line for line in verdict.lost) == 1


def test_xdp_missing_costs_something_only_when_asked_for() -> None:
    (asked,) = probes.assess(without("xdp"), nodeport=True, xdp=True).lost
    (not_asked,) = probes.assess(without("xdp"), nodeport=True, xdp=False).lost
    assert "tc" in asked and "nothing lost" in not_asked


def test_a_feature_the_probe_did_not_report_counts_as_missing() -> None:
    partial = {k: v for k, v in ALL.items() if k != "getpeername4"}
    assert [f.key for f in probes.assess(partial, nodeport=False, xdp=False).missing_required] == [
        "getpeername4"
    ]


def test_linux_5_4_gets_a_clear_error_naming_the_hook_and_the_minimum_kernel() -> None:
    # What Linux 5.4 lacks of what the agent uses (mainline versions).
    lacks = [k for k, f in probes.BY_KEY.items() if probes._version(f.since) > (5, 4)]
    report = _report("5.4.0-150-generic", without(*lacks))
    with pytest.raises(KernelSetupError) as raised:
        probes.check(report, nodeport=False, xdp=False)
    message = str(raised.value)
    assert "5.4.0-150-generic" in message
    assert "getpeername4" in message and "5.8+" in message
    assert "BPF_F_MMAPABLE" in message  # 5.5: every missing required feature is named
    assert "BPF_F_INNER_MAP" in message  # 5.10: the growable slot pool and conntrack
    assert "bpf_set_retval" not in message  # optional: not a reason to refuse
    assert "needs Linux 5.10 or newer" in message


def test_minimum_kernel_follows_the_configuration() -> None:
    # Socket-LB alone would start on 5.8 (getpeername4) but for the growable maps (5.10).
    assert probes.minimum_kernel(nodeport=False) == "5.10"
    assert probes.minimum_kernel(nodeport=True) == "5.10"


def test_check_logs_one_warning_per_lost_feature(caplog: pytest.LogCaptureFixture) -> None:
    report = _report("5.10.0-46-amd64", without("set_retval", "sk_storage_sock_addr"))
    with caplog.at_level("INFO", logger=probes.__name__):
        probes.check(report, nodeport=True, xdp=False)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2


def test_status_and_metric_show_every_feature() -> None:
    report = _report("5.10.0-46-amd64", without("set_retval"))
    status = report.status()
    assert set(status) == set(probes.BY_KEY)
    assert status["set_retval"]["available"] is False and status["set_retval"]["error"] == "EINVAL"
    assert status["connect4"]["available"] is True and "error" not in status["connect4"]
    assert {"used_for", "fallback", "since", "needed"} <= set(status["set_retval"])
    registry = CollectorRegistry()
    registry.register(probes.FeatureCollector(report))
    assert registry.get_sample_value("ebpflb_kernel_feature", {"feature": "set_retval"}) == 0.0
    assert registry.get_sample_value("ebpflb_kernel_feature", {"feature": "connect4"}) == 1.0


def test_probe_turns_errors_into_findings_and_eperm_into_a_setup_error() -> None:
    def refused() -> None:
        raise bpfsys.BpfError("loading a probe", errno.EINVAL)

    def fine() -> None:
        pass

    connect4, set_retval = probes.BY_KEY["connect4"], probes.BY_KEY["set_retval"]
    report = probes.probe([(connect4, fine), (set_retval, refused)])
    assert report.availability() == {"connect4": True, "set_retval": False}
    assert report.probed[1].error == "EINVAL"

    def denied() -> None:
        raise bpfsys.BpfError("loading a probe", errno.EPERM)

    with pytest.raises(KernelSetupError, match="root"):
        probes.probe([(connect4, denied)])


def test_hand_assembled_instructions_and_btf_are_well_formed() -> None:
    # mov64 r1, -111: opcode 0xb7, dst 1, imm -111, little-endian.
    assert trials.mov(1, -111) == struct.pack("<BBhi", 0xB7, 1, 0, -111)
    assert bytes([0x95, 0, 0, 0, 0, 0, 0, 0]) == trials.EXIT
    blob = trials.int_btf()
    magic, version, _flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from(
        "<HBBIIIII", blob
    )
    assert (magic, version, hdr_len) == (0xEB9F, 1, 24)
    assert len(blob) == hdr_len + str_off + str_len and type_off == 0 and type_len == 16
    assert blob[hdr_len + str_off :] == b"\0int\0"


def _report(release: str, available: dict[str, bool]) -> probes.KernelReport:
    return probes.KernelReport(
        release,
        tuple(
            probes.Probed(probes.BY_KEY[k], ok, "" if ok else "EINVAL", 0.0001)
            for k, ok in available.items()
        ),
    )


def test_eperm_from_the_memlock_limit_is_retried_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before 5.11 an agent's maps use up root's RLIMIT_MEMLOCK for every other process."""
    calls: list[int] = []

    def bpf(cmd: int, attr: object, what: str) -> int:
        calls.append(cmd)
        if len(calls) == 1:
            raise bpfsys.BpfError(what, errno.EPERM)
        return 42

    monkeypatch.setattr(bpfsys, "_bpf", bpf)
    monkeypatch.setattr(bpfsys, "_raise_memlock_limit", lambda: True)
    assert bpfsys.map_create(uapi.MapType.HASH, 4, 4, 1, "a map") == 42
    assert calls == [uapi.BPF_MAP_CREATE] * 2
    calls.clear()
    monkeypatch.setattr(bpfsys, "_raise_memlock_limit", lambda: False)  # already unlimited
    with pytest.raises(bpfsys.BpfError):
        bpfsys.map_create(uapi.MapType.HASH, 4, 4, 1, "a map")


def test_socket_storage_is_optional_and_its_absence_names_the_fallback() -> None:
    feature = probes.BY_KEY["sk_storage_sock_addr"]
    assert feature.need is probes.Need.OPTIONAL and feature.since == "5.3"
    verdict = probes.assess(without("sk_storage_sock_addr"), nodeport=False, xdp=False)
    assert verdict.missing_required == ()
    (line,) = verdict.lost
    assert "bpf_sk_storage_get" in line and "ebpflb_revsk4" in line


def test_the_socket_storage_flag_from_the_command_line_and_the_file(tmp_path: Path) -> None:
    assert parse_args(["run"]).socket_storage is False  # the LRU: cheaper per connection
    assert parse_args(["run", "--socket-storage=true"]).socket_storage is True
    config = tmp_path / "c.yaml"
    config.write_text("socket-storage: true\n")
    assert parse_args(["run", "--config", str(config)]).socket_storage is True


def test_the_probe_program_passes_ctx_sk_and_a_map_to_sk_storage_get() -> None:
    # ld_imm64 with BPF_PSEUDO_MAP_FD (src 1) takes two slots; r2 = *(u64 *)(r1 + 64).
    assert trials.ld_map_fd(1, 7) == struct.pack("<BBhi", 0x18, 0x11, 0, 7) + bytes(8)
    assert uapi.SOCK_ADDR_SK_OFFSET == 64  # offsetof(struct bpf_sock_addr, sk)
