"""What this kernel's BPF subsystem offers, found by trying each thing the agent uses.

Each probe makes one bpf(2) call with a hand-assembled program (a few instructions), a tiny
map or a BTF blob, and drops it at once: no compiler, no verifier log, a few milliseconds
for all of them. Probing by trying rather than by version number is what distribution
kernels need: they backport features (and a few leave some out).

What the agent does with the answers is pure (`assess`), so it is unit-tested with made-up
results: a missing feature the configuration needs stops the start with a KernelSetupError
naming it and the kernel it needs, before anything is compiled or attached; a missing
optional one costs one log line saying what the user loses, and is shown in /status
(`features`) and in the metric ebpflb_kernel_feature{feature}.

Over 400 lines on purpose: each probe is a few hand-assembled instructions or a tiny map
next to what its absence costs; read as one table, like the README's.
"""

from __future__ import annotations

import enum
import errno
import json
import logging
import os
import platform
import struct
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ebpflb.datapath.syscall import bpfsys
from ebpflb.errors import KernelSetupError

log = logging.getLogger(__name__)

# uapi/linux/bpf.h values (stable ABI).
PROG_TYPE_SCHED_CLS = 3
PROG_TYPE_XDP = 6
PROG_TYPE_CGROUP_SOCK_ADDR = 18
ATTACH_INET4_CONNECT = 10
ATTACH_UDP4_SENDMSG = 14
ATTACH_UDP4_RECVMSG = 19
ATTACH_INET4_GETPEERNAME = 29
ATTACH_INET6_CONNECT = 11
ATTACH_UDP6_SENDMSG = 15
ATTACH_UDP6_RECVMSG = 20
ATTACH_INET6_GETPEERNAME = 30
MAP_TYPE_HASH = 1
MAP_TYPE_ARRAY = 2
MAP_TYPE_ARRAY_OF_MAPS = 12
MAP_TYPE_SK_STORAGE = 24
SOCK_ADDR_SK_OFFSET = 64  # offsetof(struct bpf_sock_addr, sk)
F_NO_PREALLOC = 1 << 0
F_MMAPABLE = 1 << 10
F_INNER_MAP = 1 << 12
FUNC_SK_STORAGE_GET = 107
FUNC_REDIRECT_NEIGH = 152
FUNC_SET_RETVAL = 187


class Need(enum.Enum):
    """When the agent cannot start without a feature."""

    ALWAYS = "always"  # socket-LB, which every agent runs
    NODEPORT = "with --interfaces"  # the tc programs
    OPTIONAL = "optional"  # the agent works around its absence
    UNUSED = "unused"  # reported for operators; this version does not use it


@dataclass(frozen=True, slots=True)
class Feature:
    key: str  # the name in /status, the metric's label and the matrix's features.json
    name: str
    since: str  # first mainline kernel with it
    need: Need
    used_for: str  # what the agent does with it
    fallback: str  # what a user gets without it


# --- the probes: each returns None when the kernel has the feature, else the errno ---------

_Probe = Callable[[], None]


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def _mov(dst: int, imm: int) -> bytes:
    return _insn(0xB7, dst=dst, imm=imm)  # BPF_ALU64 | BPF_MOV | BPF_K


def _call(helper: int) -> bytes:
    return _insn(0x85, imm=helper)  # BPF_JMP | BPF_CALL


_EXIT = _insn(0x95)  # BPF_JMP | BPF_EXIT


def _load(prog_type: int, code: bytes, what: str, attach_type: int = 0) -> _Probe:
    def probe() -> None:
        os.close(bpfsys.prog_load(prog_type, code, what, attach_type, name="ebpflb_probe"))

    return probe


def _sock_addr(attach_type: int, what: str, code: bytes = _mov(0, 1) + _EXIT) -> _Probe:
    return _load(PROG_TYPE_CGROUP_SOCK_ADDR, code, what, attach_type)


def _map(map_type: int, what: str, flags: int = 0) -> _Probe:
    def probe() -> None:
        os.close(bpfsys.map_create(map_type, 4, 8, 1, what, flags))

    return probe


