"""The cluster the upstream e2e ports run on (issue 24): two nodes, one agent each started
with `--kubeconfig` against ONE fake API server both reach, server pods on both nodes,
client pods, hostNetwork clients and an external client.

Topology (lab.harness.cluster.Cluster): the wire bridge carries the nodes (192.168.100.1
and .2), the external client (.100) and the API server (.254, on the bridge itself: a
thread of this process listening inside the wire namespace, so both agents reach it over
their node's eth0 as a real node reaches its control plane). Behind node1 the server pods
pod11, pod12, pod13 and the client pod client1; behind node2 pod21, pod22 and client2.
Every server pod answers TCP 8080 and 8081, UDP 8080 and 5353 with its name (upstream's
netexec /hostname).

Clients as upstream's: a pod client runs in its pod's namespace inside its node's test
cgroup (so that node's socket-LB applies, as to a pod's container); a hostNetwork client in
the node's namespace and cgroup; the external client on the wire, outside any cgroup.

Two datapaths serve pod clients (`PATHS`): socket-LB (the cluster above) and the per-packet
path (issue 23): a second cluster whose agents also get `--pod-interfaces` naming the pods'
host-side links (`p<pod>`) and `--socket-lb=hostns-only`, the setting for meshes and VMs:
its pod clients are inside the agent's cgroup as on the first, yet the socket hooks leave
them alone (another network namespace than the agent's), so the tc programs on their links
translate every packet. hostNetwork and external clients are the same on both: the
per-packet cluster serves only pod-client tests. A kernel without SO_NETNS_COOKIE (before
5.14: the 5.10 guest) refuses hostns-only, so there the per-packet cluster keeps
`--socket-lb=all` and its pod clients run outside the agents' cgroups (pods whose cgroups
the socket programs are not attached to): the same tc programs translate their packets.

Each test builds its Services with names, ClusterIPs and nodePorts of its own
(`E2E.allocate`) and `E2E` deletes what the test created when it ends: one cluster and one
pair of agents serve the whole package.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ebpflb.datapath.maps import dump
from ebpflb.datapath.maps.kernel import KernelMapSet
from ebpflb.datapath.programs.loader import netns_cookie_available, probe_features
from lab.harness.agentproc import TIMEOUT_SCALE, AgentProcess, cleanup_datapath
from lab.harness.cluster import Cluster
from lab.harness.fakeapi import FakeApiServer
from lab.harness.netns import Cgroup, Pod, sh
from lab.harness.nshttp import thread_in_netns
from tests.factories import endpoint
from tests.kernel.twonode import NodeAgent

API_IP = "192.168.100.254"
NODE_IPS = {"node1": "192.168.100.1", "node2": "192.168.100.2"}
SERVERS = {"node1": {"pod11": 11, "pod12": 12, "pod13": 13}, "node2": {"pod21": 21, "pod22": 22}}
CLIENTS = {"node1": ("client1", 101), "node2": ("client2", 102)}
POD_NODE = {pod: node for node, pods in SERVERS.items() for pod in pods}
POD_IPS = {
    pod: f"10.244.{node[-1]}.{host}" for node, pods in SERVERS.items() for pod, host in pods.items()
}
CLIENT_IPS = {name: f"10.244.{node[-1]}.{host}" for node, (name, host) in CLIENTS.items()}
TCP_PORTS, UDP_PORTS = (8080, 8081), (8080, 5353)
HEALTHZ_PORT, METRICS_PORT = 10256, 10249  # kube-proxy's defaults
EXTERNAL_IP_CIDR = "203.0.113.0/24"  # TEST-NET-3, assigned to no node
SOCKET_LB, PER_PACKET = "socket-lb", "per-packet"
PATHS = (SOCKET_LB, PER_PACKET)
POD_LINKS = "p*"  # the pods' host-side links (Cluster.add_pod: p<name>); nothing else in a node
Result = dict[str, Any]


@dataclass
class Shared:
    """What the package's tests share: the cluster, the API server, the agents."""

    cluster: Cluster
    api: FakeApiServer
    path: str  # which datapath serves its pod clients: SOCKET_LB or PER_PACKET
    nodes: dict[str, NodeAgent] = field(default_factory=dict)
    agent_args: dict[str, list[str]] = field(default_factory=dict)  # to restart one
    logs: dict[str, Path] = field(default_factory=dict)
    pods: dict[str, Pod] = field(default_factory=dict)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    # Whether pod clients run inside their node's agent cgroup (all but the per-packet
    # cluster on a kernel that refuses hostns-only, module docstring).
    pods_in_agent_cgroup: bool = True

    @property
    def refusal(self) -> str:
        """What a pod's connect() to a Service without endpoints fails with: upstream's
        REJECT (ECONNREFUSED), but EPERM where the socket hooks serve the pod on a kernel
        without bpf_set_retval (before 5.18: a connect hook can refuse, not choose the
        errno; docs/kernels.md). Either way at once, never a timeout."""
        socket_lb_serves_pods = self.path == SOCKET_LB
        if socket_lb_serves_pods and not probe_features().set_retval:
            return "EPERM"
        return "ECONNREFUSED"

    def pod_cgroup(self, node: str) -> Cgroup | None:
        """The cgroup `node`'s pod clients run in."""
        return self.nodes[node].cgroup if self.pods_in_agent_cgroup else None

    def agent(self, node: str) -> AgentProcess:
        agent = self.nodes[node].agent
        assert agent is not None
        return agent


