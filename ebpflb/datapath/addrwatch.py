"""Follows the node's addresses, IPv4 and global IPv6, and its interfaces' MTUs as they
change (netlink), so that NodePorts answer on the addresses the node has now, not on those
it had at start, each interface's SNAT source of each family is one it still holds, and the
programs know each next hop's MTU.

IPv6 addresses count once usable: global scope (not link-local fe80::/10, which a NodePort
cannot be reached on from another link, nor ::1), and neither tentative (duplicate address
detection still running: the kernel does not accept packets to it yet) nor dadfailed. The
kernel announces the end of DAD with a new RTM_NEWADDR, so the address comes in then.

Netlink events (RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR, RTMGRP_LINK for MTUs, and the
ROUTE groups of both families for the default routes that --nodeport-addresses=primary
and the primary SNAT source depend on) only wake the watcher up:
on each wake-up it dumps the whole address and default-route state again and reports it
if it differs from the last report. Level-triggered, so a lost event (the socket's buffer
overrun, ENOBUFS) or a burst of them costs nothing but one more dump, and a periodic dump
every `resync_interval` catches anything the events missed. The dump is a few messages
on a node with a handful of interfaces.

NodePorts answer on the addresses of the interfaces the agent attached its programs to
(`watched`): an address on another interface gets no tc program to answer there anyway.
SNAT sources and MTUs are every interface's: a translated packet leaves by whichever
interface its route takes (an overlay's tunnel device, say), and kube-proxy's MASQUERADE
takes that interface's address.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.rtnl import (
    RTMGRP_IPV4_IFADDR,
    RTMGRP_IPV4_ROUTE,
    RTMGRP_IPV6_IFADDR,
    RTMGRP_IPV6_ROUTE,
    RTMGRP_LINK,
)

from ebpflb.datapath.contract import MAX_IFACES
from ebpflb.datapath.maps import PRIMARY_IFINDEX, InterfaceAddresses
from ebpflb.model import IPAddress

log = logging.getLogger(__name__)

RT_SCOPE_UNIVERSE = 0
RT_TABLE_MAIN = 254
RTN_UNICAST = 1  # a default route of another type (unreachable, blackhole) has no interface
AF_INET, AF_INET6 = 2, 10
# ifa_flags (linux/if_addr.h) of an IPv6 address not usable yet, or never.
IFA_F_DADFAILED, IFA_F_TENTATIVE = 0x08, 0x40


@dataclass(frozen=True, slots=True)
class AddressState:
    """The node's usable addresses by ifindex, IPv4 ones (global scope) then IPv6 ones
    (global, neither tentative nor dadfailed), each family in the kernel's order (an
    interface's primary address first), and the interfaces of the default routes."""

    addresses: Mapping[int, tuple[IPAddress, ...]] = field(default_factory=dict)
    default_ifindex: int | None = None  # of the IPv4 default route
    default6_ifindex: int | None = None  # of the IPv6 default route
    mtus: Mapping[int, int] = field(default_factory=dict)  # every interface's, by ifindex

    def node_addresses(self, watched: Mapping[int, str]) -> tuple[IPAddress, ...]:
        """The addresses of the watched interfaces, each once, in ifindex order."""
        seen: dict[IPAddress, None] = {}
        for index in sorted(watched):
            for address in self.addresses.get(index, ()):
                seen.setdefault(address)
        return tuple(seen)

    def primary_addresses(self) -> tuple[IPAddress, ...]:
        """kube-proxy's "primary" node IPs: the IPv4 addresses of the IPv4 default route's
        interface, then the IPv6 ones of the IPv6 default route's; none of a family without
        its default route."""
        primary: list[IPAddress] = []
        for family, index in ((4, self.default_ifindex), (6, self.default6_ifindex)):
            if index is not None:
                primary += [a for a in self.addresses.get(index, ()) if a.version == family]
        return tuple(primary)


