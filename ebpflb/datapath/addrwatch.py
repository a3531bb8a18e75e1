"""Follows the node's IPv4 addresses as they are added and removed (netlink), so that
NodePorts answer on the addresses the node has now, not on those it had at start.

Netlink events (RTMGRP_IPV4_IFADDR, and RTMGRP_IPV4_ROUTE for the default route that
--nodeport-addresses=primary depends on) only wake the watcher up: on each wake-up it
dumps the whole address and default-route state again and reports it if it differs from
the last report. Level-triggered, so a lost event (the socket's buffer overrun, ENOBUFS)
or a burst of them costs nothing but one more dump, and a periodic dump every
`resync_interval` catches anything the events missed. The dump is a few messages on a
node with a handful of interfaces.

Only the interfaces the agent attached its programs to are followed (`watched`): an
address on another interface gets no tc program to answer there anyway.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address

from pyroute2 import IPRoute
from pyroute2.netlink.rtnl import RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE

log = logging.getLogger(__name__)

RT_SCOPE_UNIVERSE = 0
RT_TABLE_MAIN = 254
AF_INET = 2


@dataclass(frozen=True, slots=True)
class AddressState:
    """The node's global-scope IPv4 addresses by ifindex (the kernel's order: an
    interface's primary address first) and the interface of the IPv4 default route."""

    addresses: Mapping[int, tuple[IPv4Address, ...]] = field(default_factory=dict)
    default_ifindex: int | None = None

    def node_addresses(self, watched: Mapping[int, str]) -> tuple[IPv4Address, ...]:
        """The addresses of the watched interfaces, each once, in ifindex order."""
        seen: dict[IPv4Address, None] = {}
        for index in sorted(watched):
            for address in self.addresses.get(index, ()):
                seen.setdefault(address)
        return tuple(seen)

    def primary_addresses(self) -> tuple[IPv4Address, ...]:
        """kube-proxy's "primary" node IPs (IPv4): those of the default route's interface;
        none without a default route."""
        if self.default_ifindex is None:
            return ()
        return self.addresses.get(self.default_ifindex, ())


def snat_sources(
    previous: Mapping[int, IPv4Address], state: AddressState, watched: Mapping[int, str]
) -> dict[int, IPv4Address]:
    """ifindex -> the address masqueraded NodePort flows leaving that interface use
    (ebpflb_ifaddr4). An interface keeps its source while it still holds it (a new
    secondary address changes nothing); else it takes its first address now; an interface
    with none has no entry, and the programs count snat_no_addr for flows needing one."""
    sources = {}
    for index in watched:
        held = state.addresses.get(index, ())
        if not held:
            continue
        before = previous.get(index)
        sources[index] = before if before in held else held[0]
    return sources


def read_state(ipr: IPRoute | None = None) -> AddressState:
    """This network namespace's addresses and default route, from one netlink dump."""
    if ipr is None:
        with IPRoute() as own:
            return read_state(own)
    addresses: dict[int, list[IPv4Address]] = {}
    for msg in ipr.get_addr(family=AF_INET):
        if msg["scope"] == RT_SCOPE_UNIVERSE:
            addresses.setdefault(msg["index"], []).append(IPv4Address(msg.get_attr("IFA_ADDRESS")))
    default = None
    for route in ipr.get_routes(family=AF_INET, table=RT_TABLE_MAIN):
        if route["dst_len"] == 0 and route.get_attr("RTA_OIF") is not None:
            default = int(route.get_attr("RTA_OIF"))
            break
    return AddressState({i: tuple(a) for i, a in addresses.items()}, default)


class AddressWatcher:
    """Calls `on_change(state)` from its own thread whenever the address state differs
    from the last one reported (the first: `initial`). A failing `on_change` is logged
    and tried again at the next wake-up; the thread never dies of it."""

    def __init__(
        self,
        initial: AddressState,
        on_change: Callable[[AddressState], None],
        *,
        resync_interval: float = 30.0,
        tick: float = 1.0,
    ) -> None:
        self._last = initial
        self._on_change = on_change
        self._resync_interval = resync_interval
        self._tick = tick  # how often the thread looks at its stop flag
        self._stop = threading.Event()
        # The events' socket is a plain one: its messages are only drained, never parsed
        # (and pyroute2's IPRoute is bound to the thread that made it).
        self._events = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self._events.setblocking(False)
        self._thread: threading.Thread | None = None
        self.reports = 0  # changes reported (for tests)

    def start(self) -> None:
        # Bound before the first check, so a change between start and the loop is seen.
        self._events.bind((0, RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE))
        self._thread = threading.Thread(target=self._loop, name="addrwatch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self._tick)
        self._events.close()

    def _loop(self) -> None:
        with IPRoute() as dumps:  # a dump must not interleave with the events' socket
            waited = self._resync_interval  # check at once: the state may have moved
            while not self._stop.is_set():
                if waited >= self._resync_interval or self._drain():
                    waited = 0.0
                    self._check(dumps)
                else:
                    waited += self._tick

    def _drain(self) -> bool:
        """Wait up to one tick for events; whether any came (their content is not used)."""
        readable, _, _ = select.select([self._events], [], [], self._tick)
        if not readable:
            return False
        while True:
            try:
                self._events.recv(65536)
            except BlockingIOError:
                return True
            except OSError:  # an overrun (ENOBUFS) is only a reason to dump again
                log.debug("netlink address events: read failed", exc_info=True)
                return True

    def _check(self, dumps: IPRoute) -> None:
        try:
            state = read_state(dumps)
            if state == self._last:
                return
            self._on_change(state)
        except Exception:
            log.exception("following the node's addresses failed; retrying at the next change")
            return
        self._last = state
        self.reports += 1
