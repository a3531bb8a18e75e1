"""Sync benchmark: ebpflb fed by the Kubernetes API versus kube-proxy's iptables-restore.

ebpflb side: the fake API server (ebpflb.testing.fakeapi) serves N Services with one
EndpointSlice of K endpoints each; the real `ebpflb run --kubeconfig` lists them and
programs the real kernel maps (its own bpffs directory and test cgroup, removed at the
end). Measured: process start -> "initial sync complete", and for a few single-slice
changes (one endpoint turning not ready) the time from the API write to the pinned map
showing the new service entry (polled from this process).

kube-proxy side: no kube-proxy binary is available here, so the bench writes the
iptables-restore input kube-proxy's iptables proxier writes for the same Services (the
KUBE-SERVICES / KUBE-SVC-* / KUBE-SEP-* chains, statistic probabilities, DNAT; chain names
hashed as kube-proxy does) and times `iptables-restore -w 5 -W 100000 --noflush --counters`
(kube-proxy's flags) inside a network namespace created and deleted here: the full sync
into an empty namespace, and the partial sync of kube-proxy >= 1.26 for the one-endpoint
change (KUBE-SERVICES rewritten whole, plus the changed service's chains). Only the
restore is timed, so these are lower bounds on kube-proxy's sync time.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

from ebpflb.errors import ConfigError, EbpflbError

NAMESPACE = "bench"
PORT, TARGET_PORT = 80, 8080
CLUSTER_CIDR = "10.244.0.0/16"
VIP_BASE = int(IPv4Address("10.96.0.0"))
ENDPOINT_BASE = int(IPv4Address("10.244.0.0"))
IPTABLES_BACKENDS = {"legacy": "iptables-legacy-restore", "nft": "iptables-nft-restore"}
# kube-proxy's own invocation (pkg/util/iptables: -w 5 -W 100000, --noflush --counters).
RESTORE_FLAGS = ("-w", "5", "-W", "100000", "--noflush", "--counters")
MASQ_MARK = "0x4000"


@dataclass(frozen=True, slots=True)
class BenchService:
    index: int
    endpoints: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"svc-{self.index:05d}"

    @property
    def vip(self) -> str:
        return str(IPv4Address(VIP_BASE + self.index + 1))

    @property
    def port_name(self) -> str:
        """kube-proxy's ServicePortName string: namespace/name:port."""
        return f"{NAMESPACE}/{self.name}:http"


def bench_services(count: int, endpoints: int) -> list[BenchService]:
    if count < 1 or endpoints < 2:
        raise ConfigError("need at least 1 service and 2 endpoints per service")
    if count >= 65000 or count * endpoints >= 65000:
        raise ConfigError("the bench addresses fit in one /16: at most 65000 of each")
    return [
        BenchService(
            i,
            tuple(
                str(IPv4Address(ENDPOINT_BASE + i * endpoints + e + 1)) for e in range(endpoints)
            ),
        )
        for i in range(count)
    ]


# ---- API objects ---------------------------------------------------------------------------


def service_object(svc: BenchService) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": svc.name, "namespace": NAMESPACE},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": svc.vip,
            "clusterIPs": [svc.vip],
            "ports": [{"name": "http", "protocol": "TCP", "port": PORT, "targetPort": TARGET_PORT}],
        },
    }


def slice_object(svc: BenchService, not_ready: int = 0) -> dict[str, Any]:
    """The service's one EndpointSlice; the last `not_ready` endpoints are not ready."""
    ready_count = len(svc.endpoints) - not_ready
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{svc.name}-abcde",
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": svc.name},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": TARGET_PORT}],
        "endpoints": [
            {"addresses": [ip], "conditions": {"ready": i < ready_count}, "nodeName": "node-1"}
            for i, ip in enumerate(svc.endpoints)
        ],
    }


# ---- kube-proxy's iptables-restore input ---------------------------------------------------


def _hash16(text: str) -> str:
    """kube-proxy's chain-name hash: base32(sha256(text))[:16]."""
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:16]


def svc_chain(svc: BenchService) -> str:
    return "KUBE-SVC-" + _hash16(svc.port_name + "tcp")


