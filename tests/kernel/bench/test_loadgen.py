"""The compiled load generator (connbench) between two namespaces joined by a veth pair.

The server's namespace takes all of 10.128.0.0/24 locally (an AnyIP route), so one server
answers every "service" address base + i + 1; its counters show which addresses were used.
The IPv6 pair does the same over IPv6 (fd00:128::/64; addresses added without duplicate
address detection, so they are usable at once).
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ebpflb.errors import EbpflbError
from lab.bench import loadgen
from lab.bench.topology import ipv6_on
from lab.harness.netns import Cgroup, Namespaces, sh

pytestmark = pytest.mark.kernel

BASE = "10.128.0.0"  # service i is 10.128.0.(i + 1), all local to the server namespace
SERVER_IP, CLIENT_IP = "10.201.0.2", "10.201.0.1"
PORT, CLOSED_PORT = 8080, 8081


@dataclass
class Pair:
    namespaces: Namespaces
    server: str
    client: str


@pytest.fixture
def pair() -> Iterator[Pair]:
    # Function scope (a pair takes ~50 ms): the autouse root check in tests/conftest.py
    # then runs first and skips without root; a module fixture would be set up before it.
    ns = Namespaces(f"elb{uuid.uuid4().hex[:6]}")
    try:
        server, client = ns.add_namespace("srv"), ns.add_namespace("cli")
        ns.link(server, "eth0", client, "eth0")
        sh("ip", "-n", server, "addr", "add", f"{SERVER_IP}/30", "dev", "eth0")
        sh("ip", "-n", client, "addr", "add", f"{CLIENT_IP}/30", "dev", "eth0")
        sh("ip", "-n", server, "route", "add", "local", f"{BASE}/24", "dev", "lo")
        sh("ip", "-n", client, "route", "add", f"{BASE}/24", "via", SERVER_IP)
        yield Pair(ns, server, client)
    finally:
        ns.close()


def serve(pair: Pair, *, cpu: int | None = None, threads: int = 1) -> loadgen.Server:
    return loadgen.start_server(
        pair.server, PORT, cpu=cpu, threads=threads, lifetime=120, owner=pair.namespaces
    )


def test_latency_times_every_connect_to_one_service(pair: Pair) -> None:
    with serve(pair) as server:
        result = loadgen.latency(pair.client, BASE, PORT, 300, index=6, cpu=0)
    assert (result.errors, result.first_error) == (0, None)
    assert len(result.samples_ns) == 300
    assert all(s > 0 for s in result.samples_ns)
    assert 1_000 < sorted(result.samples_ns)[150] < 50_000_000  # a median between 1 us and 50 ms
    assert server.stats is not None
    assert server.stats.local_addresses == 1  # 10.128.0.7 only
    assert server.stats.requests == 0  # the client reset each connection without a word


def accept_queue(netns: str) -> int:
    """Connections waiting in the listener's accept queue (ss: a LISTEN socket's Recv-Q)."""
    shown = subprocess.run(
        ["ip", "netns", "exec", netns, "ss", "-Hltn", f"sport = :{PORT}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return sum(int(line.split()[1]) for line in shown.stdout.splitlines())


def wait_accepted(pair: Pair, timeout: float = 10.0) -> None:
    """Until the server has accepted every connection the client made: its counters are
    read when it stops, and one server thread can trail a fast client."""
    deadline = time.monotonic() + timeout
    while accept_queue(pair.server) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.05)  # the last accepted connection's address recorded


def test_random_spreads_over_exactly_the_first_n_services(pair: Pair) -> None:
    with serve(pair) as server:
        result = loadgen.latency(pair.client, BASE, PORT, 400, random_count=16, seed=7)
        wait_accepted(pair)
    assert (len(result.samples_ns), result.errors) == (400, 0)
    # Missing one of the 16 in 400 draws has probability 16 * (15/16)**400 < 1e-10; an
    # address outside base+1..base+16 would make the count exceed 16.
    assert server.stats is not None and server.stats.local_addresses == 16


def test_rate_with_and_without_a_request(pair: Pair) -> None:
    with serve(pair, cpu=1) as server:
        bare = loadgen.rate(pair.client, BASE, PORT, 1, index=0, cpu=0)
    assert bare.connections > 0 and (bare.errors, bare.first_error) == (0, None)
    assert 0.99 < bare.seconds < 5 and bare.rate > 0
    assert server.stats is not None and server.stats.requests == 0

    with serve(pair, cpu=1) as server:
        talk = loadgen.rate(pair.client, BASE, PORT, 1, random_count=100, cpu=0, request=True)
    assert talk.connections > 0 and (talk.errors, talk.first_error) == (0, None)
    # Every connection the client counted was answered by the server first.
    assert server.stats is not None and server.stats.requests >= talk.connections


@pytest.mark.parametrize("flows", [1, 32])
def test_request_response_on_kept_and_new_connections(pair: Pair, flows: int) -> None:
    """RR: every flow's requests on its one connection; CRR: a connection per request."""
    with serve(pair, cpu=1, threads=flows + 1) as server:
        kept = loadgen.request_response(
            pair.client, BASE, PORT, 0.5, flows, new_connection=False, index=3, cpu=0
        )
    assert kept.connections > flows and (kept.errors, kept.first_error) == (0, None)
    assert server.stats is not None
    assert server.stats.accepted == flows  # one connection each, held for the run
    assert server.stats.requests >= kept.connections
    with serve(pair, cpu=1, threads=flows + 1) as server:
        new = loadgen.request_response(
            pair.client, BASE, PORT, 0.5, flows, new_connection=True, index=3, cpu=0
        )
    assert new.connections > 0 and (new.errors, new.first_error) == (0, None)
    assert server.stats is not None
    assert server.stats.accepted >= new.connections  # a connection per transaction
    assert server.stats.requests >= new.connections


