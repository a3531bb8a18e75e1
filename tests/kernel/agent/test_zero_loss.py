"""Zero loss under bounded continuous load: a client in the node namespace opens new TCP
connections to a ClusterIP at a steady rate (lab.harness.connload) while the agent is
restarted, while a Service's endpoints roll over to new pods (each old pod stopped once
the maps no longer name it), and while the API server is unreachable for 10 seconds.
Every connection must be served: one failure fails the test. The counts are printed and
recorded (record_property).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.harness.agentproc import TIMEOUT_SCALE, AgentProcess
from lab.harness.connload import Load
from lab.harness.fakeapi import FakeApiServer, Request
from lab.harness.netns import Cgroup, Topology
from tests.factories import endpoint, endpoint_slice, service
from tests.kernel.conftest import PODS, AgentFactory, wait_backends

WEB = "10.96.0.10:80"
RATE = 300.0  # new connections per second: bounded load on a shared 2-core machine


def check(
    name: str, result: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    """Print and record the counts; fail on any lost connection."""
    print(
        f"{name}: {result['ok']} of {result['attempted']} new connections served,"
        f" {result['failed']} failed in {result['seconds']}s; by backend {result['servers']}"
    )
    record_property(f"{name}_connections", result["attempted"])
    record_property(f"{name}_failed", result["failed"])
    assert result["failed"] == 0, result["failures"]
    # The load kept (at least half) its pace: under emulation (TIMEOUT_SCALE) it cannot.
    assert result["ok"] == result["attempted"] >= RATE * result["seconds"] * 0.5 / TIMEOUT_SCALE


def test_restart_loses_no_connection(
    topology: Topology,
    cgroup: Cgroup,
    manifests: Path,
    start_agent: AgentFactory,
    record_property: Callable[[str, object], None],
) -> None:
    first = start_agent("--manifests", str(manifests))
    load = Load(topology, topology.node_ns, cgroup, WEB, seconds=8, rate=RATE)
    time.sleep(1.0)
    assert first.stop() == 0
    second = start_agent("--manifests", str(manifests))
    restarted = second.status()
    result = load.result()
    check("restart", result, record_property)
    assert set(result["servers"]) == set(PODS)
    sync = restarted["sync"]["first"]
    assert (sync["added"], sync["updated"], sync["removed"]) == (0, 0, 0)


def churn_manifest(hosts: list[int]) -> str:
    endpoints = "".join(
        f'  - addresses: ["10.244.2.{h}"]\n    conditions: {{ready: true}}\n' for h in hosts
    )
    return (
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\n"
        "spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80, targetPort: 8080}]}\n"
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
        "metadata:\n  name: web-abc12\n  namespace: default\n"
        "  labels: {kubernetes.io/service-name: web}\n"
        "addressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n" + endpoints
    )


def test_rolling_endpoint_churn_loses_no_connection(
    topology: Topology,
    cgroup: Cgroup,
    manifests: Path,
    start_agent: AgentFactory,
    bpffs: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """A rolling update of web: each step adds a new pod, removes the oldest from the
    EndpointSlice, and stops that pod 0.3 s after the maps stopped naming it."""
    servers = {}
    for h in range(1, 7):
        pod = topology.add_pod(f"roll{h}", f"10.244.2.{h}")
        servers[h] = topology.start_server(pod, tcp=[8080], lifetime=120)
    web = manifests / "web.yaml"
    web.write_text(churn_manifest([1, 2, 3]))
    start_agent("--manifests", str(manifests))
    frontend = f"{WEB}/TCP"
    # Long enough to span the whole rollout, which takes minutes under emulation (each step
    # waits for the pinned maps through `maps dump`).
    seconds = 10 * min(TIMEOUT_SCALE, 4)
    load = Load(topology, topology.node_ns, cgroup, WEB, seconds=seconds, rate=RATE)
    time.sleep(0.5)
    live = [1, 2, 3]
    for new in (4, 5, 6):
        live.append(new)
        web.write_text(churn_manifest(live))
        wait_backends(bpffs, frontend, {f"10.244.2.{h}:8080" for h in live})
        old = live.pop(0)
        web.write_text(churn_manifest(live))
        wait_backends(bpffs, frontend, {f"10.244.2.{h}:8080" for h in live})
        time.sleep(0.3)  # the pod's grace period: replies in flight go out
        servers[old].kill()
        servers[old].wait(timeout=5)
    result = load.result()
    check("churn", result, record_property)
    served = set(result["servers"])
    # It did roll during the load: the first pod served, and so did pods of the rollout.
    assert "roll1" in served and served & {"roll4", "roll5", "roll6"}, served


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    try:
        yield server
    finally:
        server.close()


def test_ten_second_api_outage_loses_no_connection(
    topology: Topology,
    cgroup: Cgroup,
    api: FakeApiServer,
    start_agent: AgentFactory,
    bpffs: Path,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """Every request to the API server fails (503) for 10 s and the open watches are cut;
    a change made meanwhile is applied once it answers again."""
    api.create(service("web"))
    api.create(endpoint_slice("web-1"))
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    agent: AgentProcess = start_agent("--kubeconfig", str(kubeconfig))
    outage = threading.Event()

    def down(_request: Request) -> bool:
        return outage.is_set()

    api.fail_next(10**9, status=503, when=down)
    load = Load(topology, topology.node_ns, cgroup, WEB, seconds=13, rate=RATE)
    time.sleep(1.0)
    outage.set()
    api.drop_watches()
    requests_before = len(api.requests)
    api.update(
        endpoint_slice("web-1", endpoints=[endpoint("10.244.1.11"), endpoint("10.244.1.12")])
    )
    time.sleep(10.0)
    outage.clear()
    refused = len(api.requests) - requests_before  # every one answered 503
    wait_backends(bpffs, f"{WEB}/TCP", {"10.244.1.11:8080", "10.244.1.12:8080"}, timeout=15)
    result = load.result()
    check("api_outage", result, record_property)
    print(f"api_outage: {refused} API requests refused during the outage")
    record_property("api_outage_requests_refused", refused)
    assert refused >= 2  # the agent did try, and was refused
    assert agent.proc.poll() is None
    assert agent.get("healthz", "/readyz")[0] == 200
