"""The kernel matrix's pure parts: Debian package resolution and the cache, the initramfs,
reading the guest's result, JUnit files, the summary and the README table."""

from __future__ import annotations

import hashlib
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from lab.kernels import ci, debian, features, initramfs, junit, matrix, plan, vm
from lab.kernels.guest import Plan
from lab.kernels.junit import Case, KernelResult, Outcome
from tests import REPO

IMAGE = debian.Package(
    "linux-image-5.10.0-46-amd64-unsigned",
    "5.10.262-1",
    "0" * 64,
    "pool/updates/main/l/linux/linux-image-5.10.0-46-amd64-unsigned_5.10.262-1_amd64.deb",
)
HEADERS = debian.Package(
    "linux-headers-5.10.0-46-amd64",
    "5.10.262-1",
    "1" * 64,
    "pool/updates/main/l/linux/linux-headers-5.10.0-46-amd64_5.10.262-1_amd64.deb",
)


# Debian packages and the cache


def test_cache_key_is_the_release_and_the_image_packages_version() -> None:
    assert debian.cache_key("5.10.0-46-amd64", [HEADERS, IMAGE]) == "5.10.0-46-amd64_5.10.262-1"
    rebuilt = debian.Package(IMAGE.name, "5.10.262-2", IMAGE.sha256, IMAGE.filename)
    assert debian.cache_key("5.10.0-46-amd64", [rebuilt]) != debian.cache_key(
        "5.10.0-46-amd64", [IMAGE]
    )
    with pytest.raises(debian.KernelFetchError, match="one linux-image"):
        debian.cache_key("5.10.0-46-amd64", [HEADERS])


def test_a_line_resolves_to_the_kernel_its_release_depends_on() -> None:
    depends = "linux-image-5.10.0-46-amd64 (= 5.10.262-1)"
    assert debian.abi_from_depends(depends, "5.10") == "5.10.0-46"
    assert debian.abi_from_depends("linux-image-6.1.0-57-amd64", "6.1") == "6.1.0-57"
    with pytest.raises(debian.KernelFetchError, match=r"no 5\.10 kernel"):
        debian.abi_from_depends("linux-image-6.1.0-57-amd64", "5.10")
    with pytest.raises(debian.KernelFetchError, match=r"unknown kernel line '4\.19'"):
        debian.kernel_line("4.19")
    assert debian.package_names("5.10.0-46") == (
        "linux-image-5.10.0-46-amd64-unsigned",
        "linux-headers-5.10.0-46-amd64",
        "linux-headers-5.10.0-46-common",
    )


def test_the_sources_list_names_the_release_and_its_updates() -> None:
    text = debian.sources_list("bullseye")
    assert " bullseye main" in text and " bullseye-updates main" in text
    assert " bullseye-security main" in text and "signed-by=" in text


def test_apt_cache_show_stanza() -> None:
    text = (
        "Package: linux-image-amd64\nVersion: 5.10.262-1\n"
        "Depends: linux-image-5.10.0-46-amd64 (= 5.10.262-1)\nDescription: x\n more text\n"
        "\nPackage: other\nVersion: 1\n"
    )
    fields = debian.parse_stanza(text)
    assert fields["Version"] == "5.10.262-1" and fields["Package"] == "linux-image-amd64"
    assert fields["Depends"].startswith("linux-image-5.10.0-46-amd64")


def make_entry(root: Path, deb_bytes: bytes = b"deb") -> Path:
    entry = root / "5.10.0-46-amd64_5.10.262-1"
    (entry / "debs").mkdir(parents=True)
    package = debian.Package(
        IMAGE.name, IMAGE.version, hashlib.sha256(b"deb").hexdigest(), IMAGE.filename
    )
    (entry / "debs" / package.deb).write_bytes(deb_bytes)
    modules = entry / "root/lib/modules/5.10.0-46-amd64"
    modules.mkdir(parents=True)
    (modules / "modules.dep").write_text("")
    (entry / "root/boot").mkdir()
    (entry / "root/boot/vmlinuz-5.10.0-46-amd64").write_bytes(b"kernel")
    for link, target in (
        ("build", "/usr/src/linux-headers-5.10.0-46-amd64"),
        ("source", "/usr/src/linux-headers-5.10.0-46-common"),
    ):
        (modules / link).symlink_to(target)
        (entry / "root" / target.lstrip("/") / "include").mkdir(parents=True)
    manifest = debian.Manifest("5.10", "bullseye", "5.10.0-46-amd64", (package,))
    (entry / "manifest.json").write_text(manifest.to_json())
    return entry