def _inner_map() -> None:
    """An array that may sit in a map of maps whatever its size (BPF_F_INNER_MAP), held
    by a one-slot array of maps: how the slot pool and conntrack grow (growable.py)."""
    inner = bpfsys.map_create(
        MAP_TYPE_ARRAY, 4, 8, 2, "a probe inner array", F_MMAPABLE | F_INNER_MAP
    )
    try:
        outer = bpfsys.map_create(
            MAP_TYPE_ARRAY_OF_MAPS, 4, 4, 1, "a probe array of maps", inner_map_fd=inner
        )
        os.close(outer)
    finally:
        os.close(inner)


def _batch_ops() -> None:
    fd = bpfsys.map_create(MAP_TYPE_HASH, 4, 4, 1, "a probe hash map")
    try:
        bpfsys.map_lookup_batch(fd, 4, 4, 1, "a probe hash map")
    except bpfsys.BpfError as exc:
        if exc.errno != errno.ENOENT:  # ENOENT: the command ran and found the map empty
            raise
    finally:
        os.close(fd)


def _int_btf() -> bytes:
    """A BTF blob with one type, id 1: a 32-bit signed int (uapi/linux/btf.h)."""
    strings = b"\0int\0"
    types = struct.pack("<III", 1, 1 << 24, 4) + struct.pack("<I", (1 << 24) | 32)
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return header + types + strings


def _sk_storage_map() -> int:
    """A socket storage map (int key and value, BTF-described as the kernel demands)."""
    btf = bpfsys.btf_load(_int_btf(), "probe BTF")
    try:
        return bpfsys.map_create(
            MAP_TYPE_SK_STORAGE, 4, 4, 0, "a probe socket storage", F_NO_PREALLOC, btf, 1, 1
        )
    finally:
        os.close(btf)


def _sk_storage() -> None:
    os.close(_sk_storage_map())


def _ld_map_fd(dst: int, fd: int) -> bytes:
    """r`dst` = the map `fd` (BPF_LD | BPF_IMM | BPF_DW with BPF_PSEUDO_MAP_FD: two slots)."""
    return _insn(0x18, dst=dst, src=1, imm=fd) + _insn(0)


def _sk_storage_in_sock_addr() -> None:
    """A connect4 program calling bpf_sk_storage_get(map, ctx->sk, NULL, 0)."""
    fd = _sk_storage_map()
    try:
        code = (
            _insn(0x79, dst=2, src=1, off=SOCK_ADDR_SK_OFFSET)  # r2 = ctx->sk (u64 load)
            + _ld_map_fd(1, fd)
            + _mov(3, 0)
            + _mov(4, 0)
            + _call(FUNC_SK_STORAGE_GET)
            + _mov(0, 1)
            + _EXIT
        )
        _sock_addr(ATTACH_INET4_CONNECT, "a probe program calling bpf_sk_storage_get", code)()
    finally:
        os.close(fd)


def _links() -> None:
    prog = bpfsys.prog_load(
        PROG_TYPE_CGROUP_SOCK_ADDR,
        _mov(0, 1) + _EXIT,
        "a probe connect4 program",
        ATTACH_INET4_CONNECT,
        name="ebpflb_probe",
    )
    try:
        # No target (fd -1): a kernel with links answers EBADF, one without EINVAL. Nothing
        # is ever attached.
        os.close(bpfsys.link_create(prog, -1, ATTACH_INET4_CONNECT, "a probe program"))
    except bpfsys.BpfError as exc:
        if exc.errno != errno.EBADF:
            raise
    finally:
        os.close(prog)


_REFUSE = "the agent does not start"

