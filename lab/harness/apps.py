"""Real servers and clients from Debian in namespaces, for the real-network kernel tests:
nginx (HTTP, large bodies both ways through WebDAV PUT), dnsmasq (DNS over UDP, answers
large enough to fragment), curl and dig as their clients.

Servers die with their namespaces' close() (nsenter execs them, so that kill reaches
them) or with the test process (PR_SET_PDEATHSIG); their files live in a directory the
caller owns (a pytest tmp_path), so nothing is left on the machine.
"""

from __future__ import annotations

import ctypes
import json
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lab.harness.agentproc import TIMEOUT_SCALE
from lab.harness.netns import Cgroup, Namespaces

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the process that started it ends (a crashed
    test leaves no server behind; nginx, dnsmasq and iperf3 have no lifetime option)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def spawn_server(namespaces: Namespaces, netns: str, argv: Sequence[str]) -> subprocess.Popen[str]:
    """A server process in `netns`, owned by `namespaces` (its close() kills it)."""
    proc = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{netns}", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent,
    )
    namespaces.processes.append(proc)
    return proc


def wait_listening(namespaces: Namespaces, netns: str, port: int, proto: str = "tcp") -> None:
    """Until something listens on `port` in `netns` (ss), at most 10 s (scaled: every wait
    here is multiplied by EBPFLB_TEST_TIMEOUT_SCALE, for emulated guests)."""
    flag = "-tln" if proto == "tcp" else "-uln"
    deadline = time.monotonic() + 10 * TIMEOUT_SCALE
    while time.monotonic() < deadline:
        done = namespaces.run(
            netns, ["ss", "-H", flag, f"sport = :{port}"], timeout=10 * TIMEOUT_SCALE
        )
        if done.stdout.strip():
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {proto} port {port} in {netns}")


# ---- nginx -----------------------------------------------------------------------------

NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
error_log {dir}/error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 128; }}
http {{
    access_log off;
    client_body_temp_path {dir}/tmp-body;
    proxy_temp_path {dir}/tmp-proxy;
    fastcgi_temp_path {dir}/tmp-fastcgi;
    uwsgi_temp_path {dir}/tmp-uwsgi;
    scgi_temp_path {dir}/tmp-scgi;
    client_max_body_size 64m;
    keepalive_requests 1000;
    server {{
        listen {port};
        listen [::]:{port};
        root {dir}/www;
        location = /name {{ return 200 "{name}\\n"; }}
        location /upload/ {{ dav_methods PUT; create_full_put_path on; }}
    }}
}}
"""


@dataclass(frozen=True)
class Nginx:
    name: str
    port: int
    directory: Path  # its config, its document root (www/), uploads (www/upload/)

    def stored(self, path: str) -> bytes:
        """A file as a PUT left it under the document root."""
        return (self.directory / "www" / path.lstrip("/")).read_bytes()


def start_nginx(
    namespaces: Namespaces,
    netns: str,
    name: str,
    port: int,
    directory: Path,
    files: dict[str, bytes],
) -> Nginx:
    """nginx in `netns` on `port` (both families): GET /name answers `name`, the `files`
    are served from its root, PUT stores under /upload/."""
    (directory / "www" / "upload").mkdir(parents=True, exist_ok=True)
    for path, content in files.items():
        (directory / "www" / path).write_bytes(content)
    conf = directory / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=directory, port=port, name=name))
    spawn_server(namespaces, netns, ["nginx", "-c", str(conf), "-p", str(directory)])
    wait_listening(namespaces, netns, port)
    return Nginx(name, port, directory)


@dataclass(frozen=True)
class CurlResult:
    """One transfer of a curl run (`-w` of each URL)."""

    code: int
    size_download: int
    size_upload: int
    num_connects: int  # 0: the transfer reused the connection (keep-alive)
    remote: str  # remote_ip:remote_port as curl connected
    body: str  # the response of a small GET (empty for large ones: written to /dev/null)


CURL_FORMAT = (
    '{"code": %{http_code}, "size_download": %{size_download}, "size_upload": %{size_upload},'
    ' "num_connects": %{num_connects}, "remote": "%{remote_ip}:%{remote_port}"}\n'
)


def curl(
    namespaces: Namespaces,
    netns: str,
    urls: Sequence[str],
    *,
    upload: Path | None = None,
    timeout: float = 60,
    cgroup: Cgroup | None = None,
) -> list[CurlResult]:
    """One curl run in `netns` over `urls` (one connection, kept alive between them, when
    they share a host); with `upload`, each is a PUT of that file. Bodies go to /dev/null
    but for their size."""
    timeout *= TIMEOUT_SCALE
    argv = ["curl", "-sS", "--max-time", str(int(timeout)), "-w", CURL_FORMAT]
    if upload is not None:
        argv += ["-T", str(upload)]
    for url in urls:  # each -o names the next URL's output
        argv += ["-o", "/dev/null", url]
    done = namespaces.run(netns, argv, cgroup, timeout=timeout + 10)
    if done.returncode != 0:
        raise RuntimeError(f"curl {' '.join(urls)}: exit {done.returncode}: {done.stderr.strip()}")
    return [CurlResult(body="", **json.loads(line)) for line in done.stdout.splitlines() if line]


def http_get_body(
    namespaces: Namespaces, netns: str, url: str, cgroup: Cgroup | None = None
) -> str:
    """The body of one small GET (a fresh connection)."""
    done = namespaces.run(
        netns,
        ["curl", "-sS", "--max-time", str(int(10 * TIMEOUT_SCALE)), url],
        cgroup,
        timeout=20 * TIMEOUT_SCALE,
    )
    if done.returncode != 0:
        raise RuntimeError(f"curl {url}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


# ---- dnsmasq ---------------------------------------------------------------------------

# TXT strings of 250 bytes: an answer of BIG_TXT_RECORDS of them is about 3 KB, over one
# 1500-byte packet, so it leaves the server as IP fragments (dig asks with EDNS 4096).
BIG_TXT_RECORDS = 12
TXT_STRING = "x" * 250


def start_dnsmasq(namespaces: Namespaces, netns: str, address: str, port: int) -> None:
    """dnsmasq in `netns` answering on address:port (UDP): small.test A 192.0.2.1, and
    big.test with BIG_TXT_RECORDS TXT records (about 3 KB)."""
    argv = [
        "dnsmasq",
        "--no-daemon",
        "--keep-in-foreground",
        "--no-resolv",
        "--no-hosts",
        "--no-poll",
        "--bind-interfaces",
        f"--listen-address={address}",
        f"--port={port}",
        "--edns-packet-max=4096",
        "--address=/small.test/192.0.2.1",
        "--pid-file=",
        "--user=root",
    ]
    argv += [f"--txt-record=big.test,{TXT_STRING}{i:02d}" for i in range(BIG_TXT_RECORDS)]
    spawn_server(namespaces, netns, argv)
    wait_listening(namespaces, netns, port, "udp")


@dataclass(frozen=True)
class DigAnswer:
    status: str  # NOERROR, ...
    records: tuple[str, ...]  # the answer section's data
    size: int  # the reply's size as dig received it (MSG SIZE rcvd)


def dig(
    namespaces: Namespaces,
    netns: str,
    server: str,
    port: int,
    name: str,
    rtype: str,
    cgroup: Cgroup | None = None,
) -> DigAnswer:
    """One query over UDP (no TCP fallback), EDNS buffer 4096."""
    argv = ["dig", f"@{server}", "-p", str(port), name, rtype, "+bufsize=4096", "+notcp"]
    argv += ["+ignore", "+tries=1", f"+time={int(3 * TIMEOUT_SCALE)}", "+nocookie"]
    done = namespaces.run(netns, argv, cgroup, timeout=20 * TIMEOUT_SCALE)
    if done.returncode != 0:
        raise RuntimeError(f"dig {name} {rtype} @{server}:{port}: {done.stdout}{done.stderr}")
    status, records, size = "", [], 0
    section = ""
    for line in done.stdout.splitlines():
        if "status:" in line:
            status = line.split("status:")[1].split(",")[0].strip()
        elif line.startswith(";; ANSWER SECTION"):
            section = "answer"
        elif line.startswith(";;") and "SECTION" in line:
            section = ""
        elif line.startswith(";; MSG SIZE"):
            size = int(line.split()[-1])
        elif section == "answer" and line.strip():
            records.append(line.split(None, 4)[-1])
        elif not line.strip():
            section = ""
    return DigAnswer(status, tuple(records), size)