def test_a_cache_entry_verifies_and_round_trips(tmp_path: Path) -> None:
    kernel = debian.verify(make_entry(tmp_path))
    assert kernel.release == "5.10.0-46-amd64"
    assert kernel.vmlinuz.read_bytes() == b"kernel"
    assert debian.Manifest.from_json(kernel.manifest.to_json()) == kernel.manifest


def test_a_damaged_cache_entry_is_refused(tmp_path: Path) -> None:
    entry = make_entry(tmp_path, deb_bytes=b"tampered")
    with pytest.raises(debian.KernelFetchError, match="differs from the index"):
        debian.verify(entry)
    (entry / "debs" / IMAGE.deb).write_bytes(b"deb")
    (entry / "root/usr/src/linux-headers-5.10.0-46-amd64/include").rmdir()
    with pytest.raises(debian.KernelFetchError, match=r"linux-headers-5\.10\.0-46-amd64/include"):
        debian.verify(entry)
    (entry / "manifest.json").unlink()
    with pytest.raises(debian.KernelFetchError, match="incomplete"):
        debian.verify(entry)


# The initramfs


MODULES_DEP = """\
kernel/fs/netfs/netfs.ko:
kernel/fs/fscache/fscache.ko: kernel/fs/netfs/netfs.ko
kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/fscache/fscache.ko kernel/fs/netfs/netfs.ko
kernel/net/9p/9pnet.ko:
kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio-pci.ko: kernel/drivers/virtio/virtio_ring.ko
"""


def test_modules_load_after_their_dependencies_and_once() -> None:
    deps = initramfs.parse_modules_dep(MODULES_DEP)
    order = initramfs.load_order(["virtio_pci", "9pnet_virtio", "9p"], deps)
    assert len(order) == len(set(order)) == 7
    for module, needs in (
        ("9p.ko", "9pnet.ko"),
        ("9p.ko", "fscache.ko"),
        ("fscache.ko", "netfs.ko"),
        ("9pnet_virtio.ko", "virtio_ring.ko"),
    ):
        assert order.index(next(p for p in order if p.endswith("/" + needs))) < order.index(
            next(p for p in order if p.endswith("/" + module))
        )
    with pytest.raises(ValueError, match=r"overlay is not in modules\.dep"):
        initramfs.load_order(["overlay"], deps)


def test_a_dependency_cycle_is_an_error() -> None:
    deps = initramfs.parse_modules_dep("a.ko: b.ko\nb.ko: a.ko\n")
    with pytest.raises(ValueError, match="cycle"):
        initramfs.load_order(["a"], deps)


def read_cpio(data: bytes) -> dict[str, tuple[int, bytes]]:
    """name -> (mode, data) of a newc archive, up to the trailer."""
    entries, pos = {}, 0
    while True:
        assert data[pos : pos + 6] == b"070701"
        fields = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        pos += 110
        name = data[pos : pos + namesize - 1].decode()
        pos += namesize + (-(110 + namesize) % 4)
        if name == "TRAILER!!!":
            return entries
        entries[name] = (mode, data[pos : pos + size])
        pos += size + (-size % 4)


def test_cpio_archive_holds_files_links_and_directories() -> None:
    archive = initramfs.cpio_newc(
        [
            initramfs.Entry("bin", 0o40755),
            initramfs.Entry("bin/sh", 0o120777, b"busybox"),
            initramfs.Entry("init", 0o100755, b"#!/bin/sh\necho hi\n"),
        ]
    )
    assert len(archive) % 4 == 0
    entries = read_cpio(archive)
    assert entries["bin/sh"] == (0o120777, b"busybox")
    assert entries["init"] == (0o100755, b"#!/bin/sh\necho hi\n")
    assert entries["bin"][0] == 0o40755


