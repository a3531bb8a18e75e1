"""Network interfaces: their addresses, and ebpflb's tc filters and XDP programs on them
(pyroute2 netlink, given the fds of programs loaded with bpf(2)).

tc filters are installed with `replace` at a fixed priority and handle on the clsact
qdisc, so a restarted agent swaps its programs in atomically and never stacks a second
copy. Cleanup removes only filters whose program name carries ebpflb's prefix.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from ebpflb.errors import AttachError

log = logging.getLogger(__name__)

PROGRAM_PREFIX = "ebpflb_"
TC_PRIO = 100  # our filters' priority on clsact (lower runs first)
TC_HANDLE = 1


class TcDirection(enum.Enum):
    INGRESS = "ffff:fff2"
    EGRESS = "ffff:fff3"

    @property
    def parent(self) -> int:
        major, minor = self.value.split(":")
        return (int(major, 16) << 16) | int(minor, 16)


@dataclass(frozen=True, slots=True)
class Interface:
    name: str
    index: int
    addresses: tuple[IPv4Address, ...]


def all_links() -> list[Interface]:
    """Every interface of this network namespace (addresses not read)."""
    with IPRoute() as ipr:
        return [
            Interface(link.get_attr("IFLA_IFNAME"), link["index"], ()) for link in ipr.get_links()
        ]


def ephemeral_port_range() -> tuple[int, int]:
    """This network namespace's net.ipv4.ip_local_port_range: the ports the kernel picks
    for sockets that do not bind one."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = f.read().split()
    return int(low), int(high)


def interfaces(names: tuple[str, ...] | None = None) -> list[Interface]:
    """The named interfaces, or (names=None) every non-loopback interface with a
    global-scope IPv4 address: "the interfaces holding the node's addresses"."""
    with IPRoute() as ipr:
        links = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        addrs: dict[int, list[IPv4Address]] = {}
        for msg in ipr.get_addr(family=2):
            if msg["scope"] == 0:  # RT_SCOPE_UNIVERSE
                addrs.setdefault(msg["index"], []).append(IPv4Address(msg.get_attr("IFA_ADDRESS")))
    by_name = {name: index for index, name in links.items()}
    if names is None:
        chosen = [i for i in sorted(addrs) if links.get(i) != "lo"]
    else:
        missing = [n for n in names if n not in by_name]
        if missing:
            raise AttachError(f"no such interface: {', '.join(missing)}")
        chosen = [by_name[n] for n in names]
    return [Interface(links[i], i, tuple(addrs.get(i, ()))) for i in chosen]


def attach_tc(iface: Interface, direction: TcDirection, prog_fd: int, prog_name: str) -> None:
    with IPRoute() as ipr:
        with contextlib.suppress(NetlinkError):  # EEXIST: clsact already there
            ipr.tc("add", "clsact", iface.index)
        try:
            ipr.tc(
                "replace-filter",
                "bpf",
                iface.index,
                f":{TC_HANDLE}",
                fd=prog_fd,
                name=prog_name,
                parent=direction.value,
                classid=1,
                direct_action=True,
                prio=TC_PRIO,
            )
        except NetlinkError as exc:
            raise AttachError(
                f"attaching {prog_name} to {iface.name} {direction.name.lower()} failed: {exc}"
            ) from exc


def _filter_name(msg: Any) -> str:
    options = msg.get_attr("TCA_OPTIONS")
    if not options:
        return ""
    return str(options.get_attr("TCA_BPF_NAME") or "")


def ebpflb_filters(ifname: str) -> list[tuple[TcDirection, str]]:
    """(direction, program name) of ebpflb's tc filters on an interface."""
    found = []
    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=ifname)
        if not index:
            return []
        for direction in TcDirection:
            try:
                msgs = ipr.get_filters(index[0], parent=direction.parent)
            except NetlinkError:
                continue  # no clsact
            for msg in msgs:
                name = _filter_name(msg)
                if name.startswith(PROGRAM_PREFIX):
                    found.append((direction, name))
    return found


def detach_tc(ifname: str) -> int:
    """Remove ebpflb's filters from an interface (others' stay); the number removed."""
    removed = 0
    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=ifname)
        if not index:
            return 0
        for direction, _name in ebpflb_filters(ifname):
            with contextlib.suppress(NetlinkError):
                ipr.tc(
                    "del-filter",
                    "bpf",
                    index[0],
                    f":{TC_HANDLE}",
                    parent=direction.value,
                    prio=TC_PRIO,
                )
                removed += 1
        try:
            left = ipr.get_filters(index[0], parent=TcDirection.INGRESS.parent) + ipr.get_filters(
                index[0], parent=TcDirection.EGRESS.parent
            )
        except NetlinkError:
            left = None
        if removed and left is not None and not [m for m in left if _filter_name(m)]:
            with contextlib.suppress(NetlinkError):
                ipr.tc("del", "clsact", index[0])  # empty now: leave the link as we found it
    return removed


def xdp_program_id(ifname: str) -> int | None:
    """Id of the XDP program attached to an interface, if any."""
    with IPRoute() as ipr:
        links = ipr.get_links(ifname=ifname)
    for link in links:
        xdp = link.get_attr("IFLA_XDP")
        if xdp:
            prog_id = xdp.get_attr("IFLA_XDP_PROG_ID")
            if prog_id:
                return int(prog_id)
    return None


def attach_xdp(iface: Interface, prog_fd: int, flags: int) -> None:
    """Put an XDP program on an interface (flags: XDP_FLAGS_SKB_MODE or _DRV_MODE); one
    already there is swapped atomically."""
    with IPRoute() as ipr:
        try:
            ipr.link(
                "set",
                index=iface.index,
                xdp={"attrs": [("IFLA_XDP_FD", prog_fd), ("IFLA_XDP_FLAGS", flags)]},
            )
        except NetlinkError as exc:
            raise AttachError(f"attaching XDP to {iface.name} failed: {exc}") from exc


def detach_xdp(ifname: str, flags: int) -> None:
    """Remove the XDP program attached in mode `flags`; AttachError if none was."""
    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=ifname)
        if not index:
            return
        try:
            ipr.link(
                "set",
                index=index[0],
                xdp={"attrs": [("IFLA_XDP_FD", -1), ("IFLA_XDP_FLAGS", flags)]},
            )
        except NetlinkError as exc:
            raise AttachError(f"detaching XDP from {ifname} failed: {exc}") from exc