def sep_chain(svc: BenchService, ip: str) -> str:
    return "KUBE-SEP-" + _hash16(svc.port_name + "tcp" + f"{ip}:{TARGET_PORT}")


FILTER_TABLE = f"""*filter
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 \
! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark \
--mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack \
--ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
"""

# Jumps from the built-in chains; kube-proxy adds them with single iptables calls, once.
JUMP_RULES = (
    ("nat", "PREROUTING", "kubernetes service portals", "KUBE-SERVICES"),
    ("nat", "OUTPUT", "kubernetes service portals", "KUBE-SERVICES"),
    ("nat", "POSTROUTING", "kubernetes postrouting rules", "KUBE-POSTROUTING"),
    ("filter", "FORWARD", "kubernetes forwarding rules", "KUBE-FORWARD"),
)


def restore_input(
    services: Sequence[BenchService],
    *,
    changed: BenchService | None = None,
    ready: int | None = None,
) -> str:
    """What kube-proxy's iptables proxier hands to iptables-restore.

    Without `changed`: a full sync, every chain. With it: the partial sync after that
    service's endpoints dropped to the first `ready`: KUBE-SERVICES and the other base
    chains in full, the changed service's chains, and its stale endpoint chain flushed
    and deleted. Rule syntax follows pkg/proxy/iptables/proxier.go (ClusterIP services).
    """
    chains = [
        ":KUBE-NODEPORTS - [0:0]",
        ":KUBE-SERVICES - [0:0]",
        ":KUBE-MARK-MASQ - [0:0]",
        ":KUBE-POSTROUTING - [0:0]",
    ]
    rules = [
        f"-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN",
        f"-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}",
        '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT"'
        " -j MASQUERADE --random-fully",
        f"-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}",
    ]
    deletions = []
    for svc in services:
        chain = svc_chain(svc)
        match = f"-m tcp -p tcp -d {svc.vip} --dport {PORT}"
        comment = f'-m comment --comment "{svc.port_name} cluster IP"'
        rules.append(f"-A KUBE-SERVICES {comment} {match} -j {chain}")
        if changed is not None and svc is not changed:
            continue  # partial sync: untouched service chains stay as they are
        live = svc.endpoints if svc is not changed or ready is None else svc.endpoints[:ready]
        chains.append(f":{chain} - [0:0]")
        rules.append(f"-A {chain} {comment} {match} ! -s {CLUSTER_CIDR} -j KUBE-MARK-MASQ")
        for i, ip in enumerate(live):
            sep = sep_chain(svc, ip)
            chains.append(f":{sep} - [0:0]")
            probability = (
                f" -m statistic --mode random --probability {1.0 / (len(live) - i):0.10f}"
                if i < len(live) - 1
                else ""
            )
            rules.append(
                f'-A {chain} -m comment --comment "{svc.port_name} -> {ip}:{TARGET_PORT}"'
                f"{probability} -j {sep}"
            )
            rules.append(f"-A {sep} -m comment --comment {svc.port_name} -s {ip} -j KUBE-MARK-MASQ")
            rules.append(
                f"-A {sep} -m comment --comment {svc.port_name} -m tcp -p tcp"
                f" -j DNAT --to-destination {ip}:{TARGET_PORT}"
            )
        for ip in svc.endpoints[len(live) :]:
            # kube-proxy flushes a stale chain with its chain line, then deletes it.
            chains.append(f":{sep_chain(svc, ip)} - [0:0]")
            deletions.append(f"-X {sep_chain(svc, ip)}")
    rules.append(
        '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must'
        ' be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS'
    )
    return FILTER_TABLE + "\n".join(["*nat", *chains, *rules, *deletions, "COMMIT", ""])


def rule_count(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith("-A "))


@contextlib.contextmanager
def bench_netns() -> Iterator[str]:
    """A network namespace of our own for iptables (never the root namespace's tables)."""
    name = f"ebpflb-bench-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _in_netns(netns: str, argv: Sequence[str]) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{netns}", *argv]


