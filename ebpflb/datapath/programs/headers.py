"""Which kernel header tree BCC compiles bpf/ against, found without the host's help.

BCC looks for headers under /lib/modules/$(uname -r)/build, which most managed node images
(Container-Optimized OS, Bottlerocket, Talos, Amazon Linux 2023) do not ship. ebpflb's
programs use UAPI definitions only, so any recent header tree compiles them for any kernel
(the development VM compiles against Debian's 6.1 headers on 6.18). The tree, in order:

1. override: EBPFLB_KERNEL_HEADERS, a tree an operator names;
2. host: the running kernel's /lib/modules/<release>/build, when one is there (mounted);
3. bundled: the tree the image ships (EBPFLB_BUNDLED_HEADERS, default
   /usr/share/ebpflb/kernel-headers; scripts/bundle-headers.sh builds it);
4. kheaders: /sys/kernel/kheaders.tar.xz (CONFIG_IKHEADERS; EBPFLB_KHEADERS names another
   copy of it) extracted into a directory of this process's own (mkdtemp, mode 0700):
   never a guessable shared path, which is what made BCC's own extraction CVE-2024-2314;
5. none: HeadersMissingError, saying what to install.

Only a compile needs headers: adopting pinned programs or loading stored bytecode does not,
so the search (and the extraction) happens at the first compile. A tree other than the
host's reaches BCC as BCC_KERNEL_SOURCE, in the compiler child's environment only; such a
tree must be merged (the generic include/ and arch/<arch>/include together with the
generated headers), as the kernel's own build tree and kheaders are.
"""

from __future__ import annotations

import atexit
import enum
import os
import platform
import re
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from ebpflb.errors import BpfLoadError

OVERRIDE_ENV = "EBPFLB_KERNEL_HEADERS"
BUNDLED_ENV = "EBPFLB_BUNDLED_HEADERS"
BUNDLED_DEFAULT = Path("/usr/share/ebpflb/kernel-headers")
KHEADERS_ENV = "EBPFLB_KHEADERS"
KHEADERS = Path("/sys/kernel/kheaders.tar.xz")
MODULES = Path("/lib/modules")
BCC_ENV = "BCC_KERNEL_SOURCE"

_UTS_RELEASE = re.compile(r'#define\s+UTS_RELEASE\s+"([^"]+)"')


class HeadersMissingError(BpfLoadError):
    """No kernel header tree to compile the programs with."""


class HeaderSource(enum.StrEnum):
    """Where the tree came from (the order they are tried in)."""

    OVERRIDE = "override"
    HOST = "host"
    BUNDLED = "bundled"
    KHEADERS = "kheaders"


@dataclass(frozen=True, slots=True)
class KernelHeaders:
    source: HeaderSource
    path: Path  # the tree's root (for HOST: /lib/modules/<release>/build)
    release: str  # the kernel release the tree was made for (UTS_RELEASE), "" if unknown

    def compiler_env(self) -> dict[str, str]:
        """What the compiler child's environment adds: BCC finds the host's tree itself
        (build plus source, as Debian splits them); any other is named to it."""
        return {} if self.source is HeaderSource.HOST else {BCC_ENV: str(self.path)}

    def describe(self) -> str:
        built_for = f" ({self.release})" if self.release else ""
        return f"{self.source.value} {self.path}{built_for}"


def _release_of(tree: Path) -> str:
    for candidate in (
        tree / "include/generated/utsrelease.h",
        tree / "include/config/kernel.release",
    ):
        try:
            text = candidate.read_text()
        except OSError:
            continue
        found = _UTS_RELEASE.search(text)
        return found.group(1) if found else text.strip()
    return ""


def _is_tree(tree: Path) -> bool:
    """A merged tree: the generic headers and the generated ones under one root."""
    return (tree / "include/linux").is_dir() and (tree / "include/generated").is_dir()


def _host_tree(modules: Path, release: str) -> Path | None:
    build = modules / release / "build"
    # Debian splits the tree: build/ holds the generated headers, source/ the rest.
    source = modules / release / "source"
    if (build / "include/generated").is_dir() and (
        (build / "include/linux").is_dir() or (source / "include/linux").is_dir()
    ):
        return build
    return None


def _plain_members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """Regular files and directories with relative paths inside the archive's root: no
    links, devices or `..` (this Python predates tarfile's extraction filters)."""
    for member in tar:
        parts = Path(member.name).parts
        if member.name.startswith("/") or ".." in parts:
            raise tarfile.TarError(f"member {member.name!r} leaves the archive's root")
        if member.isfile() or member.isdir():
            member.mode &= 0o755  # nothing set-id, nothing writable by others
            yield member


def extract_kheaders(archive: Path) -> Path:
    """`archive` (kheaders' tar.xz) unpacked into a new private directory, removed when
    this process exits."""
    directory = Path(tempfile.mkdtemp(prefix="ebpflb-kheaders-"))  # mode 0700, unique
    atexit.register(shutil.rmtree, directory, True)
    try:
        with tarfile.open(archive, "r:xz") as tar:
            tar.extractall(directory, members=_plain_members(tar))
    except (OSError, tarfile.TarError) as exc:
        shutil.rmtree(directory, ignore_errors=True)
        raise HeadersMissingError(f"cannot extract {archive}: {exc}") from exc
    return directory


def find_headers(
    env: Mapping[str, str] | None = None,
    *,
    release: str | None = None,
    modules: Path = MODULES,
    kheaders: Path | None = None,
) -> KernelHeaders:
    """The tree to compile with (see the module's docstring for the order)."""
    env = os.environ if env is None else env
    release = release or platform.release()
    override = env.get(OVERRIDE_ENV)
    if override:
        tree = Path(override)
        if not _is_tree(tree):
            raise HeadersMissingError(
                f"{OVERRIDE_ENV}={override}: not a kernel header tree (no include/linux"
                " and include/generated under it)"
            )
        return KernelHeaders(HeaderSource.OVERRIDE, tree, _release_of(tree))
    host = _host_tree(modules, release)
    if host is not None:
        return KernelHeaders(HeaderSource.HOST, host, _release_of(host))
    bundled = Path(env.get(BUNDLED_ENV) or BUNDLED_DEFAULT)
    kheaders = kheaders or Path(env.get(KHEADERS_ENV) or KHEADERS)
    if _is_tree(bundled):
        return KernelHeaders(HeaderSource.BUNDLED, bundled, _release_of(bundled))
    if kheaders.is_file():
        tree = extract_kheaders(kheaders)
        return KernelHeaders(HeaderSource.KHEADERS, tree, _release_of(tree) or release)
    raise HeadersMissingError(
        f"no kernel headers to compile the programs with: {modules / release / 'build'} has"
        f" none, there is no bundled tree at {bundled} (the ebpflb image ships one), and no"
        f" {kheaders} (CONFIG_IKHEADERS; `modprobe kheaders` loads it where it is a module)."
        f" Install the kernel's headers (Debian/Ubuntu: linux-headers-{release}; Fedora/RHEL:"
        f" kernel-devel-{release}), or name a tree with {OVERRIDE_ENV}"
    )


class HeaderFinder:
    """find_headers() once per process, at the first compile (kheaders is extracted once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found: KernelHeaders | None = None

    def get(self) -> KernelHeaders:
        with self._lock:
            if self._found is None:
                self._found = find_headers()
            return self._found


HEADERS = HeaderFinder()
