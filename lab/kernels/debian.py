"""Debian's kernel packages for a kernel line, fetched once into a cache and verified on reuse.

A line ("5.10") maps to the Debian release that ships it (bullseye); its newest kernel is
what that release's `linux-image-amd64` depends on. apt is pointed at a private sources list
and state directory under the cache (the host's own apt configuration is left alone), so a
bookworm machine can fetch bullseye's packages. apt checks the Release signatures and each
download's hash; the SHA-256 from the signed index goes into the cache's manifest, and every
later run hashes the cached .deb files against it before using them.

Cache layout (CACHE = /var/cache/ebpflb/kernels by default):
    CACHE/apt/<suite>/                  private apt lists
    CACHE/<line>.json                   which entry the line resolved to last
    CACHE/<release>_<version>/          one entry per exact kernel build (the cache key)
        debs/*.deb                      the packages as downloaded
        root/boot/vmlinuz-<release>
        root/lib/modules/<release>/     modules, modules.dep (depmod), build and source links
        root/usr/src/linux-headers-*/   headers BCC compiles against
        manifest.json                   written last: its presence means complete
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ebpflb.errors import EbpflbError

DEFAULT_CACHE = Path("/var/cache/ebpflb/kernels")
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


class KernelFetchError(EbpflbError):
    """A kernel's packages could not be resolved, downloaded, verified or unpacked."""


@dataclass(frozen=True, slots=True)
class KernelLine:
    """A supported kernel line and the Debian release whose kernel it is."""

    line: str  # "5.10"
    suite: str  # "bullseye"


LINES: Mapping[str, KernelLine] = {
    "5.10": KernelLine("5.10", "bullseye"),
    "6.1": KernelLine("6.1", "bookworm"),
}


def kernel_line(name: str) -> KernelLine:
    try:
        return LINES[name]
    except KeyError:
        known = ", ".join(LINES)
        raise KernelFetchError(f"unknown kernel line {name!r} (known: {known})") from None


@dataclass(frozen=True, slots=True)
class Package:
    """One .deb as the signed index describes it."""

    name: str
    version: str
    sha256: str
    filename: str  # the index's pool path; its basename is the local file name

    @property
    def deb(self) -> str:
        return os.path.basename(self.filename)


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a cache entry holds; written after everything else, so it marks completeness."""

    line: str
    suite: str
    release: str  # uname -r inside the guest, e.g. "5.10.0-46-amd64"
    packages: tuple[Package, ...]

    @property
    def key(self) -> str:
        return cache_key(self.release, self.packages)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        return cls(
            line=data["line"],
            suite=data["suite"],
            release=data["release"],
            packages=tuple(Package(**p) for p in data["packages"]),
        )


@dataclass(frozen=True, slots=True)
class Kernel:
    """A verified cache entry, ready to boot."""

    manifest: Manifest
    root: Path  # the unpacked packages

    @property
    def release(self) -> str:
        return self.manifest.release

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.release}"

    @property
    def modules(self) -> Path:
        return self.root / "lib" / "modules" / self.release


def cache_key(release: str, packages: Sequence[Package]) -> str:
    """The entry's directory name: the kernel release and the Debian version of its image
    package, so a rebuilt package with the same ABI name (a new upload) gets a new entry."""
    image = [p for p in packages if p.name.startswith("linux-image-")]
    if len(image) != 1:
        raise KernelFetchError(f"expected one linux-image package, got {[p.name for p in image]}")
    return f"{release}_{image[0].version}"


def sources_list(suite: str) -> str:
    """A sources list for one Debian release (main, its point-release updates, security)."""
    signed = f"[signed-by={KEYRING}]"
    return (
        f"deb {signed} {MIRROR} {suite} main\n"
        f"deb {signed} {MIRROR} {suite}-updates main\n"
        f"deb {signed} {SECURITY_MIRROR} {suite}-security main\n"
    )


def parse_stanza(text: str) -> dict[str, str]:
    """The first deb822 stanza of `apt-cache show` output (continuation lines dropped)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        if line[0] in " \t":
            continue
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip()] = value.strip()
    return fields


def abi_from_depends(depends: str, line: str) -> str:
    """The ABI name ("5.10.0-46") from linux-image-amd64's Depends on the line's release."""
    prefix = "linux-image-"
    for alternative in depends.replace("|", ",").split(","):
        name = alternative.strip().split(" ")[0]
        if name.startswith(prefix) and name.endswith("-amd64"):
            abi = name[len(prefix) : -len("-amd64")]
            if abi == line or abi.startswith(f"{line}.") or abi.startswith(f"{line}-"):
                return abi
    raise KernelFetchError(f"linux-image-amd64 depends on no {line} kernel: {depends!r}")