def timed_restore(netns: str, binary: str, text: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        _in_netns(netns, [binary, *RESTORE_FLAGS]),
        input=text,
        text=True,
        capture_output=True,
        timeout=600,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise EbpflbError(f"{binary} failed ({done.returncode}): {done.stderr.strip()[:500]}")
    return elapsed


def bench_iptables(
    services: Sequence[BenchService], backend: str, changes: Sequence[int]
) -> dict[str, Any]:
    binary = IPTABLES_BACKENDS[backend]
    if shutil.which(binary) is None:
        return {"backend": backend, "skipped": f"{binary} not found"}
    full = restore_input(services)
    endpoints = len(services[0].endpoints)
    with bench_netns() as netns:
        initial = timed_restore(netns, binary, full)
        # The jumps from the built-in chains (their targets exist only now), not timed.
        single = binary.removesuffix("-restore")
        for table, chain, comment, target in JUMP_RULES:
            subprocess.run(
                _in_netns(
                    netns,
                    [
                        single,
                        "-w",
                        "5",
                        "-t",
                        table,
                        "-A",
                        chain,
                        "-m",
                        "comment",
                        "--comment",
                        comment,
                        "-j",
                        target,
                    ],
                ),
                check=True,
                capture_output=True,
            )
        partial_inputs = [
            restore_input(services, changed=services[i], ready=endpoints - 1) for i in changes
        ]
        partial = [timed_restore(netns, binary, text) for text in partial_inputs]
        loaded = subprocess.run(
            _in_netns(netns, [binary.replace("-restore", "-save"), "-t", "nat"]),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return {
        "backend": backend,
        "binary": binary,
        "version": subprocess.run(
            [binary, "--version"], capture_output=True, text=True
        ).stdout.strip(),
        "command": f"nsenter --net=/run/netns/<bench netns> {binary} {' '.join(RESTORE_FLAGS)}"
        " < input",
        "full_sync_rules": rule_count(full),
        "full_sync_bytes": len(full),
        "full_sync_s": initial,
        "partial_sync_rules": rule_count(partial_inputs[0]),
        "partial_sync_s": partial,
        "rules_loaded": sum(1 for line in loaded.splitlines() if line.startswith("-A ")),
    }


# ---- ebpflb --------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metric(url: str, name: str, labels: str) -> float | None:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.split()[-1])
    return None


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def bench_ebpflb(
    services: Sequence[BenchService],
    changes: Sequence[int],
    *,
    sync_period: float,
    min_sync_period: float,
) -> dict[str, Any]:
    # Imported here so that `bench sync --help` works without bcc and without root.
    from ebpflb.config import Config
    from ebpflb.datapath.kernel import KernelMapSet
    from ebpflb.maglev import table_size_for
    from ebpflb.model import Frontend, Proto
    from ebpflb.testing.agentproc import AgentProcess
    from ebpflb.testing.fakeapi import FakeApiServer
    from ebpflb.testing.netns import Cgroup

    if os.geteuid() != 0:
        raise EbpflbError("bench sync loads BPF programs: run it as root")
    endpoints = len(services[0].endpoints)
    table = table_size_for(endpoints)
    # Every table plus room to resize, and never below the default (which must hold the
    # largest table).
    slot_pool = max(1 << (len(services) * table * 5 // 4).bit_length(), Config().slot_pool_size)
    tag = uuid.uuid4().hex[:8]
    bpffs = Path(f"/sys/fs/bpf/ebpflb-bench-{tag}")
    workdir = Path(tempfile.mkdtemp(prefix="ebpflb-bench-"))
    metrics_port = _free_port()
    report: dict[str, Any] = {}
    api = FakeApiServer()
    cgroup: Cgroup | None = None
    agent: AgentProcess | None = None
    try:
        api.start()
        started = time.perf_counter()
        api.load(service_object(s) for s in services)
        api.load(slice_object(s) for s in services)
        api.compact()
        report["api_load_s"] = time.perf_counter() - started
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
        cgroup = Cgroup.create(f"ebpflb-bench-{tag}")
        argv = [
            "--kubeconfig",
            str(kubeconfig),
            "--bpffs",
            str(bpffs),
            "--cgroup",
            str(cgroup.path),
            "--slot-pool-size",
            str(slot_pool),
            "--sync-period",
            str(sync_period),
            "--min-sync-period",
            str(min_sync_period),
            f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        ]
        started = time.perf_counter()
        agent = AgentProcess(argv, log_file=workdir / "agent.log")
        try:
            agent.wait_for("socket-LB attached", timeout=180)
            attached = time.perf_counter() - started
            listed = [
                agent.wait_for(f" {kind} at resourceVersion", timeout=300)
                for kind in ("Services", "EndpointSlices")
            ]
            line = agent.wait_for("initial sync complete", timeout=300)
        except (RuntimeError, TimeoutError) as exc:  # the agent died or hung: say why
            raise EbpflbError(f"ebpflb run did not sync: {exc}") from exc
        synced = time.perf_counter() - started
        match = re.search(r"complete in ([\d.]+)s: (\d+) frontends, (\d+) errors", line)
        if match is None or int(match[2]) != len(services) or int(match[3]):
            raise EbpflbError(f"unexpected initial sync: {line}\n{agent.output()[-3000:]}")
        report.update(
            start_to_attached_s=attached,
            start_to_synced_s=synced,
            first_sync_s=float(match[1]),
            lists=[_list_figures(text) for text in listed],
            frontends=int(match[2]),
            slot_pool_size=slot_pool,
            table_size=table,
            agent_rss_mib=_rss_mib(agent.proc.pid),
        )

        latencies = []
        with KernelMapSet(bpffs) as maps:
            for i in changes:
                svc = services[i]
                frontend = Frontend(IPv4Address(svc.vip), PORT, Proto.TCP)
                entry = maps.services.get(frontend)
                if entry is None or entry.backend_count != endpoints:
                    raise EbpflbError(f"{svc.name}: unexpected map entry {entry}")
                # Past the minimum interval since the last sync, as a lone change would be.
                time.sleep(min_sync_period + 0.2)
                started = time.perf_counter()
                api.update(slice_object(svc, not_ready=1))
                deadline = started + 30
                while (entry := maps.services.get(frontend)) is None or (
                    entry.backend_count != endpoints - 1
                ):
                    if time.perf_counter() > deadline:
                        raise EbpflbError(f"{svc.name}: change not written within 30 s")
                    time.sleep(0.0005)
                latencies.append(time.perf_counter() - started)
        report["change_to_map_s"] = latencies
        # The periodic full resync (re-read every map, compare, repair): wait for one.
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        deadline = time.perf_counter() + sync_period + 60
        while (
            _metric(url, "ebpflb_syncs_total", 'kind="full",result="ok"') or 0
        ) < 2 and time.perf_counter() < deadline:
            time.sleep(0.2)
        full_count = _metric(url, "ebpflb_syncs_total", 'kind="full",result="ok"') or 0
        full_sum = _metric(url, "ebpflb_sync_duration_seconds_sum", 'kind="full"') or 0.0
        if full_count >= 2:
            report["periodic_full_resync_s"] = (full_sum - report["first_sync_s"]) / (
                full_count - 1
            )
        repaired = _metric(url, "ebpflb_drift_repaired_total", 'map="ebpflb_svc4"')
        report["drift_repaired_svc4"] = repaired or 0.0
    finally:
        if agent is not None:
            agent.stop()
        api.close()
        from ebpflb.datapath import loader

        if cgroup is not None:
            loader.cleanup(bpffs, cgroup.path, interfaces=())
            cgroup.close()
        elif bpffs.exists():
            loader.cleanup(bpffs, Path("/nonexistent"), interfaces=())
        if bpffs.exists():
            for pin in bpffs.iterdir():
                pin.unlink()
            bpffs.rmdir()
        shutil.rmtree(workdir, ignore_errors=True)  # failures quote the agent's log already
    return report


def _list_figures(line: str) -> dict[str, Any]:
    match = re.search(
        r"listed (\d+) (\w+) at resourceVersion \S+ in ([\d.]+)s \((\d+) requests", line
    )
    if match is None:
        return {"line": line}
    return {
        "kind": match[2],
        "objects": int(match[1]),
        "seconds": float(match[3]),
        "requests": int(match[4]),
    }


# ---- the whole bench -----------------------------------------------------------------------


def run_sync_bench(
    *,
    services: int = 10_000,
    endpoints: int = 3,
    changes: int = 5,
    backends: Sequence[str] = ("legacy", "nft"),
    sync_period: float = 10.0,
    min_sync_period: float = 0.5,
) -> dict[str, Any]:
    specs = bench_services(services, endpoints)
    if changes < 1:
        raise ConfigError("--changes must be at least 1")
    for backend in backends:
        if backend not in IPTABLES_BACKENDS:
            raise ConfigError(f"unknown iptables backend {backend!r}: legacy or nft")
    picks = [(k * 7919 + services // 2) % services for k in range(changes)]  # spread out
    started = time.perf_counter()
    report: dict[str, Any] = {
        "services": services,
        "endpoints_per_service": endpoints,
        "changes": changes,
        "cpus": os.cpu_count(),
        "kernel": os.uname().release,
        "ebpflb": bench_ebpflb(
            specs, picks, sync_period=sync_period, min_sync_period=min_sync_period
        ),
        "iptables": [bench_iptables(specs, backend, picks) for backend in backends],
    }
    report["ebpflb"]["sync_period_s"] = sync_period
    report["ebpflb"]["min_sync_period_s"] = min_sync_period
    report["total_s"] = time.perf_counter() - started
    return report


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _spread(values: Sequence[float]) -> str:
    if len(values) == 1:
        return _ms(values[0])
    return (
        f"median {_ms(statistics.median(values))} (min {_ms(min(values))}, max {_ms(max(values))})"
    )


def _row(label: str, value: str) -> str:
    return f"  {label:<46}{value}"


def render_text(report: dict[str, Any]) -> str:
    e = report["ebpflb"]
    n, k = report["services"], report["endpoints_per_service"]
    lines = [
        f"ebpflb bench sync: {n:,} Services x {k} endpoints ({n * k:,} endpoints, {n:,}"
        f" EndpointSlices), {report['cpus']} CPUs, Linux {report['kernel']}",
        "",
        "ebpflb: `ebpflb run --kubeconfig` on the fake API server (127.0.0.1), real BPF maps",
        _row("start -> programs compiled and attached", _ms(e["start_to_attached_s"])),
    ]
    for listed in e["lists"]:
        if "seconds" in listed:
            lines.append(
                _row(
                    f"list {listed['objects']:,} {listed['kind']} (in parallel)",
                    f"{_ms(listed['seconds'])} ({listed['requests']} requests of 500)",
                )
            )
    lines += [
        _row(
            f"first sync: {e['frontends']:,} frontends, M={e['table_size']} each",
            _ms(e["first_sync_s"]),
        ),
        _row("start -> synced", _ms(e["start_to_synced_s"])),
        _row(
            "one slice change -> map entry written",
            f"{_spread(e['change_to_map_s'])}, {len(e['change_to_map_s'])} changes",
        ),
    ]
    if "periodic_full_resync_s" in e:
        lines.append(
            _row(
                f"periodic full resync (every {e['sync_period_s']:g} s here)",
                f"{_ms(e['periodic_full_resync_s'])} (re-read, compare, repair)",
            )
        )
    lines.append(_row("agent RSS after sync", f"{e['agent_rss_mib']:.0f} MiB"))
    for ipt in report["iptables"]:
        lines.append("")
        if "skipped" in ipt:
            lines.append(f"kube-proxy iptables ({ipt['backend']}): skipped, {ipt['skipped']}")
            continue
        mib = ipt["full_sync_bytes"] / 2**20
        lines += [
            f"kube-proxy iptables mode, iptables-restore only: {ipt['version']}",
            _row(
                f"full sync, {ipt['full_sync_rules']:,} rules ({mib:.1f} MiB)",
                _ms(ipt["full_sync_s"]),
            ),
            _row(
                f"one endpoint change: partial, {ipt['partial_sync_rules']:,} rules",
                f"{_spread(ipt['partial_sync_s'])}, {len(ipt['partial_sync_s'])} changes",
            ),
            f"  command: {ipt['command']}",
        ]
    lines += ["", f"total bench time {report['total_s']:.0f} s"]
    return "\n".join(lines)
