"""Tiny servers and clients for the demo and the kernel tests, run inside namespaces.

    python -m lab.harness.echo serve --name pod1 --tcp 8080 --udp 5353 --lifetime 60
    python -m lab.harness.echo tcp 10.96.0.10:80 --count 100 [--size 2000]
    python -m lab.harness.echo udp 10.96.0.53:53 --count 30 [--connected] [--size 3000]
    python -m lab.harness.echo udp-burst 192.168.100.1:30053 --count 2000
    python -m lab.harness.echo tcp-hold 192.168.100.1:30080 --pings 20 --interval 0.2
    python -m lab.harness.echo udp-hold 192.168.100.1:30053 --pings 20 --interval 0.2

A server answers every TCP connection and UDP datagram with "<name> <client ip:port>"
(UDP: followed by the request's payload), so a client learns which backend served it, the
backend shows what source it saw, and a reply delivered to the wrong client is detected.
`tcp`/`udp` print one JSON object per request; `udp-burst` opens one socket (one flow) per
request, sends them all and prints a summary; `tcp-hold` keeps one connection and reports
which backend answered each ping; `udp-hold` does the same over one connected UDP socket
(one flow), reporting a ping that got no answer by its error and opening a new socket only
when the kernel aborted the old one, as a resolver would. Everything is bounded: servers
exit after --lifetime, clients use timeouts.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import resource
import select
import socket
import sys
import threading
import time
from typing import Any


def _addr(text: str) -> tuple[str, int]:
    """IP:PORT, or [IPv6]:PORT."""
    host, _, port = text.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def _family(host: str) -> socket.AddressFamily:
    """The socket family a client uses for `host`: an IPv6 (or IPv4-mapped) address needs
    an AF_INET6 socket."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _show(peer: tuple[Any, ...]) -> str:
    """A socket address as IP:PORT, or [IPv6]:PORT."""
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def serve(
    name: str, tcp_ports: list[int], udp_ports: list[int], lifetime: float, ipv6: bool = False
) -> None:
    """Listen on every IPv4 address, and with `ipv6` on every IPv6 address too (separate
    IPv6-only sockets: an IPv4 client is still seen as an IPv4 address)."""
    deadline = time.monotonic() + lifetime
    sockets = []
    families = [(socket.AF_INET, "0.0.0.0")] + ([(socket.AF_INET6, "::")] if ipv6 else [])
    for family, anywhere in families:
        for port in tcp_ports:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((anywhere, port))
            s.listen(512)
            sockets.append(s)
            threading.Thread(target=_tcp_loop, args=(s, name), daemon=True).start()
        for port in udp_ports:
            s = socket.socket(family, socket.SOCK_DGRAM)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((anywhere, port))
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
        data, peer = sock.recvfrom(65535)  # --size: datagrams larger than one packet
        sock.sendto(f"{name} {peer[0]}:{peer[1]} ".encode() + data, peer)


def _error(exc: OSError) -> dict[str, Any]:
    code = exc.errno if exc.errno is not None else 0
    return {
        "ok": False,
        "error": errno.errorcode.get(code, str(exc)) if code else type(exc).__name__,
    }


def tcp_request(target: tuple[str, int], timeout: float, size: int = 0) -> dict[str, Any]:
    """One connection and the server's greeting. `size`: then a body of that many bytes,
    acknowledged by the server chunk by chunk ("<name> <bytes>" lines) until all of it
    has crossed (a request larger than one segment)."""
    s = socket.socket(_family(target[0]), socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(target)
        peer = s.getpeername()
        greeting = s.recv(256).decode()
        reply = greeting.split()
        result = {"ok": True, "server": reply[0], "seen_as": reply[1], "peer": _show(peer)}
        if size:
            s.sendall(b"4" * size)
            acked, pending = 0, greeting.split("\n", 1)[1]
            while acked < size:
                while "\n" not in pending:
                    data = s.recv(4096).decode()
                    if not data:
                        return {"ok": False, "error": "EOF", "echoed": acked}
                    pending += data
                line, pending = pending.split("\n", 1)
                acked += int(line.split()[1])
            result["echoed"] = acked
        return result
    except OSError as exc:
        return _error(exc)
    finally:
        s.close()


def udp_request(
    target: tuple[str, int], timeout: float, connected: bool, size: int = 0, source_port: int = 0
) -> dict[str, Any]:
    """One datagram and its answer. `size`: the request's payload, padded to that many
    bytes (the answer echoes it: a datagram larger than one packet travels as fragments
    both ways). `source_port`: sent from that port (upstream's `nc -u -p 12345`: every
    request the same flow, so state kept for the flow between requests shows)."""
    s = socket.socket(_family(target[0]), socket.SOCK_DGRAM)
    s.settimeout(timeout)
    if source_port:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("::" if _family(target[0]) == socket.AF_INET6 else "0.0.0.0", source_port))
    nonce = os.urandom(8).hex()
    payload = nonce + "." * max(size - len(nonce), 0)
    try:
        if connected:
            s.connect(target)
            s.send(payload.encode())
            data = s.recv(65535)
            source = s.getpeername()
        else:
            s.sendto(payload.encode(), target)
            data, source = s.recvfrom(65535)
        reply = data.decode().split()
        if reply[2:] != [payload]:
            return {"ok": False, "error": "MISMATCH", "reply": data.decode()[:200]}
        return {
            "ok": True,
            "server": reply[0],
            "seen_as": reply[1],
            "peer": _show(source),
            "echoed": len(reply[2]),
        }
    except OSError as exc:
        return _error(exc)
    finally:
        s.close()