@contextlib.contextmanager
def shared_cluster(tmp: Path, *agent_args: str, path: str = SOCKET_LB) -> Iterator[Shared]:
    """The cluster, its API server and both agents (`agent_args` added to each; with
    `path` PER_PACKET, --pod-interfaces on the pods' links and --socket-lb=hostns-only
    where the kernel allows it, else no pod interfaces: the agent's default names common
    CNIs' links); all of it removed on exit, also on failure."""
    assert path in PATHS, path
    hostns_only = netns_cookie_available()
    if path == PER_PACKET:
        agent_args = (*agent_args, f"--pod-interfaces={POD_LINKS}")
        if hostns_only:
            agent_args = (*agent_args, "--socket-lb=hostns-only")
    else:
        agent_args = (*agent_args, "--pod-interfaces=")
    cluster = Cluster.create()
    shared: Shared | None = None
    api = FakeApiServer(host=API_IP)
    try:
        sh("ip", "-n", cluster.wire_ns, "addr", "add", f"{API_IP}/24", "dev", "br0")
        with thread_in_netns(cluster.wire_ns):  # its threads inherit the wire namespace
            api.start()
        shared = Shared(cluster, api, path, pods_in_agent_cgroup=path == SOCKET_LB or hostns_only)
        for node, pods in SERVERS.items():
            for name, host in pods.items():
                pod = cluster.add_pod(node, name, host)
                shared.pods[name] = pod
                # Outlive the package's tests: 15 minutes, scaled under emulation.
                cluster.start_server(
                    pod, tcp=TCP_PORTS, udp=UDP_PORTS, lifetime=900 * TIMEOUT_SCALE
                )
            name, host = CLIENTS[node]
            shared.pods[name] = cluster.add_pod(node, name, host)
        kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
        for node_name, node in cluster.nodes.items():
            tag = uuid.uuid4().hex[:6]
            agent = NodeAgent(
                node_name,
                node.netns,
                Path(f"/sys/fs/bpf/ebpflb-test-{tag}"),
                Cgroup.create(f"ebpflb-test-{tag}"),
                tmp,  # unused: the API is the source
            )
            shared.nodes[node_name] = agent
            shared.agent_args[node_name] = [
                "--kubeconfig",
                str(kubeconfig),
                "--bpffs",
                str(agent.bpffs),
                "--cgroup",
                str(agent.cgroup.path),
                "--interfaces",
                "eth0",
                "--node-name",
                node_name,
                "--min-sync-period",
                "0.1",
                # kube-proxy's own ports, as upstream's URL checks reach them: inside
                # the node's namespace, so never the machine's.
                f"--healthz-bind-address=0.0.0.0:{HEALTHZ_PORT}",
                f"--metrics-bind-address=127.0.0.1:{METRICS_PORT}",
                # CVE-2020-8554: none by default; upstream's external IP test's range
                f"--external-ip-cidrs={EXTERNAL_IP_CIDR}",
                *agent_args,
            ]
            shared.logs[node_name] = tmp / f"{path}-{node_name}-agent.log"
            agent.agent = AgentProcess(
                shared.agent_args[node_name], netns=node.netns, log_file=shared.logs[node_name]
            )
        for agent in shared.nodes.values():
            assert agent.agent is not None
            agent.agent.wait_ready()
        yield shared
    finally:
        for agent in shared.nodes.values() if shared else ():
            if agent.agent is not None:
                agent.agent.stop()
            # The pods' links go with the cluster's namespaces; their filters named anyway.
            links = ["eth0", *(f"p{pod}"[:15] for pod in cluster.nodes[agent.name].pods)]
            cleanup_datapath(agent.bpffs, agent.cgroup.path, links, agent.netns)
            agent.cgroup.close()
        api.close()
        cluster.close()


