"""Sockets and HTTP from this process into a network namespace (an agent started with
nsenter listens on its namespace's loopback).

A socket belongs to the network namespace it was created in, whichever thread uses it
afterwards; setns(2) is per thread (Python 3.11 has no os.setns). `socket_in_netns` makes
the socket in a short-lived thread, so the caller's thread never changes namespace;
`thread_in_netns` moves the calling thread for a block, for servers whose threads must
start inside (they inherit the namespace).
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

CLONE_NEWNET = 0x40000000


@contextlib.contextmanager
def thread_in_netns(netns: str) -> Iterator[None]:
    """Run the calling thread in `netns` for the block, then back in its own. Sockets
    created inside stay in that namespace afterwards, and threads started inside inherit
    it (that is how a fake API server listens on a node's loopback)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/thread-self/ns/net") as home, open(f"/run/netns/{netns}") as target:
        _setns(libc, target.fileno(), netns)
        try:
            yield
        finally:
            _setns(libc, home.fileno(), "this thread's namespace")


def _setns(libc: ctypes.CDLL, fd: int, what: str) -> None:
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns into {what}: {os.strerror(errno)}")


def socket_in_netns(netns: str | None, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """An IPv4 socket in network namespace `netns` (None: this process's)."""
    if netns is None:
        return socket.socket(socket.AF_INET, kind)
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def create() -> None:
        try:
            with thread_in_netns(netns):
                made.append(socket.socket(socket.AF_INET, kind))
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=create, name=f"netns-{netns}")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


def free_ports(count: int, netns: str | None = None, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports free on `host` in `netns` right now (held together while
    the system picks them, so they differ)."""
    sockets = [socket_in_netns(netns) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class _Connection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, netns: str | None, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._netns = netns

    def connect(self) -> None:
        sock = socket_in_netns(self._netns)
        try:
            sock.settimeout(self.timeout)
            sock.connect((self.host, self.port))
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def http_get(
    host: str, port: int, path: str, *, netns: str | None = None, timeout: float = 5.0
) -> tuple[int, dict[str, str], bytes]:
    """GET http://host:port/path from inside `netns`: (status, headers, body). Raises
    OSError when nothing listens."""
    connection = _Connection(host, port, netns, timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        headers: dict[str, Any] = dict(response.getheaders())
        return response.status, headers, response.read()
    finally:
        connection.close()