FEATURES: tuple[tuple[Feature, _Probe], ...] = (
    (
        Feature(
            "connect4",
            "cgroup connect4 hook",
            "4.17",
            Need.ALWAYS,
            "ClusterIP TCP (and connected UDP) translated at connect()",
            _REFUSE,
        ),
        _sock_addr(ATTACH_INET4_CONNECT, "a probe connect4 program"),
    ),
    (
        Feature(
            "sendmsg4",
            "cgroup sendmsg4 hook",
            "4.18",
            Need.ALWAYS,
            "unconnected UDP to a ClusterIP translated per sendmsg()",
            _REFUSE,
        ),
        _sock_addr(ATTACH_UDP4_SENDMSG, "a probe sendmsg4 program"),
    ),
    (
        Feature(
            "recvmsg4",
            "cgroup recvmsg4 hook",
            "5.2",
            Need.ALWAYS,
            "UDP replies seen from the ClusterIP",
            _REFUSE,
        ),
        _sock_addr(ATTACH_UDP4_RECVMSG, "a probe recvmsg4 program"),
    ),
    (
        Feature(
            "getpeername4",
            "cgroup getpeername4 hook",
            "5.8",
            Need.ALWAYS,
            "getpeername() answers the ClusterIP",
            _REFUSE,
        ),
        _sock_addr(ATTACH_INET4_GETPEERNAME, "a probe getpeername4 program"),
    ),
    (
        Feature(
            "connect6",
            "cgroup connect6 hook",
            "4.17",
            Need.ALWAYS,
            "IPv6 (and IPv4-mapped) ClusterIP TCP and connected UDP translated at connect()",
            _REFUSE,
        ),
        _sock_addr(ATTACH_INET6_CONNECT, "a probe connect6 program"),
    ),
    (
        Feature(
            "sendmsg6",
            "cgroup sendmsg6 hook",
            "4.18",
            Need.ALWAYS,
            "unconnected UDP to an IPv6 ClusterIP translated per sendmsg()",
            _REFUSE,
        ),
        _sock_addr(ATTACH_UDP6_SENDMSG, "a probe sendmsg6 program"),
    ),
    (
        Feature(
            "recvmsg6",
            "cgroup recvmsg6 hook",
            "5.2",
            Need.ALWAYS,
            "UDP replies seen from the IPv6 ClusterIP",
            _REFUSE,
        ),
        _sock_addr(ATTACH_UDP6_RECVMSG, "a probe recvmsg6 program"),
    ),
    (
        Feature(
            "getpeername6",
            "cgroup getpeername6 hook",
            "5.8",
            Need.ALWAYS,
            "getpeername() on an IPv6 socket answers the ClusterIP",
            _REFUSE,
        ),
        _sock_addr(ATTACH_INET6_GETPEERNAME, "a probe getpeername6 program"),
    ),
    (
        Feature(
            "mmapable_array",
            "memory-mapped array (BPF_F_MMAPABLE)",
            "5.5",
            Need.ALWAYS,
            "Maglev slot pool written as memory",
            _REFUSE,
        ),
        _map(MAP_TYPE_ARRAY, "a probe mmapable array", F_MMAPABLE),
    ),
    (
        Feature(
            "inner_map",
            "inner maps of any size (BPF_F_INNER_MAP)",
            "5.10",
            Need.ALWAYS,
            "slot pool and conntrack that start small and grow (a larger map swapped in)",
            _REFUSE,
        ),
        _inner_map,
    ),
    (
        Feature(
            "set_retval",
            "bpf_set_retval",
            "5.18",
            Need.OPTIONAL,
            "ECONNREFUSED for a Service without endpoints",
            "connect() to a Service without endpoints fails with EPERM, not ECONNREFUSED",
        ),
        _sock_addr(
            ATTACH_INET4_CONNECT,
            "a probe program calling bpf_set_retval",
            _mov(1, -errno.ECONNREFUSED) + _call(FUNC_SET_RETVAL) + _mov(0, 1) + _EXIT,
        ),
    ),
    (
        Feature(
            "batch_ops",
            "batched map operations",
            "5.6",
            Need.OPTIONAL,
            "maps read and written in batches",
            "one syscall per map entry (slower syncs)",
        ),
        _batch_ops,
    ),
    (
        Feature(
            "tc",
            "tc (clsact) BPF programs",
            "4.5",
            Need.NODEPORT,
            "NodePort, LoadBalancer and external IPs (--interfaces)",
            "the agent does not start with --interfaces",
        ),
        _load(PROG_TYPE_SCHED_CLS, _mov(0, 0) + _EXIT, "a probe tc program"),
    ),
    (
        Feature(
            "redirect_neigh",
            "bpf_redirect_neigh (tc)",
            "5.10",
            Need.NODEPORT,
            "NodePort DNAT/SNAT forwarded to other nodes",
            "the agent does not start with --interfaces",
        ),
        _load(
            PROG_TYPE_SCHED_CLS,
            _mov(1, 1) + _mov(2, 0) + _mov(3, 0) + _mov(4, 0) + _call(FUNC_REDIRECT_NEIGH) + _EXIT,
            "a probe program calling bpf_redirect_neigh",
        ),
    ),
    (
        Feature(
            "xdp",
            "XDP programs",
            "4.8",
            Need.OPTIONAL,
            "NodePort ingress in XDP (--xdp; native or generic is decided per interface)",
            "NodePort ingress in tc",
        ),
        _load(PROG_TYPE_XDP, _mov(0, 2) + _EXIT, "a probe XDP program"),
    ),
    (
        Feature(
            "sk_storage",
            "socket storage (SK_STORAGE)",
            "5.2",
            Need.ALWAYS,
            "the map ebpflb_sockrev4 (pinned with the others, used where sk_storage_sock_addr"
            " allows)",
            _REFUSE,
        ),
        _sk_storage,
    ),
    (
        Feature(
            "sk_storage_sock_addr",
            "bpf_sk_storage_get in cgroup sock_addr programs",
            "5.3",
            Need.OPTIONAL,
            "a TCP socket's reverse entry (getpeername) kept in the socket: no hash insert"
            " per connect(), gone with the socket",
            "TCP reverse entries in the LRU ebpflb_revsk4: one hash insert per connect(), and"
            " a closed socket's entry stays until evicted",
        ),
        _sk_storage_in_sock_addr,
    ),
    (
        Feature(
            "links",
            "bpf links for cgroup programs",
            "5.7",
            Need.UNUSED,
            "nothing yet (cgroup programs attach with BPF_PROG_ATTACH, multi-attach)",
            "nothing lost",
        ),
        _links,
    ),
)

