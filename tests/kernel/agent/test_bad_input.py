"""Bad input against the real agent (--manifests), kernel and traffic: each bad file,
document or object costs only itself; externalIPs need the allow-list (CVE-2020-8554);
the pins are root's alone.

State is read through `ebpflb maps dump --json` and traffic, never the agent's log.
Metric checks to add once AgentProcess reads /metrics (the "health" worker's branch):
ebpflb_invalid_objects_total{kind="Manifest",reason="decode"} == 1 and
{kind="Service",reason="type"} == 2 at start, 3 after the late bad document;
{kind="EndpointSlice",reason="type"} == 1; ebpflb_ports_skipped_total{reason="protocol"}
== 1; ebpflb_external_ips_refused_total == 2 by default and 1 with the allow-list.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ebpflb.datapath.programs import loader
from lab.harness.netns import Cgroup, Topology
from tests.kernel.conftest import PODS, AgentFactory, served_by

WEB, PENDING = "10.96.0.10:80", "10.96.0.99:80"
PROTO6, STRICT, MIXED, LATE_BAD, LATE_GOOD = (
    "10.96.0.61",
    "10.96.0.62",
    "10.96.0.64",
    "10.96.0.65",
    "10.96.0.63",
)
EXTERNAL, NOT_ALLOWED = "192.0.2.10", "198.51.100.10"


def service(name: str, ip: str, ports: str, extra: str = "") -> str:
    return (
        f"apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n"
        f"spec: {{clusterIP: {ip}, ports: {ports}{extra}}}\n"
    )


def endpoints(name: str, conditions: str = "{ready: true}") -> str:
    addresses = "".join(
        f'  - {{addresses: ["{ip}"], conditions: {conditions}}}\n' for ip in PODS.values()
    )
    return (
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
        f"metadata: {{name: {name}-1, namespace: default,"
        f" labels: {{kubernetes.io/service-name: {name}}}}}\n"
        f"addressType: IPv4\nports: [{{name: http, protocol: TCP, port: 8080}}]\n"
        f"endpoints:\n{addresses}"
    )


HTTP = "[{name: http, port: 80, targetPort: 8080}]"


def dump(bpffs: Path) -> dict[str, list[str]]:
    """frontend -> its backends, from the pinned maps."""
    done = subprocess.run(
        [sys.executable, "-m", "ebpflb", "maps", "dump", "--json", "--bpffs", str(bpffs)],
        capture_output=True,
        text=True,
        check=True,
    )
    report: dict[str, Any] = json.loads(done.stdout)
    return {s["frontend"]: sorted(b["address"] for b in s["backends"]) for s in report["services"]}


def wait_for(bpffs: Path, frontend: str, backends: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while len(dump(bpffs).get(frontend, [])) != backends:
        assert time.monotonic() < deadline, f"{frontend}: not {backends} backends: {dump(bpffs)}"
        time.sleep(0.2)


def edited(path: Path, text: str) -> None:
    path.write_text(text)
    stamp = time.time_ns() + 10**9  # a different mtime, even within the clock's resolution
    os.utime(path, ns=(stamp, stamp))


def test_bad_files_documents_and_objects_cost_only_themselves(
    topology: Topology,
    cgroup: Cgroup,
    manifests: Path,
    start_agent: AgentFactory,
    bpffs: Path,
) -> None:
    pods = sorted(f"{ip}:8080" for ip in PODS.values())
    (manifests / "random.yaml").write_bytes(b"\xff" + os.urandom(4096))  # never UTF-8
    (manifests / "proto.yaml").write_text(
        service("proto", PROTO6, "[{name: http, port: 80, protocol: 6}]")
        + "---\n"
        + endpoints("proto")
    )
    (manifests / "listy.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: listy}\nspec: [1, 2]\n"
    )
    (manifests / "strict.yaml").write_text(  # "false" is a string: the slice is invalid
        service("strict", STRICT, HTTP) + "---\n" + endpoints("strict", '{ready: "false"}')
    )
    (manifests / "mixed.yaml").write_text(  # its SCTP port is left out, not its TCP port
        service("mixed", MIXED, "[{name: http, port: 80}, {name: sig, port: 3868, protocol: SCTP}]")
        + "---\n"
        + endpoints("mixed")
    )
    agent = start_agent("--manifests", str(manifests))
    maps = dump(bpffs)
    assert maps[f"{WEB}/TCP"] == pods
    assert f"{PROTO6}:80/TCP" not in maps
    assert maps[f"{STRICT}:80/TCP"] == []  # refuses: no valid endpoint
    assert maps[f"{MIXED}:80/TCP"] == pods
    assert set(served_by(topology.requests(topology.node_ns, "tcp", WEB, 30, cgroup))) == set(PODS)
    assert len(served_by(topology.requests(topology.node_ns, "tcp", f"{MIXED}:80", 20, cgroup)))
    refusal = "ECONNREFUSED" if loader.probe_features().set_retval else "EPERM"
    strict = topology.requests(topology.node_ns, "tcp", f"{STRICT}:80", 2, cgroup)
    assert [r.get("error") for r in strict] == [refusal] * 2

    # While running: a bad document, and a good one after it, added to a good file.
    web = manifests / "web.yaml"
    edited(
        web,
        web.read_text()
        + "---\n"
        + service("late-bad", LATE_BAD, "[{name: http, port: 80, protocol: 6}]")
        + "---\n"
        + service("late-good", LATE_GOOD, HTTP)
        + "---\n"
        + endpoints("late-good"),
    )
    wait_for(bpffs, f"{LATE_GOOD}:80/TCP", 3)
    assert f"{LATE_BAD}:80/TCP" not in dump(bpffs)
    late = topology.requests(topology.node_ns, "tcp", f"{LATE_GOOD}:80", 20, cgroup)
    assert len(served_by(late)) >= 2
    # A later edit of another good file is applied: `pending` gets its endpoints.
    dns = manifests / "dns.yaml"
    edited(dns, dns.read_text() + "---\n" + endpoints("pending"))
    wait_for(bpffs, f"{PENDING}/TCP", 3)
    assert len(served_by(topology.requests(topology.node_ns, "tcp", PENDING, 20, cgroup))) >= 2
    assert agent.proc.poll() is None  # still running


def test_external_ips_need_the_allow_list_and_the_pins_are_root_only(
    topology: Topology,
    cgroup: Cgroup,
    manifests: Path,
    start_agent: AgentFactory,
    bpffs: Path,
) -> None:
    (manifests / "ext.yaml").write_text(
        service("ext", "10.96.0.70", HTTP, f", externalIPs: [{EXTERNAL}, {NOT_ALLOWED}]")
        + "---\n"
        + endpoints("ext")
    )
    bpffs.mkdir()
    os.chmod(bpffs, 0o755)  # as an older ebpflb left it
    first = start_agent("--manifests", str(manifests))
    maps = dump(bpffs)
    assert "10.96.0.70:80/TCP" in maps
    assert f"{EXTERNAL}:80/TCP" not in maps and f"{NOT_ALLOWED}:80/TCP" not in maps
    (refused,) = topology.requests(topology.node_ns, "tcp", f"{EXTERNAL}:80", 1, cgroup)
    assert refused["error"] == "ENETUNREACH"  # not translated: no route out of the namespace
    assert stat.S_IMODE(bpffs.stat().st_mode) == 0o700
    pins = list(bpffs.iterdir())
    assert pins and {stat.S_IMODE(p.stat().st_mode) for p in pins} == {0o600}
    first.stop()

    start_agent("--manifests", str(manifests), "--external-ip-cidrs", "192.0.2.0/24")
    maps = dump(bpffs)
    assert len(maps[f"{EXTERNAL}:80/TCP"]) == 3 and f"{NOT_ALLOWED}:80/TCP" not in maps
    served = topology.requests(topology.node_ns, "tcp", f"{EXTERNAL}:80", 30, cgroup)
    assert len(served_by(served)) >= 2


def test_a_pin_directory_of_another_user_is_refused(
    cgroup: Cgroup, manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    """bpffs's root is world-writable: a directory someone else made first could have its
    pins swapped under the agent. It refuses to start and touches nothing there."""
    bpffs.mkdir()
    os.chmod(bpffs, 0o777)  # mkdir's mode is subject to the umask
    os.chown(bpffs, 65534, 65534)
    agent = start_agent("--manifests", str(manifests), wait=False)
    assert agent.proc.wait(timeout=60) == 1
    assert list(bpffs.iterdir()) == [] and bpffs.stat().st_uid == 65534
    assert stat.S_IMODE(bpffs.stat().st_mode) == 0o777
