"""`--config FILE`: options from YAML, flags override them, bad files are refused with an
error naming the file and the key; and the capability checks of ebpflb.host.privileges."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from ebpflb import cli
from ebpflb.config import XdpMode
from ebpflb.errors import BpfLoadError, ConfigError, KernelSetupError
from ebpflb.host import privileges


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_file_values_become_the_options(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "ct-max: 1000\nmin-sync-period: 1\nhash-seed: cluster-a\ninterfaces: [eth0, eth1]\n"
        "snat-port-range: 40000-40099\nxdp: native\ncgroup: /host/cg\n",
    )
    args = cli.parse_args(["run", "--config", str(path)])
    assert args.ct_max == 1000
    assert args.min_sync_period == 1.0 and isinstance(args.min_sync_period, float)
    assert args.hash_seed == "cluster-a"
    assert args.interfaces == ("eth0", "eth1")
    assert args.snat_port_range == (40000, 40099)
    assert args.xdp is XdpMode.NATIVE
    assert args.cgroup == Path("/host/cg")


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "ct-max: 1000\ninterfaces: eth0\n")
    args = cli.parse_args(["run", "--ct-max", "5", "--config", str(path), "--interfaces="])
    assert args.ct_max == 5
    assert args.interfaces == ()
    # Options the file leaves out keep their defaults.
    assert args.rnat_max == cli.DEFAULTS.rnat_max


def test_cleanup_reads_the_keys_it_has_and_leaves_the_agents_others(tmp_path: Path) -> None:
    path = write(tmp_path, "bpffs: /sys/fs/bpf/x\ncgroup: /host/cg\nct-max: 1000\n")
    args = cli.parse_args(["cleanup", "--config", str(path)])
    assert args.bpffs == Path("/sys/fs/bpf/x")
    assert args.cgroup == Path("/host/cg")
    assert not hasattr(args, "ct_max")


def test_empty_file_changes_nothing(tmp_path: Path) -> None:
    args = cli.parse_args(["run", "--config", str(write(tmp_path, "# nothing\n"))])
    assert args.ct_max == cli.DEFAULTS.ct_max


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ct-maxx: 5\n", "unknown key 'ct-maxx' (did you mean 'ct-max'?)"),
        ("config: other.yaml\n", "unknown key 'config' (a config file cannot name another)"),
        ("ct-max: '1000'\n", "ct-max: must be an integer, not a string ('1000')"),
        ("ct-max: 1.5\n", "ct-max: must be an integer, not a number (1.5)"),
        ("ct-max: true\n", "ct-max: must be an integer, not a boolean (True)"),
        ("min-sync-period: fast\n", "min-sync-period: must be a number, not a string"),
        ("hash-seed: 12\n", "hash-seed: must be a string, not an integer (12)"),
        ("interfaces: 3\n", "interfaces: must be a string or a list of strings, not an integer"),
        ("interfaces: [eth0, 1]\n", "interfaces: must be a string or a list of strings"),
        ("snat-port-range: [1, 2]\n", "snat-port-range: must be a string, not a list"),
        ("snat-port-range: low-high\n", "snat-port-range: 'low-high' is not MIN-MAX"),
        ("xdp: fast\n", "xdp: 'fast' is not a valid XdpMode"),
        ("ct-max:\n", "ct-max: must be an integer, not a null (None)"),
        ("- ct-max\n", "must be a mapping of option names to values, not a list"),
        ("ct-max: [\n", "not YAML"),
        ("1: 2\n", "key 1 is not an option name"),
    ],
)
def test_bad_files_are_refused_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        cli.parse_args(["run", "--config", str(path)])
    assert str(caught.value).startswith(f"config {path}:")
    assert message in str(caught.value)


def test_missing_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: No such file or directory" in capsys.readouterr().err


def test_a_value_the_agent_rejects_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The file's values go through the same Config checks as flags."""
    path = write(tmp_path, "slot-pool-size: 3\n")
    assert cli.main(["run", "--manifests", str(tmp_path), "--config", str(path)]) == 1
    assert "slot-pool-size 3 must be even" in capsys.readouterr().err


# ---- capabilities ---------------------------------------------------------------------

STATUS = "Name:\tebpflb\nCapInh:\t0000000000000000\nCapEff:\t{mask}\nCapBnd:\t0\n"


def caps(*names: str) -> frozenset[int]:
    mask = sum(1 << privileges.CAPABILITY_BITS[n] for n in names)
    return privileges.effective(STATUS.format(mask=f"{mask:016x}"))


def test_effective_capabilities_come_from_capeff() -> None:
    assert caps("CAP_NET_ADMIN", "CAP_SYS_ADMIN") == {12, 21}
    assert privileges.effective(STATUS.format(mask="000001ffffffffff")) == set(range(41))


def test_run_needs_sys_admin_and_net_admin_for_nodeport_only() -> None:
    new = (6, 1)
    needs = privileges.needed_by_run(nodeport=True, kernel=new, memlock_is_unlimited=False)
    assert needs == [privileges.SYS_ADMIN, privileges.NET_ADMIN]
    needs = privileges.needed_by_run(nodeport=False, kernel=new, memlock_is_unlimited=False)
    assert needs == [privileges.SYS_ADMIN]


def test_sys_resource_only_where_maps_count_against_memlock() -> None:
    def needs(kernel: tuple[int, int], unlimited: bool) -> bool:
        found = privileges.needed_by_run(
            nodeport=False, kernel=kernel, memlock_is_unlimited=unlimited
        )
        return privileges.SYS_RESOURCE in found

    assert needs((5, 10), unlimited=False)
    assert not needs((5, 10), unlimited=True)
    assert not needs((5, 11), unlimited=False)


def test_kernel_version_parsing() -> None:
    assert privileges.kernel_version("5.10.0-46-amd64") == (5, 10)
    assert privileges.kernel_version("6.18.44-fc-v657") == (6, 18)
    with pytest.raises(KernelSetupError):
        privileges.kernel_version("weird")


def test_missing_capability_is_named_with_the_reason() -> None:
    needs = [privileges.SYS_ADMIN, privileges.NET_ADMIN]
    privileges.check(needs, caps("CAP_SYS_ADMIN", "CAP_NET_ADMIN"))
    with pytest.raises(KernelSetupError) as caught:
        privileges.check(needs, caps("CAP_SYS_ADMIN", "CAP_BPF"))
    message = str(caught.value)
    assert message.startswith("missing capability CAP_NET_ADMIN (tc and XDP programs")
    assert "deploy/base/daemonset.yaml" in message
    with pytest.raises(
        KernelSetupError, match=r"^missing capabilities CAP_SYS_ADMIN \(BCC.*\), CAP_NET"
    ):
        privileges.check(needs, caps("CAP_BPF"))


def test_permission_errors_get_a_hint_naming_what_is_missing() -> None:
    have = caps("CAP_SYS_ADMIN")
    wrapped = BpfLoadError("compiling sock_lb.c failed")
    wrapped.__cause__ = Exception("could not open bpf map: x, error: Operation not permitted")
    hint = privileges.permission_hint(wrapped, have)
    assert hint is not None and "lacks CAP_NET_ADMIN" in hint
    assert privileges.permission_hint(PermissionError(errno.EPERM, "no"), have) is not None
    assert privileges.permission_hint(BpfLoadError("verifier said no"), have) is None
    full = caps("CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_RESOURCE")
    hint = privileges.permission_hint(PermissionError(errno.EPERM, "no"), full)
    assert hint is not None and "has the capabilities" in hint
