"""The node's nf_conntrack settings kube-proxy sets, set the same way.

kube-proxy raises nf_conntrack's CLOSE_WAIT timeout (`--conntrack-tcp-timeout-close-wait`,
1 h) so that a half-closed connection the node's conntrack tracks (host traffic, a CNI's
rules) keeps its entry while the other side still sends; the upstream e2e test "KubeProxy
should set TCP CLOSE_WAIT timeout" checks it. ebpflb sets the same sysctl to the value its
own conntrack gives half-closed flows. The sysctl is per network namespace: the agent's
(the node's, with hostNetwork). Absent (nf_conntrack not loaded): nothing to set, as
kube-proxy. Not writable (a container whose /proc/sys is read-only): a warning and a count,
the agent runs on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PROC_SYS = Path("/proc/sys")
CLOSE_WAIT = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"


@dataclass(frozen=True, slots=True)
class SysctlOutcome:
    """What became of one sysctl: set (or already right), absent, or failed with `error`."""

    name: str
    wanted: int
    before: int | None  # None: absent
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def key(self) -> str:
        """The sysctl as `sysctl` names it (net.netfilter....)."""
        return self.name.replace("/", ".")


def ensure(name: str, wanted: int, proc_sys: Path = PROC_SYS) -> SysctlOutcome:
    """Set sysctl `name` (a path under /proc/sys) to `wanted` unless it already is."""
    path = proc_sys / name
    try:
        before = int(path.read_text().split()[0])
    except FileNotFoundError:
        return SysctlOutcome(name, wanted, None)
    except (OSError, ValueError, IndexError) as exc:
        return SysctlOutcome(name, wanted, None, f"cannot read {path}: {exc}")
    if before == wanted:
        return SysctlOutcome(name, wanted, before)
    try:
        path.write_text(f"{wanted}\n")
    except OSError as exc:
        return SysctlOutcome(name, wanted, before, f"cannot write {path}: {exc.strerror}")
    outcome = SysctlOutcome(name, wanted, before)
    log.info("set %s to %d (was %d), as kube-proxy", outcome.key, wanted, before)
    return outcome


def ensure_conntrack(close_wait_s: int, proc_sys: Path = PROC_SYS) -> list[SysctlOutcome]:
    """kube-proxy's nf_conntrack settings; failures logged (the caller counts them)."""
    outcomes = [ensure(CLOSE_WAIT, close_wait_s, proc_sys)]
    for outcome in outcomes:
        if not outcome.ok:
            log.warning(
                "%s not set to %d (%s): the node's conntrack keeps its own timeout for"
                " half-closed connections",
                outcome.key,
                outcome.wanted,
                outcome.error,
            )
    return outcomes
