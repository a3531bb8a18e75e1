"""Tiny servers and clients for the demo and the kernel tests, run inside namespaces.

    python -m ebpflb.testing.echo serve --name pod1 --tcp 8080 --udp 5353 --lifetime 60
    python -m ebpflb.testing.echo tcp 10.96.0.10:80 --count 100
    python -m ebpflb.testing.echo udp 10.96.0.53:53 --count 30 [--connected]

A server answers every TCP connection and UDP datagram with "<name> <client ip:port>", so
a client learns which backend served it and the backend shows what source it saw. A
client prints one JSON object per line per request. Both are bounded: servers exit after
--lifetime seconds, clients use per-request timeouts.
"""

from __future__ import annotations

import argparse
import errno
import json
import socket
import sys
import threading
import time
from typing import Any


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def serve(name: str, tcp_ports: list[int], udp_ports: list[int], lifetime: float) -> None:
    deadline = time.monotonic() + lifetime
    sockets = []
    for port in tcp_ports:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen(512)
        sockets.append(s)
        threading.Thread(target=_tcp_loop, args=(s, name), daemon=True).start()
    for port in udp_ports:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("0.0.0.0", port))
        sockets.append(s)
        threading.Thread(target=_udp_loop, args=(s, name), daemon=True).start()
    print("ready", flush=True)
    time.sleep(max(deadline - time.monotonic(), 0))


def _tcp_loop(listener: socket.socket, name: str) -> None:
    while True:
        conn, peer = listener.accept()
        threading.Thread(target=_tcp_reply, args=(conn, peer, name), daemon=True).start()


def _tcp_reply(conn: socket.socket, peer: tuple[str, int], name: str) -> None:
    with conn:
        conn.settimeout(30)
        try:
            conn.sendall(f"{name} {peer[0]}:{peer[1]}\n".encode())
            # Long connections (--hold) send "ping" lines; answer each until EOF.
            while data := conn.recv(64):
                conn.sendall(f"{name} {len(data)}\n".encode())
        except OSError:
            pass


def _udp_loop(sock: socket.socket, name: str) -> None:
    while True:
        _data, peer = sock.recvfrom(2048)
        sock.sendto(f"{name} {peer[0]}:{peer[1]}".encode(), peer)


def _error(exc: OSError) -> dict[str, Any]:
    code = exc.errno if exc.errno is not None else 0
    return {
        "ok": False,
        "error": errno.errorcode.get(code, str(exc)) if code else type(exc).__name__,
    }


def tcp_request(target: tuple[str, int], timeout: float) -> dict[str, Any]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(target)
        peer = s.getpeername()
        reply = s.recv(256).decode().split()
        return {"ok": True, "server": reply[0], "seen_as": reply[1], "peer": f"{peer[0]}:{peer[1]}"}
    except OSError as exc:
        return _error(exc)
    finally:
        s.close()


def udp_request(target: tuple[str, int], timeout: float, connected: bool) -> dict[str, Any]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(timeout)
    try:
        if connected:
            s.connect(target)
            s.send(b"hello")
            data = s.recv(256)
            source = s.getpeername()
        else:
            s.sendto(b"hello", target)
            data, source = s.recvfrom(256)
        reply = data.decode().split()
        return {
            "ok": True,
            "server": reply[0],
            "seen_as": reply[1],
            "peer": f"{source[0]}:{source[1]}",
        }
    except OSError as exc:
        return _error(exc)
    finally:
        s.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ebpflb.testing.echo")
    sub = parser.add_subparsers(dest="mode", required=True)
    srv = sub.add_parser("serve")
    srv.add_argument("--name", required=True)
    srv.add_argument("--tcp", type=int, action="append", default=[])
    srv.add_argument("--udp", type=int, action="append", default=[])
    srv.add_argument("--lifetime", type=float, default=60.0)
    for mode in ("tcp", "udp"):
        cli = sub.add_parser(mode)
        cli.add_argument("target", type=_addr, help="IP:PORT")
        cli.add_argument("--count", type=int, default=1)
        cli.add_argument("--timeout", type=float, default=2.0)
        if mode == "udp":
            cli.add_argument("--connected", action="store_true")
    args = parser.parse_args(argv)
    if args.mode == "serve":
        serve(args.name, args.tcp, args.udp, args.lifetime)
        return 0
    for _ in range(args.count):
        if args.mode == "tcp":
            result = tcp_request(args.target, args.timeout)
        else:
            result = udp_request(args.target, args.timeout, args.connected)
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
