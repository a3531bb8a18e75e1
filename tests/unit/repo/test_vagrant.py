"""vagrant/Vagrantfile is valid: `vagrant validate` with the libvirt provider plugin (Debian's
vagrant-libvirt), which checks every machine's settings including the libvirt ones. The
VirtualBox blocks load but are not validated: VirtualBox is not in Debian, and Vagrant only
validates an installed provider. No box is downloaded or booted here."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests import REPO

VAGRANT_DIR = REPO / "vagrant"
KERNEL_LINES = {"deb11": "5.10", "ubuntu2204": "5.15", "deb12": "6.1"}
CLUSTER = {"cp1", "node1", "node2"}


@pytest.fixture(scope="module")
def vagrant_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if shutil.which("vagrant") is None:
        message = "vagrant is not installed (scripts/kernels/install.sh installs it)"
        if os.environ.get("EBPFLB_REQUIRE_VAGRANT") == "1":
            pytest.fail(message + "; EBPFLB_REQUIRE_VAGRANT=1 forbids skipping")
        pytest.skip(message)
    state = tmp_path_factory.mktemp("vagrant")
    return {
        **os.environ,
        "VAGRANT_DEFAULT_PROVIDER": "libvirt",
        "VAGRANT_DOTFILE_PATH": str(state / "dotfile"),  # nothing written into the checkout
        "VAGRANT_HOME": str(state / "home"),
        "VAGRANT_CHECKPOINT_DISABLE": "1",
        "VAGRANT_NO_COLOR": "1",
    }


def vagrant(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["vagrant", *args], cwd=VAGRANT_DIR, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_vagrantfile_validates(vagrant_env: dict[str, str]) -> None:
    done = vagrant(vagrant_env, "validate")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "validated successfully" in done.stdout


def test_one_test_vm_per_kernel_line_and_a_three_node_cluster(
    vagrant_env: dict[str, str],
) -> None:
    done = vagrant(vagrant_env, "status", "--machine-readable")
    assert done.returncode == 0, done.stdout + done.stderr
    machines = {line.split(",")[1] for line in done.stdout.splitlines() if ",state," in line}
    assert machines == set(KERNEL_LINES) | CLUSTER
    vagrantfile = (VAGRANT_DIR / "Vagrantfile").read_text()
    for name, line in KERNEL_LINES.items():
        assert f'"{name}" => {{ box: ' in vagrantfile and f'kernel: "{line}"' in vagrantfile
    assert (
        "--skip-phases=addon/kube-proxy"
        in (VAGRANT_DIR / "provision" / "k8s-control-plane.sh").read_text()
    )


def test_provisioning_scripts_parse() -> None:
    scripts = sorted((VAGRANT_DIR / "provision").glob("*.sh"))
    assert scripts
    for script in scripts:
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, f"{script.name}: {done.stderr}"
