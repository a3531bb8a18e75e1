"""The Linux capabilities the agent needs, checked when it starts.

deploy/base/daemonset.yaml gives the container these capabilities and no others (no
`privileged`). Found by running the image with `--cap-drop=all` plus subsets (Linux 6.18):

- CAP_SYS_ADMIN: BCC opens the pinned maps (BPF_TABLE_PINNED) by map id, and a restarted
  agent finds the previous agent's programs by id to detach them; the kernel allows
  BPF_MAP_GET_FD_BY_ID and BPF_PROG_GET_FD_BY_ID only with CAP_SYS_ADMIN. The kernel also
  accepts it wherever CAP_BPF or CAP_PERFMON would do (program and map creation, the
  verifier's pointer checks), so those two add nothing next to it (and before 5.8 they do
  not exist).
- CAP_NET_ADMIN: tc and XDP programs on the node's interfaces (netlink); not needed with
  `--interfaces=` (socket-LB only).
- CAP_SYS_RESOURCE: before Linux 5.11 BPF maps are charged to RLIMIT_MEMLOCK (from 5.11 to
  the memory cgroup), and BCC raises that limit, which needs this capability unless the
  limit is already unlimited.

A missing one stops the agent before it compiles anything, with a message naming it; an
EPERM later on (a kernel with stricter rules) gets a message naming what is missing too.
"""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ebpflb.errors import KernelSetupError

# Bit numbers from include/uapi/linux/capability.h.
CAPABILITY_BITS = {
    "CAP_NET_ADMIN": 12,
    "CAP_NET_RAW": 13,
    "CAP_SYS_ADMIN": 21,
    "CAP_SYS_RESOURCE": 24,
    "CAP_PERFMON": 38,
    "CAP_BPF": 39,
}
MEMCG_ACCOUNTING_SINCE = (5, 11)  # BPF memory charged to the cgroup, not RLIMIT_MEMLOCK
DEPLOY_HINT = "add it to the container's securityContext.capabilities (deploy/base/daemonset.yaml)"


@dataclass(frozen=True, slots=True)
class Need:
    capability: str  # e.g. "CAP_NET_ADMIN"
    why: str

    @property
    def bit(self) -> int:
        return CAPABILITY_BITS[self.capability]


SYS_ADMIN = Need(
    "CAP_SYS_ADMIN",
    "BCC opens pinned maps by id and a restart detaches the previous agent's programs by id"
    " (BPF_MAP/PROG_GET_FD_BY_ID)",
)
NET_ADMIN = Need("CAP_NET_ADMIN", "tc and XDP programs on the node's interfaces")
SYS_RESOURCE = Need(
    "CAP_SYS_RESOURCE",
    "this kernel charges BPF maps to RLIMIT_MEMLOCK (before 5.11), which must be raised",
)


def effective(status: str | None = None) -> frozenset[int]:
    """Capability bits in effect for this process (CapEff of /proc/self/status)."""
    text = status if status is not None else Path("/proc/self/status").read_text()
    for line in text.splitlines():
        if line.startswith("CapEff:"):
            mask = int(line.split()[1], 16)
            return frozenset(bit for bit in range(64) if mask >> bit & 1)
    raise KernelSetupError("no CapEff line in /proc/self/status")


def kernel_version(release: str | None = None) -> tuple[int, int]:
    """(major, minor) of a release string such as "5.10.0-46-amd64"."""
    text = release if release is not None else os.uname().release
    parts = text.split("-")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError) as exc:
        raise KernelSetupError(f"cannot read the kernel version from {text!r}") from exc


def memlock_unlimited() -> bool:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return soft == hard == resource.RLIM_INFINITY


def needed_by_run(
    *,
    nodeport: bool,
    kernel: tuple[int, int] | None = None,
    memlock_is_unlimited: bool | None = None,
) -> list[Need]:
    """What `ebpflb run` needs on this kernel; `nodeport`: tc/XDP programs on interfaces."""
    needs = [SYS_ADMIN]
    if nodeport:
        needs.append(NET_ADMIN)
    if (kernel or kernel_version()) < MEMCG_ACCOUNTING_SINCE and not (
        memlock_unlimited() if memlock_is_unlimited is None else memlock_is_unlimited
    ):
        needs.append(SYS_RESOURCE)
    return needs


def missing(needs: Iterable[Need], have: frozenset[int] | None = None) -> list[Need]:
    have = effective() if have is None else have
    return [need for need in needs if need.bit not in have]


def check(needs: Sequence[Need], have: frozenset[int] | None = None) -> None:
    """Raise KernelSetupError naming every needed capability this process lacks."""
    lacking = missing(needs, have)
    if lacking:
        which = "capability" if len(lacking) == 1 else "capabilities"
        reasons = ", ".join(f"{n.capability} ({n.why})" for n in lacking)
        raise KernelSetupError(f"missing {which} {reasons}; {DEPLOY_HINT}")


def is_permission_error(exc: BaseException) -> bool:
    """Whether an error, or any error it was raised from, is an EPERM/EACCES refusal."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.EPERM, errno.EACCES):
            return True
        if isinstance(current.args, tuple) and current.args[:1] == (errno.EPERM,):
            return True  # pyroute2's NetlinkError(1, "Operation not permitted")
        if "Operation not permitted" in str(current):  # BCC's messages carry strerror only
            return True
        current = current.__cause__ or current.__context__
    return False


def permission_hint(exc: BaseException, have: frozenset[int] | None = None) -> str | None:
    """For a refusal by the kernel: which of the capabilities ebpflb uses this process
    lacks (or that it has them all, so something else refused); None for other errors."""
    if not is_permission_error(exc):
        return None
    lacking = missing([SYS_ADMIN, NET_ADMIN, SYS_RESOURCE], have)
    if kernel_version() >= MEMCG_ACCOUNTING_SINCE:
        lacking = [n for n in lacking if n is not SYS_RESOURCE]
    if not lacking:
        return (
            "the kernel refused an operation although this process has the capabilities"
            " ebpflb uses (a seccomp or LSM policy, or a read-only mount?)"
        )
    names = ", ".join(n.capability for n in lacking)
    return f"the kernel refused an operation: this process lacks {names}; {DEPLOY_HINT}"