def udp_burst(target: tuple[str, int], count: int, timeout: float) -> dict[str, Any]:
    """One new socket (so one new flow) per request, all kept open so no two requests
    share a source port, in batches. Counts replies that carried another request's nonce,
    or came from elsewhere than the target: mistranslations."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, count + 256), hard), hard))
    sent = answered = mismatched = 0
    servers: dict[str, int] = {}
    opened: list[socket.socket] = []
    try:
        for start in range(0, count, 500):
            poller = select.poll()
            pending: dict[int, tuple[socket.socket, str]] = {}
            for _ in range(min(500, count - start)):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                opened.append(s)
                s.setblocking(False)
                nonce = os.urandom(8).hex()
                try:
                    s.sendto(nonce.encode(), target)
                except OSError:
                    continue
                sent += 1
                pending[s.fileno()] = (s, nonce)
                poller.register(s, select.POLLIN)
            deadline = time.monotonic() + timeout
            while pending and (left := deadline - time.monotonic()) > 0:
                for fd, _event in poller.poll(left * 1000):
                    s, nonce = pending.pop(fd)
                    poller.unregister(fd)
                    data, source = s.recvfrom(256)
                    reply = data.decode().split()
                    if reply[2:] != [nonce] or source != target:
                        mismatched += 1
                    else:
                        answered += 1
                        servers[reply[0]] = servers.get(reply[0], 0) + 1
    finally:
        for s in opened:
            s.close()
    return {"sent": sent, "answered": answered, "mismatched": mismatched, "servers": servers}


def tcp_hold(
    target: tuple[str, int], pings: int, interval: float, timeout: float
) -> dict[str, Any]:
    """One connection, `pings` round trips `interval` apart: which backend answered each.
    Prints a "connected" line first, so a test can change the service meanwhile."""
    answers: list[str] = []
    try:
        s = socket.create_connection(target, timeout=timeout)
    except OSError as exc:
        return {"ok": False, "answers": answers, **_error(exc)}
    try:
        answers.append(s.recv(256).decode().split()[0])
        print(json.dumps({"connected": answers[0]}), flush=True)
        for _ in range(pings):
            time.sleep(interval)
            s.sendall(b"ping")
            answers.append(s.recv(256).decode().split()[0])
    except OSError as exc:
        return {"ok": False, "answers": answers, **_error(exc)}
    finally:
        s.close()
    return {"ok": True, "answers": answers}


def udp_hold(
    target: tuple[str, int], pings: int, interval: float, timeout: float
) -> dict[str, Any]:
    """One connected UDP socket, `pings` datagrams `interval` apart: which backend (or
    which error) answered each. Prints a "connected" line after the first answer."""

    def connect() -> socket.socket:
        s = socket.socket(_family(target[0]), socket.SOCK_DGRAM)
        s.settimeout(timeout)
        s.connect(target)
        return s

    answers: list[str] = []
    sockets = 1
    s = connect()
    try:
        for i in range(pings + 1):
            if i:
                time.sleep(interval)
            nonce = os.urandom(8).hex()
            try:
                s.send(nonce.encode())
                reply = s.recv(256).decode().split()
                answers.append(reply[0] if reply[2:] == [nonce] else "MISMATCH")
            except OSError as exc:
                answers.append(str(_error(exc)["error"]))
                # Destroyed under us (aborted, and so disconnected): a new socket.
                if exc.errno in (errno.ECONNABORTED, errno.EDESTADDRREQ):
                    s.close()
                    s = connect()
                    sockets += 1
            if i == 0:
                print(json.dumps({"connected": answers[0]}), flush=True)
    finally:
        s.close()
    return {"ok": True, "answers": answers, "sockets": sockets}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.harness.echo")
    sub = parser.add_subparsers(dest="mode", required=True)
    srv = sub.add_parser("serve")
    srv.add_argument("--name", required=True)
    srv.add_argument("--tcp", type=int, action="append", default=[])
    srv.add_argument("--udp", type=int, action="append", default=[])
    srv.add_argument("--lifetime", type=float, default=60.0)
    srv.add_argument("--ipv6", action="store_true", help="also listen on IPv6")
    for mode in ("tcp", "udp", "udp-burst", "tcp-hold", "udp-hold"):
        cli = sub.add_parser(mode)
        cli.add_argument("target", type=_addr, help="IP:PORT or [IPv6]:PORT")
        cli.add_argument("--count", type=int, default=1)
        cli.add_argument("--timeout", type=float, default=2.0)
        if mode == "udp":
            cli.add_argument("--connected", action="store_true")
            cli.add_argument("--source-port", type=int, default=0, help="send from this port")
            cli.add_argument("--size", type=int, default=0, help="pad requests to this size")
        if mode == "tcp":
            cli.add_argument("--size", type=int, default=0, help="send a body of this size")
        if mode in ("tcp-hold", "udp-hold"):
            cli.add_argument("--pings", type=int, default=10)
            cli.add_argument("--interval", type=float, default=0.2)
    args = parser.parse_args(argv)
    if args.mode == "serve":
        serve(args.name, args.tcp, args.udp, args.lifetime, args.ipv6)
        return 0
    if args.mode == "udp-burst":
        print(json.dumps(udp_burst(args.target, args.count, args.timeout)), flush=True)
        return 0
    if args.mode in ("tcp-hold", "udp-hold"):
        hold = tcp_hold if args.mode == "tcp-hold" else udp_hold
        result = hold(args.target, args.pings, args.interval, args.timeout)
        print(json.dumps(result), flush=True)
        return 0
    for _ in range(args.count):
        if args.mode == "tcp":
            result = tcp_request(args.target, args.timeout, args.size)
        else:
            result = udp_request(
                args.target, args.timeout, args.connected, args.size, args.source_port
            )
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
