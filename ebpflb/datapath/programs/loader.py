"""The socket-LB and NodePort programs: into the kernel, attached, and taken away again.

Attachments outlive the agent on purpose: cgroup programs attached with bpf_prog_attach stay
until detached, tc filters and XDP programs stay on their interfaces, and maps are pinned,
so traffic keeps flowing while the agent restarts. Programs are pinned too, by build hash,
so a restarted agent whose programs are unchanged adopts them, attached as they are
(programset.py: adopted, loaded from stored bytecode, or compiled in a child process).

New programs are attached next to the old ones (cgroup: BPF_F_ALLOW_MULTI; tc: an atomic
filter replace; XDP: an atomic program swap) and then the old ones are detached, so there
is no moment without translation; two ebpflb connect4 programs in a row are harmless
because the second sees an already-translated backend address. Only then are the new
programs pinned and the old pins removed.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import logging
import os
import socket
import struct
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ebpflb.config import Config, SocketLbScope, XdpMode
from ebpflb.datapath import contract, probes
from ebpflb.datapath.maps import growable, pins
from ebpflb.datapath.programs import netdev, programset
from ebpflb.datapath.programs.programset import Function, Origin, ProgramSet
from ebpflb.datapath.syscall import bpfsys, uapi
from ebpflb.errors import AttachError, BpfLoadError, KernelSetupError

log = logging.getLogger(__name__)

BPF_DIR = programset.BPF_DIR
PROGRAM_PREFIX = "ebpflb_"  # every program ebpflb loads; cleanup detaches exactly these


class SockHook(enum.Enum):
    """Socket-LB programs and the cgroup hook each attaches to (kernel version it needs)."""

    CONNECT4 = ("ebpflb_connect4", uapi.BPF_CGROUP_INET4_CONNECT, "connect4")
    SENDMSG4 = ("ebpflb_sendmsg4", uapi.BPF_CGROUP_UDP4_SENDMSG, "sendmsg4")
    RECVMSG4 = ("ebpflb_recvmsg4", uapi.BPF_CGROUP_UDP4_RECVMSG, "recvmsg4")
    GETPEERNAME4 = ("ebpflb_getpeer4", uapi.BPF_CGROUP_INET4_GETPEERNAME, "getpeername4")
    CONNECT6 = ("ebpflb_connect6", uapi.BPF_CGROUP_INET6_CONNECT, "connect6")
    SENDMSG6 = ("ebpflb_sendmsg6", uapi.BPF_CGROUP_UDP6_SENDMSG, "sendmsg6")
    RECVMSG6 = ("ebpflb_recvmsg6", uapi.BPF_CGROUP_UDP6_RECVMSG, "recvmsg6")
    GETPEERNAME6 = ("ebpflb_getpeer6", uapi.BPF_CGROUP_INET6_GETPEERNAME, "getpeername6")

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
    # bpf_sk_storage_get in sock_addr programs (5.3): TCP reverse entries in the socket,
    # else in the LRU ebpflb_revsk4 (also chosen with --socket-storage=false).
    sk_storage: bool = False

    def cflags(self) -> list[str]:
        return [
            f"-D{contract.HAVE_SET_RETVAL}={int(self.set_retval)}",
            f"-D{contract.HAVE_SK_STORAGE}={int(self.sk_storage)}",
        ]

    @classmethod
    def from_report(cls, report: probes.KernelReport, socket_storage: bool = True) -> Features:
        return cls(
            set_retval=report.has("set_retval"),
            sk_storage=socket_storage and report.has("sk_storage_sock_addr"),
        )


@cache
def probe_features() -> Features:
    """The optional helpers the programs are compiled for, from the raw-syscall probe
    (probes/: a few milliseconds, nothing compiled, nothing printed)."""
    return Features.from_report(probes.probe())


def own_netns_cookie() -> int:
    """This process's network namespace cookie, as bpf_get_netns_cookie() gives it to the
    programs (SO_NETNS_COOKIE, Linux 5.14)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8)
        except OSError as exc:
            raise KernelSetupError(
                "--socket-lb=hostns-only needs this network namespace's cookie, which the"
                f" kernel gives from Linux 5.14 (SO_NETNS_COOKIE); this one does not"
                f" ({exc.strerror}): use --socket-lb=all, or off with --pod-interfaces"
            ) from exc
    return int(struct.unpack("=Q", raw)[0])


