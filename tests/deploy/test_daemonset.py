"""deploy/base/daemonset.yaml, run from its own YAML with podman from the image `make image`
builds, on a node made of test namespaces (tests/deploy/nodelab.py says what is read from
the YAML and what the test changes).

The tests run in order, as the README's "Install on a cluster" commands do: the init
container removes kube-proxy's rules, the agent syncs and serves ClusterIP and NodePort,
its readiness endpoint answers, an upgrade (stop, start a new container) keeps traffic
flowing and the new agent adopts the datapath, the roll-back cleanup leaves nothing; and a
run missing a capability names it. The rolling update from the previous release and back
is tests/deploy/test_rolling_update.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from lab.bench.kubeproxy import iptables
from lab.bench.scenario import bench_services
from tests.deploy.nodelab import (
    NODE,
    PODS,
    RUNTIME,
    WEB_VIP,
    Lab,
    Release,
    node_lab,
    run,
    served,
    wait_served,
    web_objects,
)
from tests.factories import endpoint, endpoint_slice, service

pytestmark = pytest.mark.kernel

FOREIGN_RULE = "-A POSTROUTING -s 10.99.0.0/16 -j MASQUERADE"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with node_lab(Release.this()) as lab_:
        yield lab_


def test_init_container_removes_kube_proxys_rules(lab: Lab) -> None:
    """A node kube-proxy ran on (its iptables-legacy ruleset) with a rule of someone else's."""
    for argv in iptables.setup_argv("iptables-legacy"):
        assert lab.in_node(argv).returncode == 0
    rules = iptables.full_sync(bench_services(2, 2), nfacct=False)
    done = subprocess.run(
        [
            "nsenter",
            f"--net=/run/netns/{lab.node_ns}",
            "iptables-legacy-restore",
            *iptables.RESTORE_FLAGS,
        ],
        input=rules,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert lab.in_node(["iptables-legacy", "-t", "nat", *FOREIGN_RULE.split()]).returncode == 0
    assert "KUBE-SVC-" in lab.in_node(["iptables-legacy-save"]).stdout

    init = lab.pod("kube-proxy-cleanup")
    done = lab.podman(init, detach=False, extra_args=[])
    assert done.returncode == 0, done.stderr
    assert "removed kube-proxy's iptables-legacy:" in done.stdout
    saved = lab.in_node(["iptables-legacy-save"]).stdout
    assert "KUBE-SVC-" not in saved and "KUBE-SERVICES" not in saved
    assert FOREIGN_RULE in saved


def test_agent_syncs_and_serves_clusterip_and_nodeport(lab: Lab) -> None:
    container = lab.start_agent()
    lab.wait_frontends({f"{WEB_VIP}:80/TCP"}, container)
    assert served(lab.clusterip()) == set(PODS)
    assert served(lab.nodeport()) <= set(PODS)
    # connect, sendmsg, recvmsg and getpeername, for IPv4 and for IPv6
    assert len(lab.cgroup_programs()) == 8
    # Compiled with the image's header tree: the pod mounts none of the node's. The
    # per-packet pod path is on by default (--pod-interfaces), so it is compiled too.
    headers = lab.agent_status()["programs"]["headers"]
    assert set(headers) == {"socket_lb", "nodeport", "pod"}, headers
    assert all(h.startswith("bundled /usr/share/ebpflb/kernel-headers (") for h in headers.values())
    # Changes through the API reach the node (the watch, not only the first list).
    api_objects = web_objects()
    api_objects[1]["endpoints"] = api_objects[1]["endpoints"][:1]
    lab.api.update(api_objects[1])
    wait_served(lab, {"pod11"}, container)
    lab.api.update(web_objects()[1])
    wait_served(lab, set(PODS), container)


def test_readiness_and_liveness_endpoints_answer_after_the_first_sync(lab: Lab) -> None:
    """The probes' endpoints (kube-proxy's health port). Needs the agent's health server
    (`--healthz-bind-address`, default 0.0.0.0:10256)."""
    assert lab.http_status("/readyz") == 200
    assert lab.http_status("/livez") == 200
    assert lab.http_status("/healthz") == 200


def test_a_pods_connected_udp_socket_leaves_a_removed_backend(lab: Lab) -> None:
    """The pod has no hostPID, so the agent's /proc shows none of the pods' processes: it
    finds a pod's connected UDP socket through the runtime's namespace mounts the DaemonSet
    mounts (/var/run/netns; the test's pods are `ip netns` ones, kept there) and destroys
    it when its backend leaves, so the client's next socket reaches a live one."""
    client = lab.cluster.add_pod(NODE, "udp-client", 30)
    ports = [{"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 5353}]
    slice_ports = [{"name": "dns", "protocol": "UDP", "port": 5353}]
    addresses = {name: f"10.244.1.{host}" for name, host in PODS.items()}

    def dns_slice(pods: list[str]) -> dict[str, Any]:
        endpoints = [endpoint(addresses[p], node=NODE) for p in pods]
        return endpoint_slice("dns-1", "dns", endpoints=endpoints, ports=slice_ports)

    lab.api.create(service("dns", cluster_ip="10.96.0.53", ports=ports))
    lab.api.create(dns_slice(sorted(PODS)))
    container = lab.containers[-1]
    lab.wait_frontends({"10.96.0.53:53/UDP"}, container)
    pings = ["--pings", "40", "--interval", "0.25", "--timeout", "0.5"]
    argv = [sys.executable, "-m", "lab.harness.echo", "udp-hold", "10.96.0.53:53", *pings]
    held = lab.cluster.spawn(client.netns, argv, lab.cgroup)
    try:
        assert held.stdout is not None
        first = json.loads(held.stdout.readline())["connected"]
        lab.api.update(dns_slice([p for p in sorted(PODS) if p != first]))
        out, err = held.communicate(timeout=60)
    finally:
        if held.poll() is None:
            held.kill()
    result = json.loads(out.splitlines()[-1])
    (other,) = set(PODS) - {first}
    # Destroyed once (the next call fails: ECONNABORTED, or EDESTADDRREQ once the socket
    # is disconnected), then a new socket answered by the pod that stayed.
    assert result["sockets"] == 2, (result, err)
    assert {"ECONNABORTED", "EDESTADDRREQ"} & set(result["answers"]), result
    assert result["answers"][-1] == other, result


def test_upgrade_keeps_traffic_flowing_and_adopts_the_datapath(lab: Lab) -> None:
    old = lab.containers[-1]
    before = lab.cgroup_programs()
    run(["podman", "--runtime", RUNTIME, "stop", "--time", "30", old])
    # No agent: the datapath stays (programs attached, maps pinned).
    assert lab.cgroup_programs() == before
    assert served(lab.clusterip()) == set(PODS)
    assert served(lab.nodeport()) <= set(PODS)

    new = lab.start_agent()
    lab.api.create(service("db", cluster_ip="10.96.0.20"))
    lab.api.create(
        endpoint_slice("db-1", service_name="db", endpoints=[endpoint("10.244.1.12", node=NODE)])
    )
    lab.wait_frontends({f"{WEB_VIP}:80/TCP", "10.96.0.20:80/TCP"}, new)
    # The same image builds the same programs: the new agent adopted the pinned ones (the
    # very program ids stay attached; nothing compiled, nothing replaced).
    assert lab.cgroup_programs() == before
    assert served(lab.clusterip()) == set(PODS)


def test_roll_back_cleanup_leaves_nothing(lab: Lab) -> None:
    agent = lab.containers[-1]
    run_ = lab.pod("ebpflb")
    # README: `kubectl exec` into each agent pod, `ebpflb cleanup --force` with the pod's
    # config (--force: the pod's own agent holds the pins until the DaemonSet is deleted).
    argv = [
        "ebpflb",
        "cleanup",
        "--force",
        "--config",
        "/etc/ebpflb/config.yaml",
        *lab.agent_overrides(run_),
    ]
    out = run(["podman", "--runtime", RUNTIME, "exec", agent, *argv])
    assert "detached" in out
    run(["podman", "--runtime", RUNTIME, "rm", "--force", "--time", "30", agent])
    assert lab.cgroup_programs() == []
    assert not lab.bpffs.exists()
    tc = lab.in_node(["tc", "filter", "show", "dev", "eth0", "ingress"]).stdout
    assert "ebpflb" not in tc
    (result,) = lab.clusterip(1)
    assert result["error"] == "ENETUNREACH"  # no longer translated: dies in the namespace


def test_a_missing_capability_is_named_at_start(lab: Lab) -> None:
    agent = lab.pod("ebpflb")
    without = [c for c in agent.cap_add if c != "NET_ADMIN"]
    done = lab.podman(agent, detach=False, extra_args=lab.agent_overrides(agent), cap_add=without)
    assert done.returncode == 1
    assert "missing capability CAP_NET_ADMIN" in done.stderr
    assert "Traceback" not in done.stderr


# Issue 25's goal for the image, the bundled kernel headers included.
IMAGE_GOAL_MB = 600


def test_the_image_is_within_its_size_goal(lab: Lab) -> None:
    """Nothing the agent does not use: `make image` prints where the size goes."""
    size = int(run(["podman", "image", "inspect", "--format", "{{.Size}}", lab.image]))
    assert size <= IMAGE_GOAL_MB * 1_000_000, f"{lab.image} is {size / 1e6:.0f} MB"
    present = run(
        [
            "podman", "run", "--rm", "--network=none", "--runtime", RUNTIME,
            "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
            "--entrypoint", "/opt/ebpflb/bin/python", lab.image, "-c",
            "import importlib.util as u; print(sorted(m for m in ('aiohttp', 'kubernetes.aio',"
            " 'numba', 'llvmlite', 'matplotlib', 'lab') if u.find_spec(m)))",
        ]
    )  # fmt: skip
    assert present.strip() == "[]"