BY_KEY: Mapping[str, Feature] = {feature.key: feature for feature, _ in FEATURES}


@dataclass(frozen=True, slots=True)
class Probed:
    feature: Feature
    available: bool
    error: str  # the errno's name when unavailable ("EINVAL"), else ""
    seconds: float


@dataclass(frozen=True, slots=True)
class KernelReport:
    """The probe's findings on one kernel."""

    release: str
    probed: tuple[Probed, ...]

    def has(self, key: str) -> bool:
        return any(p.available for p in self.probed if p.feature.key == key)

    def availability(self) -> dict[str, bool]:
        return {p.feature.key: p.available for p in self.probed}

    def seconds(self) -> float:
        return sum(p.seconds for p in self.probed)

    def status(self) -> dict[str, dict[str, Any]]:
        """The /status `features` section: {key: {available, used_for, fallback, ...}}."""
        return {
            p.feature.key: {
                "available": p.available,
                "name": p.feature.name,
                "since": p.feature.since,
                "needed": p.feature.need.value,
                "used_for": p.feature.used_for,
                "fallback": p.feature.fallback,
                **({"error": p.error} if p.error else {}),
            }
            for p in self.probed
        }


def probe(features: Sequence[tuple[Feature, _Probe]] = FEATURES) -> KernelReport:
    """Try every feature on the running kernel. KernelSetupError when the probe itself is
    refused (EPERM: not root / no CAP_BPF), which no kernel feature explains."""
    results = []
    for feature, attempt in features:
        started = time.perf_counter()
        error = ""
        try:
            attempt()
        except bpfsys.BpfError as exc:
            if exc.errno == errno.EPERM:
                raise KernelSetupError(
                    f"probing kernel features failed: {exc} (the agent needs root, or "
                    "CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON)"
                ) from exc
            error = errno.errorcode.get(exc.errno, str(exc.errno))
        results.append(Probed(feature, not error, error, time.perf_counter() - started))
    return KernelReport(platform.release(), tuple(results))


