"""Destroying connected UDP sockets that socket-LB sent to a backend that has left.

connect() on a UDP socket is translated once: the socket then sends to the backend itself,
and no hook sees its later datagrams. When that backend leaves the service, such a socket
(a resolver's, talking to a DNS pod that went away) would send into the void for as long
as the application keeps it. As Cilium does, the agent aborts those sockets: it takes the
cookies of the sockets translated to the backend through the frontend from the reverse map
(ebpflb_revsk4, ebpflb_revsk6), finds them with sock_diag (IPv4 and IPv6 sockets: a
dual-stack socket connected to an IPv4-mapped ClusterIP is an IPv6 one) in every network
namespace it can find, and sends SOCK_DESTROY for each; the application's next call fails
with ECONNABORTED and a resolver opens a new socket, which connect() translates to a live
backend.

The namespaces: those of the processes /proc shows, and the bind mounts under
/var/run/netns and /run/netns, where containerd and CRI-O (and `ip netns`) keep pods'
namespaces. In a pod without hostPID, /proc shows the agent's own processes only: the
DaemonSet mounts the host's /var/run/netns, so pods' sockets are found all the same.

Needs CONFIG_INET_DIAG_DESTROY (SOCK_DESTROY answers EOPNOTSUPP without it; then nothing is
destroyed and the sockets recover only when the application reopens them) and
CAP_SYS_ADMIN (setns). Kernels 6.5+ could do the same from a BPF socket iterator with
bpf_sock_destroy(); this path works from 4.5 on, wherever the option is built in.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import struct
import threading
from collections.abc import Iterator, Mapping, Set
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path

log = logging.getLogger(__name__)

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
SOCK_DESTROY = 21
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
CLONE_NEWNET = 0x40000000
TCP_ESTABLISHED = 1  # a connected UDP socket's state

_NLMSG = struct.Struct("=IHHII")  # struct nlmsghdr
_REQ = struct.Struct("=BBBxI")  # struct inet_diag_req_v2, up to its id
# struct inet_diag_sockid: ports and addresses in network order, interface and cookie not.
_SOCKID = struct.Struct("!HH16s16s")
_SOCKID_TAIL = struct.Struct("=III")
_MSG_HEAD = struct.Struct("=BBBB")  # struct inet_diag_msg, up to its id
SOCKID_SIZE = _SOCKID.size + _SOCKID_TAIL.size


def _libc_setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


NETNS_MOUNTS = (Path("/var/run/netns"), Path("/run/netns"))
# What /status says of this module: how a stale connected UDP socket is destroyed.
METHOD = "sock_diag SOCK_DESTROY, in the agent's network namespace, those of visible" + (
    " processes and those mounted under " + " and ".join(str(p) for p in NETNS_MOUNTS)
)


def network_namespaces(
    proc: Path = Path("/proc"), mounts: tuple[Path, ...] = NETNS_MOUNTS
) -> dict[tuple[int, int], Path]:
    """One path per network namespace: a /proc/PID/ns/net of a process in it, or a bind
    mount of it in one of the `mounts` directories (a namespace no visible process is in)."""
    pids = sorted((e for e in proc.iterdir() if e.name.isdigit()), key=lambda e: int(e.name))
    candidates = [entry / "ns" / "net" for entry in pids]
    for directory in mounts:
        try:
            candidates += sorted(directory.iterdir())
        except OSError:
            continue  # not on this node, or not mounted into the pod
    found: dict[tuple[int, int], Path] = {}
    for path in candidates:
        try:
            st = path.stat()
        except OSError:
            continue  # gone, or not ours to see
        found.setdefault((st.st_dev, st.st_ino), path)
    return found


def _request(msg_type: int, flags: int, sockid: bytes, seq: int, family: int) -> bytes:
    body = _REQ.pack(family, socket.IPPROTO_UDP, 0, 1 << TCP_ESTABLISHED) + sockid
    return _NLMSG.pack(_NLMSG.size + len(body), msg_type, flags, seq, 0) + body


def _messages(sock: socket.socket) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of the replies to one request, until DONE or an error/ACK."""
    while True:
        data = sock.recv(65536)
        offset = 0
        while offset + _NLMSG.size <= len(data):
            length, msg_type, _flags, _seq, _pid = _NLMSG.unpack_from(data, offset)
            if length < _NLMSG.size:
                return
            yield msg_type, data[offset + _NLMSG.size : offset + length]
            if msg_type in (NLMSG_DONE, NLMSG_ERROR):
                return
            offset += (length + 3) & ~3


def _destroy_in_netns(ns_path: Path, cookies: Set[int], result: list[int]) -> None:
    """In a thread of its own (setns changes the calling thread only): dump the connected
    UDP sockets of one namespace and destroy those whose cookie is in `cookies`."""
    destroyed = 0
    try:
        fd = os.open(ns_path, os.O_RDONLY)
        try:
            _libc_setns(fd)
        finally:
            os.close(fd)
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as sock:
            zero_id = _SOCKID.pack(0, 0, b"", b"") + _SOCKID_TAIL.pack(0, 0xFFFFFFFF, 0xFFFFFFFF)
            targets = []
            for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
                flags = NLM_F_REQUEST | NLM_F_DUMP
                sock.send(_request(SOCK_DIAG_BY_FAMILY, flags, zero_id, seq, family))
                for msg_type, payload in _messages(sock):
                    if msg_type != SOCK_DIAG_BY_FAMILY or len(payload) < 4 + SOCKID_SIZE:
                        continue
                    sockid = payload[4 : 4 + SOCKID_SIZE]
                    _if, low, high = _SOCKID_TAIL.unpack_from(sockid, _SOCKID.size)
                    if low | (high << 32) in cookies:
                        targets.append((family, sockid))
            for seq, (family, sockid) in enumerate(targets, start=3):
                sock.send(_request(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, sockid, seq, family))
                for msg_type, payload in _messages(sock):
                    if msg_type == NLMSG_ERROR:
                        (code,) = struct.unpack_from("=i", payload)
                        if code == 0:
                            destroyed += 1
                        elif -code != errno.ENOENT:  # closed meanwhile: fine
                            log.warning(
                                "cannot destroy a stale UDP socket in %s: %s",
                                ns_path,
                                os.strerror(-code),
                            )
    except OSError as exc:
        log.debug("network namespace %s: %s", ns_path, exc)
    result.append(destroyed)


def destroy_udp_sockets(cookies: Set[int]) -> int:
    """Destroy the connected UDP sockets with these cookies, in whatever network namespace
    they are; how many were destroyed."""
    if not cookies:
        return 0
    counts: list[int] = []
    for ns_path in network_namespaces().values():
        worker = threading.Thread(target=_destroy_in_netns, args=(ns_path, cookies, counts))
        worker.start()
        worker.join()
    return sum(counts)


Entry = tuple[int, IPv4Address | IPv6Address, int, IPv4Address | IPv6Address, int]
Left = Mapping[tuple[IPv4Address | IPv6Address, int], Set[tuple[IPv4Address | IPv6Address, int]]]


def stale_cookies(entries: Iterator[Entry], left: Left) -> set[int]:
    """Cookies of sockets sent to a backend that left the frontend they asked for, from
    reverse-map entries (cookie, backend address, port, frontend address, port)."""
    return {
        cookie
        for cookie, b_addr, b_port, f_addr, f_port in entries
        if (b_addr, b_port) in left.get((f_addr, f_port), ())
    }