def test_init_mounts_the_kernels_own_tree_and_reports_the_status() -> None:
    script = initramfs.init_script(Path("/var/cache/ebpflb/kernels/k/root"))
    assert "KROOT=/var/cache/ebpflb/kernels/k/root" in script
    assert "hostroot /newroot" in script and ",ro," in script
    assert f"{initramfs.STATUS_MARKER} $status" in script
    assert "cgroup.subtree_control" in script  # controllers on, as systemd has them
    assert not re.search(r"\{[a-z_]+\}", script)  # every placeholder filled


# The VM and the guest's result


def test_the_host_root_is_shared_read_only_and_results_writable(tmp_path: Path) -> None:
    argv = vm.qemu_argv(Path("/k/vmlinuz"), Path("/k/initrd"), tmp_path)
    joined = " ".join(argv)
    assert "path=/,readonly=on" in joined
    assert f"path={tmp_path},security_model=passthrough" in joined
    assert "readonly" not in joined.split(f"path={tmp_path}")[1].split(" ")[0]
    assert "-no-reboot" in argv and "tcg,thread=single,tb-size=128" in argv


def test_the_guests_status_file_wins_over_the_console(tmp_path: Path) -> None:
    console = f"boot\n{initramfs.STATUS_MARKER} 1\n"
    assert vm.status_from(tmp_path, console) == 1
    (tmp_path / "exit-status").write_text("0\n")
    assert vm.status_from(tmp_path, console) == 0
    (tmp_path / "exit-status").unlink()
    assert vm.status_from(tmp_path, "kernel panic\n") is None


def test_the_guest_plan_writes_nothing_into_the_checkout() -> None:
    exclusions = [
        plan.Exclusion("tests/kernel/test_x.py::test_y", frozenset({"5.10"}), "needs z"),
    ]
    p = plan.guest_plan("/repo", "5.10", exclusions=exclusions)
    assert p.pytest_args[-1] == "tests/kernel"
    assert p.pytest_args[1:3] == ["-p", "no:cacheprovider"]
    assert "--junitxml=/run/ebpflb-results/junit.xml" in p.pytest_args
    assert p.pytest_args[p.pytest_args.index("--deselect") + 1] == "tests/kernel/test_x.py::test_y"
    assert p.env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert p.env["EBPFLB_TEST_TIMEOUT_SCALE"] == str(plan.TIMEOUT_SCALE)
    assert "--deselect" not in plan.guest_plan("/repo", "6.1", exclusions=exclusions).pytest_args
    assert Plan.from_json(p.to_json()) == p


def test_the_guest_script_quotes_the_checkout_path() -> None:
    script = plan.guest_script("/srv/my repo")
    assert "cd '/srv/my repo' ||" in script
    assert "exec '/srv/my repo/.venv/bin/python' -m lab.kernels.guest" in script


def test_kernel_lines_are_checked_before_anything_boots() -> None:
    assert matrix.parse_kernels("5.10, 6.1") == ("5.10", "6.1")
    with pytest.raises(debian.KernelFetchError):
        matrix.parse_kernels("5.10 5.4")


# JUnit files and the summary


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="kernel-5.10" tests="4" failures="1" errors="0" skipped="1">
<testcase classname="tests.kernel.socketlb.test_socket_lb" name="test_a" time="1"/>
<testcase classname="tests.kernel.nodeport.test_nodeport" name="test_b[tc]" time="1">
  <failure message="assert 1 == 2">trace</failure></testcase>
<testcase classname="tests.kernel.nodeport.test_nodeport.TestX" name="test_c" time="1">
  <skipped message="no xdp"/></testcase>
