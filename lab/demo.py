"""`make demo`: ClusterIP traffic balanced by the real eBPF programs, in namespaces.

Builds a node namespace and three pod namespaces running tiny TCP/UDP servers, starts
`ebpflb run` on examples/, sends requests to the ClusterIPs from a client in the node
namespace (inside a cgroup of its own, where the programs are attached), prints how they
spread and the `maps dump` table, and removes everything again, also on Ctrl-C.
"""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path
from typing import Any

from lab.harness.agentproc import AgentProcess, cleanup_datapath
from lab.harness.netns import Cgroup, Topology

ROOT = Path(__file__).resolve().parents[1]
PODS = {"pod1": "10.244.1.11", "pod2": "10.244.1.12", "pod3": "10.244.1.13"}
BPFFS = Path("/sys/fs/bpf/ebpflb-demo")


def _spread(title: str, results: list[dict[str, object]]) -> None:
    ok = [r for r in results if r["ok"]]
    by_server = collections.Counter(str(r["server"]) for r in ok)
    peers = sorted({str(r["peer"]) for r in ok})
    seen = f"; the client saw its peer as {', '.join(peers)}" if peers else ""
    print(f"\n{title}: {len(ok)}/{len(results)} answered{seen}")
    for server, count in sorted(by_server.items()):
        share = count / len(ok)
        print(f"  {server} ({PODS[server]})  {count:4d}  {share:6.1%}  {'#' * round(share * 60)}")
    failed = collections.Counter(str(r.get("error")) for r in results if not r["ok"])
    for error, count in failed.items():
        print(f"  failed: {count} x {error}")


def _startup(status: dict[str, Any]) -> str:
    """The agent's start-up, from its /status."""
    phases, lists, first = status["phases"], status["lists"], status["sync"]["first"]
    return (
        f"agent: ready {phases['first_sync']:.2f}s after it started: socket-LB compiled in"
        f" {status['compile_seconds']['socket_lb']:.2f}s;"
        f" {lists['Service']['objects']} Services and {lists['EndpointSlice']['objects']}"
        f" EndpointSlices read from examples/; first sync programmed {first['frontends']}"
        f" frontends in {first['duration_s'] * 1000:.1f} ms"
    )


def main() -> int:
    topo: Topology | None = None
    cgroup: Cgroup | None = None
    agent: AgentProcess | None = None
    try:
        topo = Topology.create("ebpflb-demo")
        cgroup = Cgroup.create("ebpflb-demo")
        for name, ip in PODS.items():
            topo.start_server(topo.add_pod(name, ip), tcp=[8080], udp=[5353], lifetime=600)
        pods = ", ".join(PODS.values())
        print(f"topology: node namespace {topo.node_ns} ({topo.node_ip}), pods {pods}")
        agent = AgentProcess(
            [
                "--manifests",
                str(ROOT / "examples"),
                "--bpffs",
                str(BPFFS),
                "--cgroup",
                str(cgroup.path),
            ]
        )
        agent.wait_ready()
        print(_startup(agent.status()))

        _spread(
            "TCP  10.96.0.10:80 (default/web:http)",
            topo.requests(topo.node_ns, "tcp", "10.96.0.10:80", 300, cgroup),
        )
        _spread(
            "UDP  10.96.0.53:53 (kube-system/dns:dns, one socket per query)",
            topo.requests(topo.node_ns, "udp", "10.96.0.53:53", 90, cgroup),
        )
        _spread(
            "TCP  10.96.0.99:80 (default/pending:http, no endpoints)",
            topo.requests(topo.node_ns, "tcp", "10.96.0.99:80", 3, cgroup),
        )

        print("\n$ ebpflb maps dump")
        sys.stdout.flush()
        subprocess.run(
            [sys.executable, "-m", "ebpflb", "maps", "dump", "--bpffs", str(BPFFS)], check=True
        )
        return 0
    except KeyboardInterrupt:
        print("\ninterrupted: tearing down")
        return 130
    finally:
        if agent is not None:
            agent.stop()
        if cgroup is not None:
            cleanup_datapath(BPFFS, cgroup.path)
            cgroup.close()
        if topo is not None:
            topo.close()


if __name__ == "__main__":
    sys.exit(main())
