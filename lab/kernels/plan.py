"""Which kernel tests a guest runs, what it is told, and how long it may take.

Every test in tests/kernel/ runs on every kernel unless EXCLUDED names it with the reason it
cannot run there; "slow" is not such a reason.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lab.kernels.guest import Plan
from lab.kernels.initramfs import RESULTS_MOUNT

KERNEL_TESTS = "tests/kernel"
# Multiplies AgentProcess's waits (lab/harness/agentproc.py): under emulation an agent
# start takes ~10 s of imports, then ~25-80 s per BCC compile (socket-LB; NodePort more)
# unless the program cache has the programs, where the host takes ~1.5 s in all.
TIMEOUT_SCALE = 10
# BCC's bytecode kept between agent starts within one boot (ebpflb/datapath/programs/progcache.py):
# each program is compiled once per kernel, not once per test. The guest's /tmp is its own.
PROGRAM_CACHE = "/tmp/ebpflb-programs"


@dataclass(frozen=True, slots=True)
class Exclusion:
    """A test (node id or prefix) left out on some kernel lines, and why."""

    nodeid: str
    kernel_lines: frozenset[str]  # kernel lines it is left out on
    reason: str


# BPF_PROG_TEST_RUN takes an xdp_md context (the receiving interface the XDP program reads)
# only from 5.14 (commit 47316f4a3053): on 5.10 the kernel answers EINVAL to every XDP row of
# the packet tables. The XDP program itself runs on 5.10 with real packets
# (tests/kernel/nodeport/test_nodeport.py's [xdp-native] cases).
_XDP_TEST_RUN = (
    "BPF_PROG_TEST_RUN with an xdp_md context needs 5.14; the XDP program is tested with "
    "real packets instead (test_nodeport [xdp-native])"
)
_NO_INDEX = (
    "installs the built wheel with its dependencies (kubernetes, ...) from a package index; "
    "the guest has no network and this machine's local indexes lack some of them"
)
_PACKETS = "tests/kernel/nodeport/test_packets.py"
EXCLUDED: Sequence[Exclusion] = (
    Exclusion("tests/kernel/agent/test_package.py::", frozenset({"5.10", "6.1"}), _NO_INDEX),
    Exclusion(f"{_PACKETS}::test_packet[xdp:", frozenset({"5.10"}), _XDP_TEST_RUN),
    Exclusion(
        f"{_PACKETS}::test_packet[tc-in: after XDP passed it untranslated:"
        " tc translates from conntrack]",
        frozenset({"5.10"}),
        _XDP_TEST_RUN + " (this row runs XDP first)",
    ),
    Exclusion(
        f"{_PACKETS}::test_cost_per_packet",
        frozenset({"5.10"}),
        _XDP_TEST_RUN + " (it times the XDP program too)",
    ),
    Exclusion(
        "tests/kernel/bench/test_compare.py::test_every_mode_measured_with_real_traffic",
        frozenset({"5.10"}),
        "the bench's per-cgroup kernel memory figure needs memory.stat's `kernel` field (5.18) "
        "or cgroup v1's kmem counter; 5.10 under cgroup v2 has neither, so the figure is not "
        "reported and the test's `> 0` fails",
    ),
)


def excluded_on(line: str, exclusions: Sequence[Exclusion] = EXCLUDED) -> list[Exclusion]:
    return [e for e in exclusions if line in e.kernel_lines]


def guest_plan(
    repo: str,
    line: str,
    selection: Sequence[str] = (KERNEL_TESTS,),
    exclusions: Sequence[Exclusion] = EXCLUDED,
    probe: list[str] | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> Plan:
    """The plan.json for one kernel: pytest on `selection`, writing JUnit to the results
    share and nothing into the checkout (no bytecode, no .pytest_cache)."""
    args = [
        "-v",  # a line per test: progress on the console of a run that takes many minutes
        "-p",
        "no:cacheprovider",
        "-o",
        f"junit_suite_name=kernel-{line}",
        f"--junitxml={RESULTS_MOUNT}/junit.xml",
        "--durations=15",
        "-rfE",
        "--color=no",
    ]
    for exclusion in excluded_on(line, exclusions):
        args += ["--deselect", exclusion.nodeid]
    env = {
        **pip_settings(os.environ, Path.home()),
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "EBPFLB_PROGRAM_CACHE": PROGRAM_CACHE,
        "EBPFLB_TEST_TIMEOUT_SCALE": str(TIMEOUT_SCALE),
        "EBPFLB_REQUIRE_KERNEL": "1",
        **(extra_env or {}),
    }
    return Plan(repo=repo, pytest_args=[*args, *selection], env=env, probe=probe)


def pip_settings(environ: Mapping[str, str], home: Path) -> dict[str, str]:
    """The host's pip configuration for the guest, which has no network and another HOME:
    its PIP_* variables, and its user config file by name (the host's root is shared), so
    that a test building a wheel finds setuptools where the host's `make setup` did."""
    settings = {k: v for k, v in environ.items() if k.startswith("PIP_")}
    if "PIP_CONFIG_FILE" not in settings:
        config_home = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
        for candidate in (config_home / "pip" / "pip.conf", home / ".pip" / "pip.conf"):
            if candidate.is_file():
                settings["PIP_CONFIG_FILE"] = str(candidate)
                break
    return settings


def guest_script(repo: str) -> str:
    """guest.sh, run by the init inside the chroot: the venv's Python with the guest module."""
    return (
        "#!/bin/sh\n"
        "# ebpflb kernel matrix: runs inside the guest (see lab/kernels/guest.py)\n"
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        "export PYTHONDONTWRITEBYTECODE=1 HOME=/tmp\n"
        f"cd {shlex.quote(repo)} || exit 2\n"
        f"exec {shlex.quote(repo + '/.venv/bin/python')} -m lab.kernels.guest "
        f"{RESULTS_MOUNT}\n"
    )