def test_nothing_listening_counts_every_connect_as_refused(pair: Pair) -> None:
    result = loadgen.latency(pair.client, BASE, CLOSED_PORT, 25, index=0)
    assert result.samples_ns == []
    assert result.errors == 25
    assert result.first_error is not None and "refused" in result.first_error.lower()
    rated = loadgen.rate(pair.client, BASE, CLOSED_PORT, 0.2, index=0)
    assert rated.connections == 0 and rated.errors > 0


def test_a_silent_client_does_not_wedge_a_one_thread_server(pair: Pair) -> None:
    hold = (
        "import socket, sys, time\n"
        f"s = socket.create_connection(('10.128.0.1', {PORT}))\n"
        "print('connected', flush=True)\n"
        "time.sleep(10)\n"
    )
    with serve(pair, threads=1) as server:
        silent = pair.namespaces.spawn(pair.client, [sys.executable, "-c", hold])
        try:
            assert silent.stdout is not None and silent.stdout.readline().strip() == "connected"
            # The server sits in read() on the silent connection for up to 1 s (its receive
            # timeout), then goes on answering; the client waits up to 3 s for each answer.
            talk = loadgen.rate(pair.client, BASE, PORT, 2, index=0, request=True, timeout=3)
        finally:
            silent.kill()
            silent.wait()
    assert talk.connections > 0 and talk.errors == 0, talk
    assert server.stats is not None and server.stats.requests >= talk.connections


def test_the_client_runs_in_the_given_cgroup(pair: Pair) -> None:
    cgroup = Cgroup.create(f"ebpflb-test-{uuid.uuid4().hex[:8]}")
    try:
        with serve(pair):
            loadgen.rate(pair.client, BASE, PORT, 0.3, index=0, cgroup=cgroup)
        # cpu.stat's usage is kept for every cgroup: CPU time there means the client ran there.
        usage = dict(line.split() for line in (cgroup.path / "cpu.stat").read_text().splitlines())
        assert int(usage["usage_usec"]) > 10_000
    finally:
        cgroup.close()


def test_a_server_that_cannot_bind_raises_with_its_error(pair: Pair) -> None:
    with serve(pair), pytest.raises(EbpflbError, match="Address already in use"):
        # SO_REUSEADDR does not let two listeners share a port: the second one's bind fails.
        loadgen.start_server(pair.server, PORT, lifetime=5)


BASE6 = "fd00:128::fff0"  # services 15 and 16 cross into the next 16-bit group
SERVER6, CLIENT6 = "fd00:201::2", "fd00:201::1"


@pytest.fixture
def pair6() -> Iterator[Pair]:
    ns = Namespaces(f"elb{uuid.uuid4().hex[:6]}")
    try:
        server, client = ns.add_namespace("srv"), ns.add_namespace("cli")
        for netns in (server, client):
            ipv6_on(netns)
        ns.link(server, "eth0", client, "eth0")
        sh("ip", "-n", server, "addr", "add", f"{SERVER6}/64", "dev", "eth0", "nodad")
        sh("ip", "-n", client, "addr", "add", f"{CLIENT6}/64", "dev", "eth0", "nodad")
        sh("ip", "-n", server, "route", "add", "local", "fd00:128::/64", "dev", "lo")
        sh("ip", "-n", client, "route", "add", "fd00:128::/64", "via", SERVER6)
        yield Pair(ns, server, client)
    finally:
        ns.close()


def test_ipv6_clients_connect_to_base_plus_index_over_ipv6(pair6: Pair) -> None:
    def serve6() -> loadgen.Server:
        return loadgen.start_server(
            pair6.server, PORT, lifetime=120, owner=pair6.namespaces, ipv6=True
        )

    with serve6() as server:
        one = loadgen.latency(pair6.client, BASE6, PORT, 50, index=16)  # fd00:128::1:1
    assert (len(one.samples_ns), one.errors) == (50, 0)
    assert server.stats is not None and server.stats.local_addresses == 1
    with serve6() as server:
        spread = loadgen.latency(pair6.client, BASE6, PORT, 400, random_count=32, seed=3)
        rated = loadgen.rate(pair6.client, BASE6, PORT, 0.3, index=0, request=True)
    assert (len(spread.samples_ns), spread.errors) == (400, 0)
    # All of base+1..base+32 and nothing else (missing one: 32 * (31/32)**400 < 1e-4).
    assert server.stats is not None and server.stats.local_addresses == 32
    assert rated.connections > 0 and rated.errors == 0
    assert server.stats.requests >= rated.connections
    # Failed connects are counted over IPv6 as over IPv4.
    refused = loadgen.latency(pair6.client, "fd00:128::", CLOSED_PORT, 3, index=0)
    assert refused.errors == 3 and "refused" in (refused.first_error or "").lower()