def package_names(abi: str) -> tuple[str, ...]:
    """The packages an entry needs: the unsigned image (the same kernel as the signed one,
    without the shim-signing wrapper package) and the two header packages."""
    return (
        f"linux-image-{abi}-amd64-unsigned",
        f"linux-headers-{abi}-amd64",
        f"linux-headers-{abi}-common",
    )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class Apt:
    """apt-get/apt-cache on a private sources list and state directory for one release."""

    def __init__(self, directory: Path, suite: str) -> None:
        self.directory = directory
        self.suite = suite

    def _options(self) -> list[str]:
        d = self.directory
        return [
            f"-oDir::Etc::sourcelist={d / 'sources.list'}",
            "-oDir::Etc::sourceparts=/nonexistent",
            f"-oDir::State::Lists={d / 'lists'}",
            f"-oDir::State::status={d / 'status'}",
            f"-oDir::Cache={d / 'cache'}",
            "-oAPT::Architecture=amd64",
            "-oAPT::Architectures=amd64",
            "-oAcquire::Languages=none",
            "-oDebug::NoLocking=1",
        ]

    def _run(self, tool: str, *args: str, cwd: Path | None = None) -> str:
        argv = [tool, *self._options(), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=900)
        if proc.returncode != 0:
            raise KernelFetchError(
                f"{tool} {' '.join(args)} for {self.suite} failed ({proc.returncode}): "
                + (proc.stderr.strip() or proc.stdout.strip())[-2000:]
            )
        return proc.stdout

    def update(self) -> None:
        for sub in ("lists/partial", "cache/archives/partial"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        (self.directory / "sources.list").write_text(sources_list(self.suite))
        (self.directory / "status").touch()
        self._run("apt-get", "-qq", "update")

    def show(self, package: str) -> dict[str, str]:
        stanza = parse_stanza(self._run("apt-cache", "show", "--no-all-versions", package))
        if not stanza:
            raise KernelFetchError(f"{package} not found in {self.suite}")
        return stanza

    def download(self, package: Package, target: Path) -> None:
        self._run("apt-get", "-qq", "download", f"{package.name}={package.version}", cwd=target)


def resolve(line: KernelLine, apt: Apt) -> Manifest:
    """The newest kernel of `line` in its release, from a fresh index."""
    apt.update()
    abi = abi_from_depends(apt.show("linux-image-amd64").get("Depends", ""), line.line)
    packages = []
    for name in package_names(abi):
        fields = apt.show(name)
        packages.append(
            Package(
                name=name,
                version=fields["Version"],
                sha256=fields["SHA256"],
                filename=fields["Filename"],
            )
        )
    return Manifest(
        line=line.line, suite=line.suite, release=f"{abi}-amd64", packages=tuple(packages)
    )


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One fetcher per cache at a time (two matrix runs may start together)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def verify(entry: Path) -> Kernel:
    """Check a cache entry: manifest present, every .deb's SHA-256 as the index said, the
    unpacked kernel, modules index and header links in place."""
    manifest_path = entry / "manifest.json"
    if not manifest_path.is_file():
        raise KernelFetchError(f"{entry}: incomplete (no manifest.json)")
    manifest = Manifest.from_json(manifest_path.read_text())
    for package in manifest.packages:
        deb = entry / "debs" / package.deb
        if not deb.is_file():
            raise KernelFetchError(f"{entry}: {package.deb} missing")
        actual = sha256_of(deb)
        if actual != package.sha256:
            raise KernelFetchError(
                f"{deb}: SHA-256 {actual} differs from the index's {package.sha256}"
            )
    kernel = Kernel(manifest, entry / "root")
    needed = [kernel.vmlinuz, kernel.modules / "modules.dep"]
    for link in ("build", "source"):
        # absolute links, meant for the guest's view: follow them inside the entry
        target = os.readlink(kernel.modules / link) if (kernel.modules / link).is_symlink() else ""
        needed.append(
            kernel.root / target.lstrip("/") / "include" if target else kernel.modules / link
        )
    for path in needed:
        if not path.exists():
            raise KernelFetchError(f"{entry}: {path.relative_to(entry)} missing")
    return kernel


def _unpack(manifest: Manifest, debs: Path, root: Path) -> None:
    for package in manifest.packages:
        subprocess.run(["dpkg-deb", "-x", str(debs / package.deb), str(root)], check=True)
    modules = root / "lib" / "modules" / manifest.release
    # The guest sees the host's root with this tree bind-mounted on /lib/modules and
    # /usr/src, so the headers package's absolute links (/usr/src/linux-headers-...) hold.
    for link, target in (
        ("build", f"/usr/src/linux-headers-{manifest.release}"),
        ("source", f"/usr/src/linux-headers-{manifest.release.removesuffix('-amd64')}-common"),
    ):
        if not (modules / link).is_symlink():
            (modules / link).symlink_to(target)
    # modules.dep is made by the image package's postinst, which dpkg-deb -x does not run.
    subprocess.run(["depmod", "-b", str(root), manifest.release], check=True)


def fetch(line: KernelLine, cache: Path = DEFAULT_CACHE, refresh: bool = False) -> Kernel:
    """The line's kernel from the cache, or fetched into it. Without `refresh`, the entry
    this line resolved to last time is reused (no network) while it verifies."""
    with _locked(cache):
        pointer = cache / f"{line.line}.json"
        if pointer.is_file() and not refresh:
            entry = cache / json.loads(pointer.read_text())["entry"]
            try:
                return verify(entry)
            except KernelFetchError:
                pass  # damaged or partial: fetch again below
        manifest = resolve(line, Apt(cache / "apt" / line.suite, line.suite))
        entry = cache / manifest.key
        try:
            kernel = verify(entry)
        except KernelFetchError:
            shutil.rmtree(entry, ignore_errors=True)
            debs = entry / "debs"
            debs.mkdir(parents=True)
            apt = Apt(cache / "apt" / line.suite, line.suite)
            for package in manifest.packages:
                apt.download(package, debs)
                actual = sha256_of(debs / package.deb)
                if actual != package.sha256:
                    raise KernelFetchError(
                        f"{package.deb}: SHA-256 {actual}, index says {package.sha256}"
                    ) from None
            _unpack(manifest, debs, entry / "root")
            tmp = entry / "manifest.json.tmp"
            tmp.write_text(manifest.to_json())
            tmp.rename(entry / "manifest.json")
            kernel = verify(entry)
        tmp = pointer.with_suffix(".tmp")
        tmp.write_text(json.dumps({"entry": manifest.key}) + "\n")
        tmp.rename(pointer)
        return kernel