<testcase classname="tests.kernel.datapath.test_layout" name="test_d" time="1"/>
</testsuite></testsuites>
"""


def test_cases_are_read_with_pytest_node_ids(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    cases = junit.read_cases(path)
    assert cases == [
        Case("tests/kernel/socketlb/test_socket_lb.py::test_a", Outcome.PASSED),
        Case("tests/kernel/nodeport/test_nodeport.py::test_b[tc]", Outcome.FAILED, "assert 1 == 2"),
        Case("tests/kernel/nodeport/test_nodeport.py::TestX::test_c", Outcome.SKIPPED, "no xdp"),
        Case("tests/kernel/datapath/test_layout.py::test_d", Outcome.PASSED),
    ]


def test_a_missing_result_reads_back_as_one_failure(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(junit.missing_result("6.1", "VM killed after 60 min"))
    (case,) = junit.read_cases(path)
    assert case.outcome is Outcome.FAILED and case.message == "VM killed after 60 min"


def test_merged_junit_keeps_each_kernels_cases_apart(tmp_path: Path) -> None:
    (tmp_path / "a.xml").write_text(JUNIT)
    (tmp_path / "b.xml").write_text(junit.missing_result("6.1", "no result"))
    root = ET.fromstring(junit.merge([("5.10", tmp_path / "a.xml"), ("6.1", tmp_path / "b.xml")]))
    assert root.get("tests") == "5" and root.get("failures") == "2" and root.get("skipped") == "1"
    assert [s.get("name") for s in root.iter("testsuite")] == ["kernel-5.10", "kernel-6.1"]
    classnames = [c.get("classname") for c in root.iter("testcase")]
    assert classnames[0] == "5.10.tests.kernel.socketlb.test_socket_lb"
    assert classnames[-1] == "6.1.kernel_matrix"


def result(kernel: str, outcomes: list[Outcome], problem: str = "") -> KernelResult:
    cases = tuple(Case(f"tests/kernel/test_x.py::t{i}", o) for i, o in enumerate(outcomes))
    return KernelResult(
        kernel, f"{kernel}.0-1-amd64", cases, 754.0, 600.0, excluded=1, problem=problem
    )


def test_summary_table_counts_and_minutes() -> None:
    ok = result("5.10", [Outcome.PASSED] * 3 + [Outcome.SKIPPED])
    failed = result("6.1", [Outcome.PASSED, Outcome.FAILED])
    lines = junit.summary([ok, failed]).splitlines()
    assert lines[0].split() == (
        [
            "kernel",
            "release",
            "passed",
            "failed",
            "skipped",
            "excluded",
            "minutes",
            "cpu-min",
            "result",
        ]
    )
    assert lines[1].split() == ["5.10", "5.10.0-1-amd64", "3", "0", "1", "1", "12.6", "10.0", "ok"]
    assert lines[2].split() == [
        "6.1",
        "6.1.0-1-amd64",
        "1",
        "1",
        "0",
        "1",
        "12.6",
        "10.0",
        "FAILED",
    ]
    # numbers are right-aligned under their headers
    right = lines[0].index("passed") + len("passed")
    assert lines[1][right - 1] == "3" and lines[1][right] == " "
    assert junit.summary_rows([ok])[0]["minutes"] == 12.6


def test_a_kernel_without_cases_or_with_a_problem_is_not_ok() -> None:
    assert result("5.10", [Outcome.PASSED]).ok
    assert not result("5.10", []).ok
    assert not result("5.10", [Outcome.PASSED], problem="pytest exited 2").ok
    assert not result("5.10", [Outcome.PASSED, Outcome.FAILED]).ok


# The README table


REFUSE = (
    "tests/kernel/socketlb/test_socket_lb.py::"
    "test_service_without_endpoints_refuses_tcp_and_udp[ipv4]"
)


def column(
    label: str, release: str, cases: list[Case], report: dict[str, bool] | None = None
) -> features.Column:
    return features.Column(label, release, tuple(cases), report)


def test_behaviour_follows_the_kernel_or_its_probe_report() -> None:
    (set_retval,) = [f for f in features.features() if f.key == "set_retval"]
    passed = [Case(REFUSE, Outcome.PASSED)]
    assert features.cell(set_retval, column("5.10", "5.10.0-46-amd64", passed)) == (
        "connect() to a Service without endpoints fails with EPERM, not ECONNREFUSED (1 passed)"
    )
    assert features.cell(set_retval, column("host", "6.18.4", passed)).startswith("ECONNREFUSED")
    probed = column("6.1", "6.1.0-57-amd64", passed, report={"set_retval": True})
    assert features.cell(set_retval, probed).startswith("ECONNREFUSED")
    failed = column("6.1", "6.1.0-57-amd64", [Case(REFUSE, Outcome.FAILED)])
    assert "**1 of 1 tests failed**" in features.cell(set_retval, failed)
    assert features.cell(set_retval, column("6.1", "6.1.0-57-amd64", [])).endswith("(not tested)")


def test_every_feature_names_tests_that_exist() -> None:
    for feature in features.features():
        assert feature.tests, feature.key
        for test in feature.tests:
            path, _, name = test.partition("::")
            source = (REPO / path).read_text()
            assert f"def {name.split('[')[0]}(" in source, test


def test_the_table_is_replaced_between_its_markers_only() -> None:
    readme = f"intro\n{features.BEGIN}\nold table\n{features.END}\noutro\n"
    columns = [column("5.10", "5.10.0-46-amd64", [Case(REFUSE, Outcome.PASSED)])]
    summary = [
        {
            "kernel": "5.10",
            "release": "5.10.0-46-amd64",
            "passed": 60,
            "failed": 0,
            "skipped": 0,
            "excluded": 1,
            "minutes": 21.5,
            "cpu_minutes": 20.0,
        }
    ]
    table = features.render(columns, summary)
    updated = features.replace_between_markers(readme, table)
    assert updated.startswith(f"intro\n{features.BEGIN}\n| Feature")
    assert updated.endswith(f"{features.END}\noutro\n") and "old table" not in updated
    assert "| 5.10 (`5.10.0-46-amd64`) | 60 | 0 | 0 | 1 | 21.5 | 20.0 |" in updated
    assert features.replace_between_markers(updated, table) == updated
    with pytest.raises(ValueError, match="markers"):
        features.replace_between_markers("no markers", table)


def test_columns_come_from_the_runs_output(tmp_path: Path) -> None:
    for line, release in (("6.1", "6.1.0-57-amd64"), ("5.10", "5.10.0-46-amd64")):
        (tmp_path / line).mkdir()
        (tmp_path / line / "junit.xml").write_text(JUNIT)
        (tmp_path / line / "guest.json").write_text(json.dumps({"release": release}))
    (tmp_path / "9.9").mkdir()  # a kernel that gave no result: no column
    (tmp_path / "9.9" / "junit.xml").write_text(junit.missing_result("9.9", "x"))
    columns = features.load_columns(tmp_path)
    assert [c.label for c in columns] == ["5.10", "6.1"]
    assert len(columns[0].cases) == 4 and columns[0].report is None


def test_the_guest_gets_the_hosts_pip_configuration(tmp_path: Path) -> None:
    (tmp_path / ".config" / "pip").mkdir(parents=True)
    (tmp_path / ".config" / "pip" / "pip.conf").write_text("[global]\nfind-links = /opt/w\n")
    environ = {"PIP_FIND_LINKS": "/opt/wheels", "HOME": str(tmp_path), "OTHER": "x"}
    assert plan.pip_settings(environ, tmp_path) == {
        "PIP_FIND_LINKS": "/opt/wheels",
        "PIP_CONFIG_FILE": str(tmp_path / ".config" / "pip" / "pip.conf"),
    }
    assert plan.pip_settings({"PIP_CONFIG_FILE": "/etc/x"}, tmp_path) == {
        "PIP_CONFIG_FILE": "/etc/x"
    }
    assert plan.pip_settings({}, tmp_path / "nobody") == {}


def test_ci_places_every_kernel_test_file() -> None:
    kernel = REPO / "tests" / "kernel"
    files = [p.relative_to(kernel).as_posix() for p in kernel.rglob("test_*.py")]
    assert files and ci.unplaced(files) == []
    assert ci.unplaced([*files, "nodeport/test_new.py"]) == ["nodeport/test_new.py"]
    assert len({p.file for p in ci.PLACEMENTS}) == len(ci.PLACEMENTS)


def test_ci_runs_kernel_feature_files_on_every_line_and_leaves_behaviour_to_the_host() -> None:
    on = {line: set(ci.files_on(line)) for line in ci.LINES}
    for p in ci.PLACEMENTS:
        if p.why in (ci.KERNEL_FEATURE, ci.SPLIT):
            assert p.kernel_lines == set(ci.LINES), p
            assert all(p.path in on[line] for line in ci.LINES)
            assert (p.why == ci.SPLIT) == bool(p.left_out), p
        elif p.why == ci.E2E_ROWS:
            assert p.kernel_lines and all(p.path in on[line] for line in p.kernel_lines), p
            assert {line for line, _ in p.only} <= p.kernel_lines and not p.left_out, p
        elif p.why == ci.ONE_LINE:
            (line,) = p.kernel_lines
            assert line in ci.LINES and p.path in on[line], p
            assert not any(p.path in on[other] for other in set(ci.LINES) - {line}), p
        else:
            assert p.why in (ci.COVERED, ci.AGENT_BEHAVIOUR, ci.HOST_ONLY), p
            assert not p.kernel_lines and not any(p.path in on[line] for line in ci.LINES)
        if p.why == ci.HOST_ONLY:  # plan.EXCLUDED must leave it out of make test-kernels too
            for line in ci.LINES:
                assert any(e.nodeid.startswith(p.path) for e in plan.excluded_on(line)), p
    assert "tests/kernel/socketlb/test_socket_lb.py" in on["5.10"] & on["6.1"]
    assert "tests/kernel/nodeport/test_nodeport.py" in on["5.10"] & on["6.1"]
    assert "tests/kernel/nodeport/test_real_networks.py" in on["6.1"]
    assert "tests/kernel/nodeport/test_bulk.py" in on["6.1"]
    assert "tests/kernel/agent/test_crash.py" not in on["5.10"] | on["6.1"]
    assert "tests/kernel/e2e/test_close_wait.py" in on["5.10"] & on["6.1"]
    assert "tests/kernel/e2e/test_service.py" in on["5.10"] - on["6.1"]
    # -k matches module names: each guest file's name must say which file it is.
    for line in ci.LINES:
        modules = [p.module for p in ci.PLACEMENTS if line in p.kernel_lines]
        assert len(modules) == len(set(modules)), line


def collected(args: tuple[str, ...]) -> set[str]:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_a_split_file_runs_every_test_on_one_line_at_least() -> None:
    """A split file's tests, over both guests, are all of its tests (what one guest leaves
    out the other runs); a one-line file's guest leaves out only some of it."""
    guest_files = sorted({p.path for p in ci.PLACEMENTS if p.kernel_lines})
    everything = collected(tuple(guest_files))
    ran = {line: collected(ci.selection_on(line)) for line in ci.LINES}
    for p in ci.PLACEMENTS:
        if not p.left_out:
            continue
        in_file = {t for t in everything if t.startswith(p.path + "::")}
        per_line = [{t for t in ran[line] if t in in_file} for line in p.kernel_lines]
        assert in_file and all(0 < len(r) < len(in_file) for r in per_line), p.file
        if p.why == ci.SPLIT:
            assert set().union(*per_line) == in_file, p.file
    for p in ci.PLACEMENTS:  # an e2e file narrowed on a line runs exactly its rows there
        for line, fragment in p.only:
            in_file = {t for t in ran[line] if t.startswith(p.path + "::")}
            assert in_file and all(fragment in t for t in in_file), (p.file, line)
            assert len(in_file) == len(
                {t for t in everything if t.startswith(p.path + "::") and fragment in t}
            ), (p.file, line)
    on_510 = ci.selection_on("5.10")
    assert on_510[-2] == "-k" and "not (test_nodeport.py and [xdp-native)" in on_510[-1]
    assert ci.selection_on("9.9", ()) == ()


def test_ci_split_gives_each_kernel_its_own_selection() -> None:
    options = matrix.Options(kernels=("5.10", "6.1"), per_line={"5.10": ("tests/kernel/a.py",)})
    assert options.selection_on("5.10") == ("tests/kernel/a.py",)
    assert options.selection_on("6.1") == (plan.KERNEL_TESTS,)


def test_a_killed_guests_progress_is_read_from_its_console() -> None:
    console = (
        "boot\n"
        "tests/kernel/test_a.py::test_x PASSED [ 1%]\n"
        "tests/kernel/test_a.py::test_y[tc] FAILED [ 2%]\n"
        "tests/kernel/test_b.py::test_z \n"
    )
    assert junit.progress_from_console(console) == (
        "before the kill: 1 passed, 1 failed; running: tests/kernel/test_b.py::test_z"
    )
    assert junit.progress_from_console("boot\n") == (
        "before the kill: no test finished; running: -"
    )