def snat_sources(
    previous: InterfaceAddresses, state: AddressState
) -> tuple[InterfaceAddresses, int]:
    """ifindex -> the address of each family masqueraded NodePort flows leaving that
    interface use (ebpflb_ifaddr4, ebpflb_ifaddr6), for every interface with one, and
    PRIMARY_IFINDEX -> the node's primary address of each family (the default route's
    interface's, else the lowest ifindex's), for flows leaving by an interface without
    one; and how many interfaces did not fit the maps (EBPFLB_MAX_IFACES entries, the
    primary one included: the lowest ifindexes are kept). An interface keeps its source
    while it still holds it (a new secondary address changes nothing); else it takes its
    first address of the family now."""
    v4: dict[int, IPv4Address] = {}
    v6: dict[int, IPv6Address] = {}
    for index, held in sorted(state.addresses.items()):
        held4 = [a for a in held if isinstance(a, IPv4Address)]
        held6 = [a for a in held if isinstance(a, IPv6Address)]
        before4, before6 = previous.v4.get(index), previous.v6.get(index)
        if held4:
            v4[index] = before4 if before4 in held4 else held4[0]
        if held6:
            v6[index] = before6 if before6 in held6 else held6[0]
    left_out = 0
    tables: tuple[tuple[dict[int, Any], int | None], ...] = (
        (v4, state.default_ifindex),
        (v6, state.default6_ifindex),
    )
    for table, default in tables:
        if not table:
            continue
        primary = table.get(default) if default is not None else None
        table[PRIMARY_IFINDEX] = primary if primary is not None else table[min(table)]
        for index in sorted(table)[MAX_IFACES:]:
            del table[index]
            left_out += 1
    return InterfaceAddresses(v4, v6), left_out


def interface_mtus(state: AddressState) -> dict[int, int]:
    """ifindex -> MTU of every interface (ebpflb_ifmtu), the lowest ifindexes first when
    there are more than the map holds (the others: their next hop's MTU is then what the
    kernel's route lookup says, or unknown)."""
    return dict(sorted(state.mtus.items())[:MAX_IFACES])


def _usable6(address: IPv6Address, scope: int, flags: int) -> bool:
    """An IPv6 address a NodePort answers on and SNAT may use."""
    return (
        scope == RT_SCOPE_UNIVERSE
        and not address.is_link_local
        and not flags & (IFA_F_TENTATIVE | IFA_F_DADFAILED)
    )


def read_state(ipr: IPRoute | None = None) -> AddressState:
    """This network namespace's addresses and default route, from one netlink dump."""
    if ipr is None:
        with IPRoute() as own:
            return read_state(own)
    addresses: dict[int, list[IPAddress]] = {}
    for msg in ipr.get_addr(family=AF_INET):
        if msg["scope"] == RT_SCOPE_UNIVERSE:
            addresses.setdefault(msg["index"], []).append(IPv4Address(msg.get_attr("IFA_ADDRESS")))
    for msg in ipr.get_addr(family=AF_INET6):
        address = IPv6Address(msg.get_attr("IFA_ADDRESS"))
        # IFA_FLAGS holds all 32 bits; ifa_flags only the lower 8 (kernels before 3.14).
        flags = msg.get_attr("IFA_FLAGS")
        if _usable6(address, msg["scope"], msg["flags"] if flags is None else int(flags)):
            addresses.setdefault(msg["index"], []).append(address)
    return AddressState(
        {i: tuple(a) for i, a in addresses.items()},
        _default_ifindex(ipr, AF_INET),
        _default_ifindex(ipr, AF_INET6),
        {int(link["index"]): int(link.get_attr("IFLA_MTU")) for link in ipr.get_links()},
    )


def route_egress(address: IPAddress) -> int | None:
    """The interface this namespace's route to `address` leaves by (`ip route get`), or
    None without a route."""
    try:
        with IPRoute() as ipr:
            routes = ipr.route("get", dst=str(address))
    except OSError:  # no route (ENETUNREACH), or not for this family
        return None
    for route in routes:
        oif = route.get_attr("RTA_OIF")
        if oif is not None:
            return int(oif)
    return None


def _default_ifindex(ipr: IPRoute, family: int) -> int | None:
    """The interface of the family's default route in the main table, if any."""
    for route in ipr.get_routes(family=family, table=RT_TABLE_MAIN):
        oif = route.get_attr("RTA_OIF")
        if route["dst_len"] == 0 and route["type"] == RTN_UNICAST and oif is not None:
            return int(oif)
    return None


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
        groups = (
            RTMGRP_IPV4_IFADDR
            | RTMGRP_IPV4_ROUTE
            | RTMGRP_IPV6_IFADDR
            | RTMGRP_IPV6_ROUTE
            | RTMGRP_LINK
        )
        self._events.bind((0, groups))
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
