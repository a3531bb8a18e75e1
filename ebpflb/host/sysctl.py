"""The node's nf_conntrack settings kube-proxy sets, set the same way.

kube-proxy raises nf_conntrack's CLOSE_WAIT timeout (`--conntrack-tcp-timeout-close-wait`,
1 h) so that a half-closed connection the node's conntrack tracks (host traffic, a CNI's
rules) keeps its entry while the other side still sends; the upstream e2e test "KubeProxy
should set TCP CLOSE_WAIT timeout" checks it. ebpflb sets the same sysctl to the value its
own conntrack gives half-closed flows. The sysctl is per network namespace: the agent's
(the node's, with hostNetwork). Absent (nf_conntrack not loaded): nothing to set yet.
ebpflb never needs nf_conntrack itself, so on its nodes the module often loads after the
agent started (the first rule of a CNI's network policy or a firewall that uses
conntrack), and its sysctls then start at the kernel's defaults: the agent checks again at
every full resync (`ConntrackSysctls.ensure`). Not writable (a container whose /proc/sys
is read-only): a warning and a count once per failure, the agent runs on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
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


class ConntrackSysctls:
    """kube-proxy's nf_conntrack settings, kept: `ensure` at start and at every full
    resync. A failure is logged and passed to `on_error` once, until it changes."""

    def __init__(
        self,
        close_wait_s: int,
        on_error: Callable[[SysctlOutcome], None],
        proc_sys: Path = PROC_SYS,
    ) -> None:
        self.wanted = {CLOSE_WAIT: close_wait_s}
        self.on_error = on_error
        self.proc_sys = proc_sys
        self._errors: dict[str, str | None] = {}  # name -> the last error reported

    def ensure(self) -> list[SysctlOutcome]:
        outcomes = [ensure(name, value, self.proc_sys) for name, value in self.wanted.items()]
        for outcome in outcomes:
            if outcome.error is not None and outcome.error != self._errors.get(outcome.name):
                log.warning(
                    "%s not set to %d (%s): the node's conntrack keeps its own timeout for"
                    " half-closed connections",
                    outcome.key,
                    outcome.wanted,
                    outcome.error,
                )
                self.on_error(outcome)
            self._errors[outcome.name] = outcome.error
        return outcomes
