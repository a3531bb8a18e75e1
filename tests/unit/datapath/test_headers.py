"""Which kernel header tree the compiler gets: the order (override, host, bundled, kheaders),
what makes a tree usable, kheaders extracted privately and safely, and the error naming
what to install. The compile itself against a tree other than the host's is
tests/kernel/datapath/test_headers.py's."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from ebpflb.datapath.programs import headers
from ebpflb.datapath.programs.headers import (
    BUNDLED_ENV,
    OVERRIDE_ENV,
    HeadersMissingError,
    HeaderSource,
    find_headers,
)
from ebpflb.errors import BpfLoadError

RELEASE = "6.99.0-test"


def make_tree(root: Path, release: str = "6.1.0-57-amd64") -> Path:
    (root / "include/linux").mkdir(parents=True)
    (root / "include/generated").mkdir(parents=True)
    (root / "include/generated/utsrelease.h").write_text(f'#define UTS_RELEASE "{release}"\n')
    return root


def make_host(modules: Path, *, split: bool) -> Path:
    """/lib/modules/<release>/build, Debian's split (build/ generated, source/ the rest)
    or one merged tree."""
    build = modules / RELEASE / "build"
    if split:
        (build / "include/generated").mkdir(parents=True)
        (modules / RELEASE / "source/include/linux").mkdir(parents=True)
    else:
        make_tree(build)
    return build


def kheaders_archive(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:xz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


TREE_FILES = {
    "include/linux/types.h": b"/* */\n",
    "include/generated/utsrelease.h": b'#define UTS_RELEASE "6.6.6-kheaders"\n',
}


@pytest.fixture
def nowhere(tmp_path: Path) -> dict[str, Path]:
    """Paths where nothing is: no host tree, no bundled tree, no kheaders."""
    return {
        "modules": tmp_path / "modules",
        "bundled": tmp_path / "bundled",
        "kheaders": tmp_path / "kheaders.tar.xz",
    }


def find(where: dict[str, Path], **env: str) -> headers.KernelHeaders:
    return find_headers(
        {BUNDLED_ENV: str(where["bundled"]), **env},
        release=RELEASE,
        modules=where["modules"],
        kheaders=where["kheaders"],
    )


@pytest.mark.parametrize("split", [True, False], ids=["debian-split", "merged"])
def test_the_hosts_tree_first_and_bcc_finds_it_itself(
    nowhere: dict[str, Path], split: bool
) -> None:
    build = make_host(nowhere["modules"], split=split)
    make_tree(nowhere["bundled"])
    found = find(nowhere)
    assert (found.source, found.path) == (HeaderSource.HOST, build)
    assert found.compiler_env() == {}  # BCC's own search reaches build/ and source/


def test_a_host_release_directory_without_headers_is_passed_over(nowhere: dict[str, Path]) -> None:
    (nowhere["modules"] / RELEASE / "kernel").mkdir(parents=True)  # modules, no build/
    make_tree(nowhere["bundled"])
    found = find(nowhere)
    assert found.source is HeaderSource.BUNDLED
    assert found.compiler_env() == {"BCC_KERNEL_SOURCE": str(nowhere["bundled"])}
    assert found.release == "6.1.0-57-amd64"
    assert found.describe() == f"bundled {nowhere['bundled']} (6.1.0-57-amd64)"


def test_an_override_comes_before_the_host(nowhere: dict[str, Path], tmp_path: Path) -> None:
    make_host(nowhere["modules"], split=False)
    tree = make_tree(tmp_path / "mine", "5.15.0-custom")
    found = find(nowhere, **{OVERRIDE_ENV: str(tree)})
    assert (found.source, found.path, found.release) == (
        HeaderSource.OVERRIDE,
        tree,
        "5.15.0-custom",
    )


def test_an_override_that_is_not_a_tree_is_an_error_naming_it(
    nowhere: dict[str, Path], tmp_path: Path
) -> None:
    make_host(nowhere["modules"], split=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        HeadersMissingError, match=f"{OVERRIDE_ENV}=.*empty: not a kernel header tree"
    ):
        find(nowhere, **{OVERRIDE_ENV: str(tmp_path / "empty")})


def test_kheaders_extracted_into_a_private_directory(nowhere: dict[str, Path]) -> None:
    kheaders_archive(nowhere["kheaders"], TREE_FILES)
    found = find(nowhere)
    assert found.source is HeaderSource.KHEADERS
    assert found.release == "6.6.6-kheaders"
    assert (found.path / "include/linux/types.h").read_bytes() == b"/* */\n"
    mode = found.path.stat().st_mode
    assert stat.S_IMODE(mode) == 0o700 and found.path.stat().st_uid == os.getuid()
    assert found.path.name.startswith("ebpflb-kheaders-") and found.path.name != "ebpflb-kheaders-"
    assert found.compiler_env() == {"BCC_KERNEL_SOURCE": str(found.path)}


@pytest.mark.parametrize("bad", ["../escape.h", "/etc/escape.h"])
def test_kheaders_members_leaving_the_directory_refuse_the_whole_archive(
    nowhere: dict[str, Path], bad: str
) -> None:
    kheaders_archive(nowhere["kheaders"], {**TREE_FILES, bad: b"x"})
    with pytest.raises(HeadersMissingError, match="leaves the archive's root"):
        find(nowhere)


def test_kheaders_links_are_not_extracted(nowhere: dict[str, Path]) -> None:
    with tarfile.open(nowhere["kheaders"], "w:xz") as tar:
        for name, data in TREE_FILES.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("include/linux/passwd.h")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    found = find(nowhere)
    assert not (found.path / "include/linux/passwd.h").exists()


def test_no_tree_anywhere_says_what_to_install(nowhere: dict[str, Path]) -> None:
    with pytest.raises(HeadersMissingError) as caught:
        find(nowhere)
    message = str(caught.value)
    assert isinstance(caught.value, BpfLoadError)  # the agent's start reports it as such
    for needed in (
        str(nowhere["modules"] / RELEASE / "build"),
        str(nowhere["bundled"]),
        str(nowhere["kheaders"]),
        f"linux-headers-{RELEASE}",
        OVERRIDE_ENV,
    ):
        assert needed in message, (needed, message)


def test_the_finder_searches_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def fake_find() -> headers.KernelHeaders:
        calls.append(1)
        return headers.KernelHeaders(HeaderSource.BUNDLED, Path("/x"), "")

    monkeypatch.setattr(headers, "find_headers", fake_find)
    finder = headers.HeaderFinder()
    assert finder.get() is finder.get()
    assert len(calls) == 1
