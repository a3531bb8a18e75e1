"""A service mesh's sidecar proxy, reduced to what a test needs to see what it sees.

The pod's iptables REDIRECT sends its outbound TCP to 127.0.0.1:PORT (Istio's and
Linkerd's pattern, the proxy's own uid excluded); for each connection the proxy reads the
destination the application asked for (SO_ORIGINAL_DST), connects there itself, and
answers the application with the upstream's first line followed by "via <destination>".

    python -m lab.harness.sidecar --port 15001 --count 5 --lifetime 60

Prints "ready" once listening. Bounded: --count connections, --lifetime seconds.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h, at SOL_IP


def original_destination(conn: socket.socket) -> tuple[str, int]:
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)  # struct sockaddr_in
    port, address = struct.unpack_from("!H4s", raw, 2)
    return socket.inet_ntoa(address), port


def serve(port: int, count: int, lifetime: float, timeout: float) -> None:
    deadline = time.monotonic() + lifetime
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(16)
        print("ready", flush=True)
        for _ in range(count):
            listener.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                return
            with conn:
                conn.settimeout(timeout)
                target = original_destination(conn)
                try:
                    with socket.create_connection(target, timeout=timeout) as upstream:
                        line = upstream.recv(256).decode().strip()
                except OSError as exc:
                    line = f"upstream-error {exc.__class__.__name__}"
                conn.sendall(f"{line} via {target[0]}:{target[1]}\n".encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.harness.sidecar")
    parser.add_argument("--port", type=int, default=15001)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--lifetime", type=float, default=60.0)
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    serve(args.port, args.count, args.lifetime, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