def restart_agent(shared: Shared, node: str) -> None:
    """Stop `node`'s agent and start it again with the same flags (its pins, programs
    and maps stay: the new one adopts them), until it is ready."""
    agent = shared.nodes[node]
    old = shared.agent(node)
    assert old.stop() == 0, "the agent did not exit cleanly"
    agent.agent = AgentProcess(
        shared.agent_args[node], netns=agent.netns, log_file=shared.logs[node]
    )
    agent.agent.wait_ready()


@dataclass(frozen=True)
class Allocation:
    """A test's own Service name, ClusterIP and nodePorts (never reused in the package)."""

    name: str
    cluster_ip: str
    node_ports: tuple[int, ...]

    def ip(self, index: int) -> str:
        """Further ClusterIPs of the same allocation (up and down services: three)."""
        base, _, last = self.cluster_ip.rpartition(".")
        return f"{base}.{int(last) + index}"


class E2E:
    """One test's view of the shared cluster: builders, clients, and clean-up."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.path = shared.path
        self.api = shared.api
        self._created: list[tuple[str, str]] = []  # (kind, name), deleted at the end

    # ---- the API -------------------------------------------------------------------------

    def allocate(self, prefix: str) -> Allocation:
        """A name, 4 ClusterIPs (10.96.<id>.1-4) and 4 nodePorts (30000 + 4 * id + 0..3)."""
        n = next(self.shared.ids)
        assert n < 250, "more allocations than the package's address plan"
        return Allocation(
            f"{prefix}-{n}", f"10.96.{n}.1", tuple(30000 + 4 * n + i for i in range(4))
        )

    def apply(self, *objects: dict[str, Any]) -> None:
        for obj in objects:
            self.api.apply(obj)
            key = (str(obj["kind"]), str(obj["metadata"]["name"]))
            if key not in self._created:
                self._created.append(key)

    def delete(self, kind: str, name: str) -> None:
        self.api.delete(kind, "default", name)
        self._created.remove((kind, name))

    def close(self) -> None:
        for kind, name in reversed(self._created):
            if self.api.get(kind, "default", name) is not None:
                self.api.delete(kind, "default", name)
        self._created.clear()

    # ---- clients -------------------------------------------------------------------------

    def from_pod(
        self, client: str, mode: str, target: str, count: int = 1, *extra: str, timeout: float = 1.0
    ) -> list[Result]:
        """`count` requests from pod `client` (client1 on node1, client2 on node2, or a
        server pod: a pod reaching its own Service), in its node's pod cgroup
        (`Shared.pod_cgroup`)."""
        clients = {name: node for node, (name, _) in CLIENTS.items()}
        node = clients.get(client) or POD_NODE[client]
        cgroup = self.shared.pod_cgroup(node)
        return self.shared.cluster.requests(
            self.shared.pods[client].netns, mode, target, count, cgroup, *extra, timeout=timeout
        )

    def from_host(
        self, node: str, mode: str, target: str, count: int = 1, *extra: str, timeout: float = 1.0
    ) -> list[Result]:
        """`count` requests from a hostNetwork client of `node`."""
        agent = self.shared.nodes[node]
        return self.shared.cluster.requests(
            agent.netns, mode, target, count, agent.cgroup, *extra, timeout=timeout
        )

    def from_outside(
        self, mode: str, target: str, count: int = 1, *extra: str, timeout: float = 1.0
    ) -> list[Result]:
        """`count` requests from the external client on the wire."""
        client = self.shared.cluster.clients["client"]
        return self.shared.cluster.requests(
            client, mode, target, count, None, *extra, timeout=timeout
        )


def slice_for(
    service: str,
    pods: Sequence[str],
    ports: Sequence[dict[str, Any]] = ({"name": "http", "protocol": "TCP", "port": 8080},),
    *,
    suffix: str = "1",
    ready: bool = True,
    serving: bool | None = None,
    terminating: bool | None = None,
) -> dict[str, Any]:
    """An EndpointSlice of `service` holding these server pods (on their nodes), all with
    the given conditions, as the EndpointSlice controller writes them."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-{suffix}",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": [dict(p) for p in ports],
        "endpoints": [endpoint(POD_IPS[p], ready, serving, terminating, POD_NODE[p]) for p in pods],
    }