def netns_cookie_available() -> bool:
    """Whether --socket-lb=hostns-only can run on this kernel (own_netns_cookie answers)."""
    try:
        own_netns_cookie()
    except KernelSetupError:
        return False
    return True


SO_NETNS_COOKIE = 71  # asm-generic/socket.h


class SocketLB:
    """The socket-LB programs; attaching leaves them in the kernel after exit. With
    --socket-lb=hostns-only they are built for the agent's network namespace (its cookie);
    with off they are loaded (their maps serve the other programs too) but not attached."""

    def __init__(self, config: Config, features: Features | None = None) -> None:
        self.config = config
        self.features = features or probe_features()
        self.netns_cookie = (
            own_netns_cookie() if config.socket_lb is SocketLbScope.HOSTNS_ONLY else 0
        )
        pins.ensure_bpffs(config.bpffs_dir)
        pins.drop_incompatible(config)
        growable.ensure(config)  # the programs reach growable maps through pinned ref maps
        started = time.monotonic()
        scope = (
            [f"-D{contract.SOCK_NETNS_COOKIE}={self.netns_cookie}ULL"] if self.netns_cookie else []
        )
        self.programs = ProgramSet(
            BPF_DIR / "sock_lb.c",
            contract.cflags(config) + self.features.cflags() + scope,
            [
                Function(
                    hook.function,
                    uapi.BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
                    hook.attach_type,
                    f"the {hook.name.lower()} hook, kernel {hook.since}+",
                )
                for hook in SockHook
            ],
            config.bpffs_dir,
        )
        self.load_seconds = time.monotonic() - started
        log.info("socket-LB programs %s in %.2fs", self.programs.origin.value, self.load_seconds)

    @property
    def origin(self) -> Origin:
        return self.programs.origin

    @property
    def headers(self) -> str:
        """The kernel header tree the programs were compiled with ("" if not recorded)."""
        return self.programs.headers

    def program_fds(self) -> dict[str, int]:
        return dict(self.programs.fds)

    def program_ids(self) -> dict[str, int]:
        return self.programs.ids()

    def attach(self, cgroup: Path) -> int:
        """Attach to `cgroup` (where not attached yet), then detach any other ebpflb
        programs there (a previous agent's); how many were replaced. With
        --socket-lb=off, only the detaching."""
        if self.config.socket_lb is SocketLbScope.OFF:
            fd = _open_cgroup(cgroup)
            try:
                detached = _detach_ebpflb_programs(fd, cgroup)
            finally:
                os.close(fd)
            self.programs.commit_pins()
            return detached
        fd = _open_cgroup(cgroup)
        try:
            mine = set()
            for hook in SockHook:
                prog_fd = self.programs.fds[hook.function]
                prog_id = bpfsys.prog_info(prog_fd, hook.function).id
                try:
                    if prog_id not in bpfsys.prog_query(fd, hook.attach_type, str(cgroup)):
                        bpfsys.prog_attach(
                            fd,
                            prog_fd,
                            hook.attach_type,
                            uapi.BPF_F_ALLOW_MULTI,
                            f"{hook.function} to cgroup {cgroup}",
                        )
                except bpfsys.BpfError as exc:
                    raise AttachError(str(exc)) from exc
                mine.add(prog_id)
            replaced = _detach_ebpflb_programs(fd, cgroup, keep=mine)
        finally:
            os.close(fd)
        self.programs.commit_pins()
        if replaced:
            log.info("replaced %d programs of a previous ebpflb on %s", replaced, cgroup)
        return replaced

    def close(self) -> None:
        """Drop this process's handles; attached programs and pins stay in the kernel."""
        self.programs.close()


