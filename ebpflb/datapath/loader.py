"""Compile bpf/*.c with BCC, load the programs, attach them, and take them away again.

Attachments outlive the agent on purpose: cgroup programs attached with bpf_prog_attach stay
until detached, and maps are pinned, so traffic keeps flowing while the agent restarts. A
new agent attaches its programs next to the old ones (BPF_F_ALLOW_MULTI) and then detaches
the old ones, so there is no moment without translation; two ebpflb connect4 programs in a
row are harmless because the second sees an already-translated backend address.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import importlib.resources
import logging
import os
import re
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import bcc
from bcc import BPF, BPFAttachType

from ebpflb.config import Config, XdpMode
from ebpflb.datapath import bpfsys, contract, growable, netdev, pins, probes, progcache
from ebpflb.errors import AttachError, BpfLoadError

log = logging.getLogger(__name__)

# The C sources are package data (ebpflb/bpf, see pyproject.toml): an installed agent compiles
# the sources it was installed with, wherever it runs from.
BPF_DIR = Path(str(importlib.resources.files("ebpflb") / "bpf")).resolve()
PROGRAM_PREFIX = "ebpflb_"  # every program ebpflb loads; cleanup detaches exactly these
BPF_F_ALLOW_MULTI = 1 << 1

_BCC_VERSION = getattr(bcc, "__version__", "unknown")
_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


class SockHook(enum.Enum):
    """Socket-LB programs and the cgroup hook each attaches to (kernel version it needs)."""

    CONNECT4 = ("ebpflb_connect4", BPFAttachType.CGROUP_INET4_CONNECT, "connect4")
    SENDMSG4 = ("ebpflb_sendmsg4", BPFAttachType.CGROUP_UDP4_SENDMSG, "sendmsg4")
    RECVMSG4 = ("ebpflb_recvmsg4", BPFAttachType.CGROUP_UDP4_RECVMSG, "recvmsg4")
    GETPEERNAME4 = ("ebpflb_getpeer4", BPFAttachType.CGROUP_INET4_GETPEERNAME, "getpeername4")

    @property
    def function(self) -> str:
        return self.value[0]

    @property
    def attach_type(self) -> int:
        return int(self.value[1])

    @property
    def since(self) -> str:
        return probes.BY_KEY[self.value[2]].since


@dataclass(frozen=True, slots=True)
class Features:
    """Kernel capabilities found by probing, not by version numbers."""

    set_retval: bool  # bpf_set_retval in cgroup programs (5.18): ECONNREFUSED, not EPERM

    def cflags(self) -> list[str]:
        return [f"-D{contract.HAVE_SET_RETVAL}={int(self.set_retval)}"]

    @classmethod
    def from_report(cls, report: probes.KernelReport) -> Features:
        return cls(set_retval=report.has("set_retval"))


def assemble_source(main: Path) -> str:
    """Inline the local (quoted) includes of a program, with #line markers.

    BCC rewrites map accesses (map.lookup(...)) only in the main file, so the helpers in
    bpf/lib/*.h must become part of it; #line keeps compiler messages pointing at the real
    file and line.
    """
    seen: set[Path] = set()

    def expand(path: Path) -> Iterator[str]:
        yield f'#line 1 "{path.relative_to(BPF_DIR.parent)}"\n'
        for lineno, line in enumerate(path.read_text().splitlines(keepends=True), start=1):
            match = _LOCAL_INCLUDE.match(line)
            if not match:
                yield line
                continue
            header = (path.parent / match.group(1)).resolve()
            if header not in seen:
                seen.add(header)
                yield from expand(header)
            yield f'#line {lineno + 1} "{path.relative_to(BPF_DIR.parent)}"\n'

    return "".join(expand(main.resolve()))


def compile_program(source: Path, cflags: list[str]) -> BPF:
    try:
        return BPF(text=assemble_source(source).encode(), cflags=cflags)
    except Exception as exc:  # BCC raises bare Exception; its message names the file
        raise BpfLoadError(f"compiling {source.name} failed: {exc}") from exc


class CachedPrograms:
    """Programs from the program cache (progcache.py), with the part of BPF's interface
    the loader uses: load_func and cleanup."""

    def __init__(self, entry: progcache.Entry, map_fds: list[int]) -> None:
        self._entry = entry
        self._maps = map_fds
        self._functions: list[BPF.Function] = []

    def load_func(self, name: bytes, prog_type: int, attach_type: int = -1) -> BPF.Function:
        fd = progcache.load_function(self._entry, self._maps, name.decode(), prog_type, attach_type)
        function = BPF.Function(None, name, fd)
        self._functions.append(function)
        return function

    def cleanup(self) -> None:
        for fd in [*self._maps, *(f.fd for f in self._functions)]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._maps, self._functions = [], []


def compile_cached(
    source: Path, cflags: list[str], functions: Sequence[str], pin_dir: Path
) -> BPF | CachedPrograms:
    """compile_program, or its bytecode from the program cache when EBPFLB_PROGRAM_CACHE
    names one (filled on a miss): the same programs without running clang."""
    directory = progcache.cache_dir()
    if directory is None:
        return compile_program(source, cflags)
    text = assemble_source(source)
    # The pin directory only tells BCC where the maps are (the cache finds them itself):
    # agents on different pin directories share entries.
    pin_flag = f"-D{contract.PIN_DIR.macro}="
    shape = [flag for flag in cflags if not flag.startswith(pin_flag)]
    path = directory / f"{progcache.cache_key(text, shape, functions, _BCC_VERSION)}.json"
    entry = progcache.load(path)
    if entry is not None and set(functions) <= set(entry.functions):
        try:
            return CachedPrograms(entry, progcache.open_maps(entry, pin_dir))
        except bpfsys.BpfError as exc:
            log.warning("program cache entry %s unusable, compiling: %s", path.name, exc)
    bpf = compile_program(source, cflags)
    recorded = progcache.record(
        {f: bpf.dump_func(f.encode()) for f in functions},
        pin_dir,
        also=[name.value for name in contract.MAPS],
    )
    if recorded is not None:
        progcache.store(path, recorded)
    return bpf


@cache
def probe_features() -> Features:
    """The optional helpers the programs are compiled for, from the raw-syscall probe
    (probes.py: a few milliseconds, nothing compiled, nothing printed)."""
    return Features.from_report(probes.probe())


class SocketLB:
    """The compiled socket-LB programs; attaching leaves them in the kernel after exit."""

    def __init__(self, config: Config, features: Features | None = None) -> None:
        self.config = config
        self.features = features or probe_features()
        pins.ensure_bpffs(config.bpffs_dir)
        pins.drop_incompatible(config)
        growable.ensure(config)  # the programs reach growable maps through pinned ref maps
        started = time.monotonic()
        self._bpf = compile_cached(
            BPF_DIR / "sock_lb.c",
            config.cflags() + self.features.cflags(),
            [hook.function for hook in SockHook],
            config.bpffs_dir,
        )
        self._functions = {}
        for hook in SockHook:
            try:
                self._functions[hook] = self._bpf.load_func(
                    hook.function.encode(), BPF.CGROUP_SOCK_ADDR, attach_type=hook.attach_type
                )
            except Exception as exc:
                raise BpfLoadError(
                    f"loading {hook.function} for the {hook.name.lower()} hook failed "
                    f"(needs kernel {hook.since}+): {exc}"
                ) from exc
        self.load_seconds = time.monotonic() - started
        log.info("compiled and loaded socket-LB programs in %.2fs", self.load_seconds)

    def attach(self, cgroup: Path) -> int:
        """Attach to `cgroup`, then detach any older ebpflb programs there (restart); how
        many older programs were replaced."""
        fd = _open_cgroup(cgroup)
        try:
            mine = set()
            for hook, function in self._functions.items():
                try:
                    BPF.attach_func(function, fd, hook.attach_type, BPF_F_ALLOW_MULTI)
                except Exception as exc:
                    raise AttachError(
                        f"attaching {hook.function} to cgroup {cgroup} failed: {exc}"
                    ) from exc
                mine.add(bpfsys.prog_info(function.fd, hook.function).id)
            replaced = _detach_ebpflb_programs(fd, cgroup, keep=mine)
        finally:
            os.close(fd)
        if replaced:
            log.info("replaced %d programs of a previous ebpflb on %s", replaced, cgroup)
        return replaced

    def close(self) -> None:
        """Drop this process's handles; attached programs and pins stay in the kernel."""
        self._bpf.cleanup()


class NodePortLB:
    """The tc programs for NodePort, LoadBalancer and external IPs (bpf/nodeport.c).

    tc filters keep their programs loaded after the agent exits, like the cgroup
    attachments; a restarted agent replaces them in place (netdev.attach_tc)."""

    INGRESS = "ebpflb_np_in"
    EGRESS = "ebpflb_np_out"
    XDP = "ebpflb_np_xdp"

    def __init__(self, config: Config, features: Features | None = None) -> None:
        self.config = config
        self.features = features or probe_features()
        growable.ensure(config)  # usually done by SocketLB already; idempotent
        started = time.monotonic()
        cflags = config.cflags() + self.features.cflags()
        self._bpf = compile_cached(
            BPF_DIR / "nodeport.c", cflags, [self.INGRESS, self.EGRESS], config.bpffs_dir
        )
        self._xdp_bpf: BPF | CachedPrograms | None = None
        try:
            self._ingress = self._bpf.load_func(self.INGRESS.encode(), BPF.SCHED_CLS)
            self._egress = self._bpf.load_func(self.EGRESS.encode(), BPF.SCHED_CLS)
            if config.xdp is not XdpMode.OFF:
                self._xdp_bpf = compile_cached(
                    BPF_DIR / "nodeport_xdp.c", cflags, [self.XDP], config.bpffs_dir
                )
                self._xdp = self._xdp_bpf.load_func(self.XDP.encode(), BPF.XDP)
        except Exception as exc:
            raise BpfLoadError(f"loading the NodePort programs failed: {exc}") from exc
        log.info("compiled and loaded NodePort programs in %.2fs", time.monotonic() - started)

    def attach(self, interfaces: Sequence[netdev.Interface]) -> dict[str, XdpMode]:
        """Attach tc on every interface, and XDP where asked and possible; the XDP mode
        each interface ended up with."""
        modes = {}
        for iface in interfaces:
            netdev.attach_tc(iface, netdev.TcDirection.INGRESS, self._ingress.fd, self.INGRESS)
            netdev.attach_tc(iface, netdev.TcDirection.EGRESS, self._egress.fd, self.EGRESS)
            modes[iface.name] = self._attach_xdp(iface.name)
            addresses = ", ".join(map(str, iface.addresses)) or "no IPv4 address"
            log.info(
                "NodePort programs attached to %s (%s), ingress in %s",
                iface.name,
                addresses,
                "tc" if modes[iface.name] is XdpMode.OFF else f"XDP ({modes[iface.name].value})",
            )
        return modes

    def program_fd(self, name: str) -> int:
        """The fd of one loaded program (INGRESS, EGRESS, or XDP when config.xdp is not
        off), to run it on test packets (ebpflb.datapath.testrun)."""
        programs = {self.INGRESS: self._ingress, self.EGRESS: self._egress}
        if self._xdp_bpf is not None:
            programs[self.XDP] = self._xdp
        if name not in programs:
            raise BpfLoadError(f"{name} is not loaded (loaded: {', '.join(programs)})")
        return int(programs[name].fd)

    def _attach_xdp(self, ifname: str) -> XdpMode:
        mode = self.config.xdp
        if mode is XdpMode.OFF or self._xdp_bpf is None:
            return XdpMode.OFF
        try:
            BPF.attach_xdp(ifname.encode(), self._xdp, XDP_FLAGS[mode])
        except Exception as exc:
            log.warning("XDP (%s) on %s failed, falling back to tc: %s", mode.value, ifname, exc)
            return XdpMode.OFF
        return mode

    def close(self) -> None:
        """Drop this process's handles; tc filters and XDP attachments keep the programs."""
        self._bpf.cleanup()
        if self._xdp_bpf is not None:
            self._xdp_bpf.cleanup()


XDP_FLAGS = {XdpMode.GENERIC: 1 << 1, XdpMode.NATIVE: 1 << 2}  # XDP_FLAGS_SKB/DRV_MODE


def detach_xdp(ifname: str) -> int:
    """Remove ebpflb's XDP program from an interface (another's stays); 1 if removed."""
    prog_id = netdev.xdp_program_id(ifname)
    if prog_id is None:
        return 0
    try:
        prog_fd = bpfsys.prog_fd_by_id(prog_id)
    except bpfsys.BpfError as exc:
        if exc.errno == errno.ENOENT:
            return 0  # detached meanwhile
        raise
    try:
        if not bpfsys.prog_info(prog_fd, f"the XDP program on {ifname}").name.startswith(
            PROGRAM_PREFIX
        ):
            return 0
    finally:
        os.close(prog_fd)
    for flags in XDP_FLAGS.values():
        with contextlib.suppress(Exception):  # the mode it was attached in is the one that works
            BPF.remove_xdp(ifname.encode(), flags)
    return 1


def _open_cgroup(cgroup: Path) -> int:
    try:
        return os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise AttachError(f"cannot open cgroup {cgroup}: {exc.strerror}") from exc


def _cgroup_programs(cgroup_fd: int, cgroup: Path) -> Iterator[tuple[SockHook, int, int, str]]:
    """(hook, id, open fd, name) of every program attached to the cgroup's socket hooks; the
    fd is closed when the iteration moves on. One detached meanwhile is skipped."""
    for hook in SockHook:
        for prog_id in bpfsys.prog_query(cgroup_fd, hook.attach_type, f"cgroup {cgroup}"):
            try:
                prog_fd = bpfsys.prog_fd_by_id(prog_id)
            except bpfsys.BpfError as exc:
                if exc.errno == errno.ENOENT:
                    continue
                raise
            try:
                name = bpfsys.prog_info(prog_fd, f"program id {prog_id}").name
                yield hook, prog_id, prog_fd, name
            finally:
                os.close(prog_fd)


def _detach_ebpflb_programs(cgroup_fd: int, cgroup: Path, keep: Collection[int] = ()) -> int:
    detached = 0
    for hook, prog_id, prog_fd, name in _cgroup_programs(cgroup_fd, cgroup):
        if name.startswith(PROGRAM_PREFIX) and prog_id not in keep:
            bpfsys.prog_detach(cgroup_fd, prog_fd, hook.attach_type, f"{name} from cgroup {cgroup}")
            detached += 1
    return detached


def attached_programs(cgroup: Path) -> list[tuple[str, str]]:
    """(hook, program name) of every ebpflb program attached to `cgroup`."""
    fd = _open_cgroup(cgroup)
    try:
        return [
            (hook.name.lower(), name)
            for hook, _, _, name in _cgroup_programs(fd, cgroup)
            if name.startswith(PROGRAM_PREFIX)
        ]
    finally:
        os.close(fd)


def cleanup(
    bpffs_dir: Path, cgroup: Path, interfaces: Sequence[str] | None = None
) -> tuple[int, int]:
    """Detach every ebpflb program from `cgroup` and from the tc hooks of `interfaces`
    (None: every interface in this network namespace), and remove the pins;
    (programs, pins)."""
    detached = 0
    names = interfaces if interfaces is not None else [i.name for i in netdev.all_links()]
    for name in names:
        detached += netdev.detach_tc(name) + detach_xdp(name)
    if cgroup.exists():
        fd = _open_cgroup(cgroup)
        try:
            detached += _detach_ebpflb_programs(fd, cgroup)
        finally:
            os.close(fd)
    removed = pins.remove_pins(bpffs_dir)
    return detached, removed