def served(results: Sequence[Result]) -> set[str]:
    """Which server pods answered; every request must have succeeded."""
    failed = [r for r in results if not r["ok"]]
    assert not failed, failed[:3]
    return {str(r["server"]) for r in results}


def errors(results: Sequence[Result]) -> set[str]:
    """The error of each request ("ok" for one that succeeded)."""
    return {str(r.get("error", "ok")) for r in results}


def eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> float:
    """Poll `check` (typically a request) until it holds; the seconds it took. Upstream's
    windows are limits (e.g. 30 s for a protocol's removal), never waits."""
    started = time.monotonic()
    deadline = started + timeout * TIMEOUT_SCALE
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not {what} within {timeout * TIMEOUT_SCALE:.0f}s")
        time.sleep(0.1)
    return time.monotonic() - started


def answers(results: Sequence[Result]) -> list[str]:
    """The answering pod, or the error, of each request in order."""
    return [str(r["server"]) if r["ok"] else str(r["error"]) for r in results]


def wait_flagged(e2e: E2E, frontend: str, flag: str, nodes: Sequence[str]) -> None:
    """Until every backend of `frontend` ("VIP:PORT/PROTO") carries `flag` in the maps of
    each of `nodes`: the agents have programmed an endpoint-condition change that leaves
    the backend set as it was (e.g. ready -> terminating), so traffic checked afterwards
    checks the new state."""
    for node in nodes:
        with KernelMapSet(e2e.shared.nodes[node].bpffs) as maps:

            def flagged() -> bool:
                found = [s for s in dump.collect(maps)["services"] if s["frontend"] == frontend]
                backends = [b for s in found for b in s["backends"]]
                return bool(backends) and all(flag in b.get("flags", ()) for b in backends)

            eventually(flagged, f"{frontend} {flag} on {node}", timeout=10)


def wait_programmed(e2e: E2E, frontend: str, nodes: Sequence[str], timeout: float = 30) -> None:
    """Until `frontend` ("VIP:PORT/PROTO") has backends in the maps of each of `nodes`: for
    a test whose clients cannot retry (one long connection) or whose server takes a single
    one."""
    for node in nodes:
        with KernelMapSet(e2e.shared.nodes[node].bpffs) as maps:

            def programmed() -> bool:
                found = [s for s in dump.collect(maps)["services"] if s["frontend"] == frontend]
                return any(s["backends"] for s in found)

            eventually(programmed, f"{frontend} programmed on {node}", timeout=timeout)