# --- what the agent does with the findings (pure) -------------------------------------------


@dataclass(frozen=True, slots=True)
class Assessment:
    missing_required: tuple[Feature, ...]
    lost: tuple[str, ...]  # one log line per missing feature that is not required here


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def minimum_kernel(nodeport: bool) -> str:
    """The oldest mainline kernel with every feature the agent needs (with --interfaces
    when `nodeport`)."""
    needed = [
        f.since
        for f, _ in FEATURES
        if f.need is Need.ALWAYS or (nodeport and f.need is Need.NODEPORT)
    ]
    return max(needed, key=_version)


def assess(available: Mapping[str, bool], *, nodeport: bool, xdp: bool) -> Assessment:
    """Which missing features stop the start (for this configuration: `nodeport` is
    --interfaces naming any, `xdp` is --xdp other than off), and the line to log for each
    other missing one. A feature absent from `available` counts as missing."""
    required: list[Feature] = []
    lost: list[str] = []
    for feature in BY_KEY.values():
        if available.get(feature.key, False):
            continue
        needed = feature.need is Need.ALWAYS or (nodeport and feature.need is Need.NODEPORT)
        if needed:
            required.append(feature)
        elif feature.need is Need.NODEPORT:
            lost.append(
                f"kernel lacks {feature.name} ({feature.since}+): NodePort (--interfaces) "
                f"cannot run here; socket-LB is unaffected"
            )
        elif feature.need is Need.OPTIONAL and (feature.key != "xdp" or xdp):
            lost.append(f"kernel lacks {feature.name} ({feature.since}+): {feature.fallback}")
        else:
            lost.append(f"kernel lacks {feature.name} ({feature.since}+): not used, nothing lost")
    return Assessment(tuple(required), tuple(lost))


def setup_error(missing: Sequence[Feature], release: str, nodeport: bool) -> KernelSetupError:
    names = "; ".join(f"{f.name} (Linux {f.since}+, for {f.used_for})" for f in missing)
    return KernelSetupError(
        f"kernel {release} lacks what ebpflb needs: {names}. ebpflb needs Linux "
        f"{minimum_kernel(nodeport)} or newer{' with --interfaces' if nodeport else ''}"
    )


def check(report: KernelReport, *, nodeport: bool, xdp: bool) -> Assessment:
    """Log one line per missing feature that is not required; KernelSetupError naming
    the required ones that are missing."""
    verdict = assess(report.availability(), nodeport=nodeport, xdp=xdp)
    if verdict.missing_required:
        raise setup_error(verdict.missing_required, report.release, nodeport)
    for line in verdict.lost:
        log.warning("%s", line)
    log.info(
        "probed %d kernel features in %.1f ms: %d available",
        len(report.probed),
        report.seconds() * 1000,
        sum(p.available for p in report.probed),
    )
    return verdict


class FeatureCollector(Collector):
    """ebpflb_kernel_feature{feature}: 1 where the kernel has it, 0 where it does not."""

    def __init__(self, report: KernelReport) -> None:
        self._report = report

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "ebpflb_kernel_feature",
            "Whether the kernel has a BPF feature ebpflb uses (1) or not (0), by probing.",
            labels=["feature"],
        )
        for probed in self._report.probed:
            family.add_metric([probed.feature.key], 1.0 if probed.available else 0.0)
        yield family


def main(argv: Sequence[str]) -> int:
    """`python -m ebpflb.datapath.probes [--json]`: this kernel's features (the kernel
    matrix records the JSON per kernel)."""
    report = probe()
    if "--json" in argv:
        print(json.dumps(report.availability(), indent=2, sort_keys=True))
        return 0
    for p in report.probed:
        state = "yes" if p.available else f"no ({p.error})"
        print(f"{p.feature.key:16} {state:12} {p.seconds * 1000:6.2f} ms  {p.feature.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
