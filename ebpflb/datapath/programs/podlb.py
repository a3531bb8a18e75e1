"""The per-packet ClusterIP path: bpf/nodeport.c built for pods' interfaces
(EBPFLB_POD_PATH=1: ebpflb_pod_in, ebpflb_pod_out), on the host side of every interface
whose name matches --pod-interfaces, followed as pods come and go.

Socket-LB translates a ClusterIP at connect(), before anything in the pod sees it. What no
socket hook sees leaves the pod with the ClusterIP as its destination: a sidecar's
redirected connection (--socket-lb=hostns-only), a VM's or a routing pod's packets, a
process outside the attached cgroup. On its pod's interface, tc ingress (what the pod
sends) DNATs such a packet to the Service's backend, remembered in conntrack, and SNATs
only a pod reaching itself through its Service (hairpin, as kube-proxy masquerades it);
tc egress (what reaches the pod) gives the replies the frontend back as their source. A
connection socket-LB translated never carries a ClusterIP, so nothing is translated twice.

Interfaces are followed by a netlink watcher, level-triggered like addrwatch.py: each link
event wakes it, and it lists the links and attaches to the matching ones not attached yet
(a periodic list catches a lost event). A new pod's first packets, sent before its
interface is attached (milliseconds after the link appears), leave untranslated.
"""

from __future__ import annotations

import fnmatch
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from pyroute2.netlink.rtnl import RTMGRP_LINK

from ebpflb.config import Config
from ebpflb.datapath import contract
from ebpflb.datapath.programs import netdev
from ebpflb.datapath.programs.loader import BPF_DIR, Features, probe_features
from ebpflb.datapath.programs.programset import Function, Origin, ProgramSet
from ebpflb.datapath.syscall import uapi
from ebpflb.errors import AttachError

log = logging.getLogger(__name__)

INGRESS = "ebpflb_pod_in"
EGRESS = "ebpflb_pod_out"


def matching(links: Iterable[netdev.Interface], patterns: Sequence[str]) -> list[netdev.Interface]:
    """The links whose name matches one of `patterns` (fnmatch; never the loopback)."""
    return [
        link
        for link in links
        if link.name != "lo" and any(fnmatch.fnmatchcase(link.name, p) for p in patterns)
    ]


class PodLB:
    """The pod-interface programs; attachments outlive the agent, as NodePort's do."""

    def __init__(self, config: Config, features: Features | None = None) -> None:
        self.patterns = config.pod_interfaces
        features = features or probe_features()
        started = time.monotonic()
        self.programs = ProgramSet(
            BPF_DIR / "nodeport.c",
            [*contract.cflags(config), *features.cflags(), f"-D{contract.POD_PATH}=1"],
            [
                Function(INGRESS, uapi.BPF_PROG_TYPE_SCHED_CLS),
                Function(EGRESS, uapi.BPF_PROG_TYPE_SCHED_CLS),
            ],
            config.bpffs_dir,
        )
        self.load_seconds = time.monotonic() - started
        self._lock = threading.Lock()
        self._attached: dict[int, str] = {}  # ifindex -> name

    @property
    def origin(self) -> Origin:
        return self.programs.origin

    @property
    def headers(self) -> str:
        return self.programs.headers

    def program_ids(self) -> dict[str, int]:
        return self.programs.ids()

    @property
    def attached(self) -> list[str]:
        with self._lock:
            return sorted(self._attached.values())

    def follow(self, links: Sequence[netdev.Interface]) -> tuple[list[str], list[str]]:
        """Attach to the matching links not attached yet and forget the ones gone; (names
        attached now, "name: error" of those that failed, tried again next time)."""
        wanted = matching(links, self.patterns)
        added: list[str] = []
        failed: list[str] = []
        with self._lock:
            present = {link.index for link in links}
            for index in [i for i in self._attached if i not in present]:
                del self._attached[index]  # the link went, and its filters with it
            for link in wanted:
                if self._attached.get(link.index) == link.name:
                    continue
                try:
                    for direction, name in (
                        (netdev.TcDirection.INGRESS, INGRESS),
                        (netdev.TcDirection.EGRESS, EGRESS),
                    ):
                        netdev.attach_tc(link, direction, self.programs.fds[name], name)
                except AttachError as exc:  # the link went meanwhile, or refuses clsact
                    failed.append(f"{link.name}: {exc}")
                    continue
                self._attached[link.index] = link.name
                added.append(link.name)
        if added:
            self.programs.commit_pins()
        return added, failed

    def close(self) -> None:
        """Drop this process's handles; the tc filters keep the programs."""
        self.programs.close()


class LinkWatcher:
    """Calls `on_links(links)` from its own thread at start, at every link event and every
    `resync_interval`; a failing call is logged and made again at the next wake-up."""

    def __init__(
        self,
        on_links: Callable[[list[netdev.Interface]], None],
        *,
        resync_interval: float = 30.0,
        tick: float = 1.0,
    ) -> None:
        self._on_links = on_links
        self._resync_interval = resync_interval
        self._tick = tick
        self._stop = threading.Event()
        # Only drained, never parsed: any link event means "list again".
        self._events = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self._events.setblocking(False)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._events.bind((0, RTMGRP_LINK))  # before the first listing: nothing is missed
        self._thread = threading.Thread(target=self._loop, name="linkwatch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self._tick)
        self._events.close()

    def _loop(self) -> None:
        waited = self._resync_interval
        while not self._stop.is_set():
            if waited >= self._resync_interval or self._drain():
                waited = 0.0
                try:
                    self._on_links(netdev.all_links())
                except Exception:  # a bad moment (a link half gone); the next wake-up retries
                    log.exception("following pod interfaces failed; trying again")
            ready, _, _ = select.select([self._events], [], [], self._tick)
            if not ready:
                waited += self._tick

    def _drain(self) -> bool:
        """Empty the events' socket; whether anything was in it."""
        got = False
        while True:
            try:
                if not self._events.recv(65536):
                    return got
                got = True
            except BlockingIOError:
                return got
            except OSError:  # ENOBUFS: events were lost; a listing covers them
                got = True


def follow(
    lb: PodLB, report: Callable[[Sequence[str], Sequence[str], Sequence[str]], None]
) -> LinkWatcher:
    """Attach `lb` to the pod interfaces there now (before the first sync: no pod waits for
    the watcher's thread), then follow them; `report(patterns, attached, failed)` after
    each look (the agent's /status)."""

    def on_links(links: list[netdev.Interface]) -> None:
        added, failed = lb.follow(links)
        if added:
            log.info("per-packet ClusterIP path attached to %s", ", ".join(added))
        for failure in failed:
            log.warning("per-packet ClusterIP path not attached to %s", failure)
        report(lb.patterns, lb.attached, failed)

    on_links(netdev.all_links())
    watcher = LinkWatcher(on_links)
    watcher.start()
    return watcher