class NodePortLB:
    """The tc programs for NodePort, LoadBalancer and external IPs (bpf/nodeport.c), and
    the XDP one (bpf/nodeport_xdp.c) when asked for.

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
        cflags = contract.cflags(config) + self.features.cflags()
        self.programs = ProgramSet(
            BPF_DIR / "nodeport.c",
            cflags,
            [
                Function(self.INGRESS, uapi.BPF_PROG_TYPE_SCHED_CLS),
                Function(self.EGRESS, uapi.BPF_PROG_TYPE_SCHED_CLS),
            ],
            config.bpffs_dir,
        )
        self.xdp_programs: ProgramSet | None = None
        if config.xdp is not XdpMode.OFF:
            try:
                self.xdp_programs = ProgramSet(
                    BPF_DIR / "nodeport_xdp.c",
                    cflags,
                    [Function(self.XDP, uapi.BPF_PROG_TYPE_XDP)],
                    config.bpffs_dir,
                )
            except BaseException:
                self.programs.close()
                raise
        origins = [self.programs.origin.value]
        if self.xdp_programs is not None:
            origins.append(self.xdp_programs.origin.value)
        log.info("NodePort programs %s in %.2fs", "/".join(origins), time.monotonic() - started)

    @property
    def origin(self) -> Origin:
        """The costliest way any of its program files took."""
        order = list(Origin)
        sets = [self.programs, *([self.xdp_programs] if self.xdp_programs else [])]
        return max((s.origin for s in sets), key=order.index)

    @property
    def headers(self) -> str:
        """The kernel header tree the programs were compiled with ("" if not recorded)."""
        sets = [self.programs, *([self.xdp_programs] if self.xdp_programs else [])]
        return "; ".join(sorted({s.headers for s in sets if s.headers}))

    def attach(self, interfaces: Sequence[netdev.Interface]) -> dict[str, XdpMode]:
        """Attach tc on every interface, and XDP where asked and possible; the XDP mode
        each interface ended up with."""
        modes = {}
        for iface in interfaces:
            netdev.attach_tc(
                iface, netdev.TcDirection.INGRESS, self.program_fd(self.INGRESS), self.INGRESS
            )
            netdev.attach_tc(
                iface, netdev.TcDirection.EGRESS, self.program_fd(self.EGRESS), self.EGRESS
            )
            modes[iface.name] = self._attach_xdp(iface)
            addresses = ", ".join(map(str, iface.addresses)) or "no IPv4 address"
            log.info(
                "NodePort programs attached to %s (%s), ingress in %s",
                iface.name,
                addresses,
                "tc" if modes[iface.name] is XdpMode.OFF else f"XDP ({modes[iface.name].value})",
            )
        self.programs.commit_pins()
        if self.xdp_programs is not None:
            self.xdp_programs.commit_pins()
        return modes

    def program_ids(self) -> dict[str, int]:
        sets = [self.programs, *([self.xdp_programs] if self.xdp_programs else [])]
        return {name: id_ for s in sets for name, id_ in s.ids().items()}

    def program_fd(self, name: str) -> int:
        """The fd of one loaded program (INGRESS, EGRESS, or XDP when config.xdp is not
        off), to run it on test packets (ebpflb.datapath.programs.testrun)."""
        programs = dict(self.programs.fds)
        if self.xdp_programs is not None:
            programs.update(self.xdp_programs.fds)
        if name not in programs:
            raise BpfLoadError(f"{name} is not loaded (loaded: {', '.join(programs)})")
        return programs[name]

    def _attach_xdp(self, iface: netdev.Interface) -> XdpMode:
        mode = self.config.xdp
        if mode is XdpMode.OFF or self.xdp_programs is None:
            return XdpMode.OFF
        fd = self.xdp_programs.fds[self.XDP]
        if netdev.xdp_program_id(iface.name) == bpfsys.prog_info(fd, self.XDP).id:
            return mode  # adopted, and still attached
        try:
            netdev.attach_xdp(iface, fd, XDP_FLAGS[mode])
        except AttachError as exc:
            log.warning(
                "XDP (%s) on %s failed, falling back to tc: %s", mode.value, iface.name, exc
            )
            return XdpMode.OFF
        return mode

    def close(self) -> None:
        """Drop this process's handles; tc filters and XDP attachments keep the programs."""
        self.programs.close()
        if self.xdp_programs is not None:
            self.xdp_programs.close()


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
        with contextlib.suppress(AttachError):  # the mode it was attached in is the one that works
            netdev.detach_xdp(ifname, flags)
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
