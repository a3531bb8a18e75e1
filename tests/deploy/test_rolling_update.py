"""The DaemonSet's rolling update on one node, from the previous release
(deploy/previous-release, its image built by `make image-previous` from its own tree) to
this one and back, under traffic.

What the DaemonSet controller does on a node with updateStrategy RollingUpdate and
maxUnavailable 1: it deletes the old pod (SIGTERM, then the pod's grace period) and starts
the new template's pod once the old one is gone (a hostNetwork pod cannot surge: both
would bind the same ports). In between no agent runs, and the datapath keeps serving from
the pinned maps and attached programs. Each pod runs its own release's DaemonSet and
ConfigMap (tests/deploy/nodelab.py).

Through each roll: new TCP connections at a steady rate to the ClusterIP from the node
(socket-LB, in the agent's cgroup) and to the NodePort from the external client (tc), one
NodePort connection held open and pinged, and a Service created while no agent runs. Every
connection must be served and the held one keep its backend; the counts are printed and
recorded (record_property).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ebpflb.datapath.maps import pinlayout
from lab.harness.connload import Load
from tests.deploy.nodelab import (
    NODE,
    NODE_IP,
    NODE_PORT,
    PODS,
    RUNTIME,
    START_TIMEOUT,
    WEB_VIP,
    Lab,
    Release,
    node_lab,
    run,
    served,
)
from tests.factories import endpoint, endpoint_slice, service

pytestmark = pytest.mark.kernel

PREVIOUS, THIS = Release.previous(), Release.this()
RATE = 100.0  # new connections per second, per client: bounded load on a 2-core machine
# How long each client runs: one roll (SIGTERM to the new pod's first sync) took 1.7 to 2.5
# s on the development VM with the programs adopted, and a cold compile adds seconds; the
# test fails rather than let the traffic end before the roll does.
TRAFFIC_SECONDS = 45.0
PING_INTERVAL = 0.25
AFTER_READY = 2.0  # seconds of traffic served by the new pod before the clients stop


@dataclass
class Traffic:
    """The clients of one roll, started before it."""

    clusterip: Load
    nodeport: Load
    held: subprocess.Popen[str]
    held_backend: str
    started: float

    @classmethod
    def start(cls, lab: Lab) -> Traffic:
        started = time.monotonic()
        client = lab.cluster.clients["client"]
        target = f"{NODE_IP}:{NODE_PORT}"
        pings = ["--pings", str(int(TRAFFIC_SECONDS / PING_INTERVAL))]
        pings += ["--interval", str(PING_INTERVAL)]
        held = lab.cluster.spawn(
            client, [sys.executable, "-m", "lab.harness.echo", "tcp-hold", target, *pings]
        )
        assert held.stdout is not None
        backend = json.loads(held.stdout.readline())["connected"]
        return cls(
            clusterip=Load(
                lab.cluster, lab.node_ns, lab.cgroup, f"{WEB_VIP}:80",
                seconds=TRAFFIC_SECONDS, rate=RATE,
            ),
            nodeport=Load(lab.cluster, client, None, target, seconds=TRAFFIC_SECONDS, rate=RATE),
            held=held,
            held_backend=backend,
            started=started,
        )  # fmt: skip

    def check(self, step: str, record_property: Callable[[str, object], None]) -> None:
        """Every connection served, the held one by its first backend throughout."""
        assert time.monotonic() - self.started < TRAFFIC_SECONDS, (
            f"the {step} outlasted the traffic: raise TRAFFIC_SECONDS"
        )
        for name, load in (("clusterip", self.clusterip), ("nodeport", self.nodeport)):
            result = load.result()
            print(
                f"{step} {name}: {result['ok']} of {result['attempted']} new connections served"
                f" in {result['seconds']}s, {result['failed']} failed; by pod {result['servers']}"
            )
            record_property(f"{step}_{name}_connections", result["attempted"])
            record_property(f"{step}_{name}_failed", result["failed"])
            assert result["failed"] == 0, result["failures"]
            assert result["attempted"] > 0 and set(result["servers"]) <= set(PODS)
        out, err = self.held.communicate(timeout=TRAFFIC_SECONDS + 30)
        held: dict[str, Any] = json.loads(out.splitlines()[-1])
        print(f"{step} held connection: {len(held['answers'])} answers, ok={held['ok']}")
        assert held["ok"], (held, err)
        assert set(held["answers"]) == {self.held_backend}


def container_state(container: str) -> str:
    argv = ["podman", "--runtime", RUNTIME, "inspect", "--format", "{{.State.Status}}"]
    return run([*argv, container], check=False).strip()


def wait_until(lab: Lab, container: str, condition: Callable[[], bool], what: str) -> float:
    """Seconds until `condition` holds, the container still running."""
    started = time.monotonic()
    while not condition():
        state = container_state(container)
        if state not in ("running", "created") or time.monotonic() - started > START_TIMEOUT:
            raise AssertionError(f"{container} ({state}): not {what}\n" + lab.logs(container))
        time.sleep(0.2)
    return time.monotonic() - started


def grace_period(release: Release) -> int:
    return int(release.daemonset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])


def roll(lab: Lab, old: str, old_release: Release, new_release: Release) -> str:
    """The controller's step on this node: the old pod gone (SIGTERM, its grace period),
    then the new template's pod started."""
    run(["podman", "--runtime", RUNTIME, "stop", "--time", str(grace_period(old_release)), old])
    return lab.start_agent(new_release)


def agent_programs(lab: Lab) -> tuple[int, int]:
    """The socket-LB programs on the agent's cgroup and the ebpflb tc filters on eth0."""
    tc = lab.in_node(["tc", "filter", "show", "dev", "eth0", "ingress"]).stdout
    return len(lab.cgroup_programs()), sum("ebpflb" in line for line in tc.splitlines())


def created_while_no_agent_runs(lab: Lab, name: str, vip: str) -> str:
    """A Service written to the API between the two pods: the new one must program it."""
    lab.api.create(service(name, cluster_ip=vip))
    slice_ = endpoint_slice(
        f"{name}-1", service_name=name, endpoints=[endpoint("10.244.1.12", node=NODE)]
    )
    lab.api.create(slice_)
    return f"{vip}:80/TCP"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    PREVIOUS.require_image()
    with node_lab(THIS) as lab_:
        yield lab_


def test_rolling_update_to_this_release_and_back_loses_no_connection(
    lab: Lab, record_property: Callable[[str, object], None]
) -> None:
    print(f"rolling {PREVIOUS.version} ({PREVIOUS.image}) -> {THIS.version} ({THIS.image}) -> back")
    first = lab.start_agent(PREVIOUS)
    frontends = {f"{WEB_VIP}:80/TCP"}
    lab.wait_frontends(frontends, first)
    wait_until(lab, first, lambda: lab.http_status("/readyz") == 200, "ready")
    programs = agent_programs(lab)
    assert programs[0] > 0 and programs[1] > 0, programs
    ids = lab.cgroup_programs()
    previous_record = pinlayout.read(lab.bpffs)
    # An ebpflb from before the record (layout 1) neither writes nor reads it.
    previous_layout = previous_record.layout if previous_record else pinlayout.UNVERSIONED
    assert served(lab.clusterip()) == set(PODS)

    # Up: the previous release's pins are this one's layout or older (migrated).
    traffic = Traffic.start(lab)
    time.sleep(1.0)
    rolled = time.monotonic()
    upgraded = roll(lab, first, PREVIOUS, THIS)
    frontends.add(created_while_no_agent_runs(lab, "db", "10.96.0.20"))
    wait_until(lab, upgraded, lambda: lab.http_status("/readyz") == 200, "ready")
    lab.wait_frontends(frontends, upgraded)
    seconds = time.monotonic() - rolled
    time.sleep(AFTER_READY)
    print(f"upgrade: {THIS.version} ready and synced {seconds:.1f}s after the old pod's SIGTERM")
    record_property("upgrade_seconds", round(seconds, 1))
    traffic.check("upgrade", record_property)
    assert pinlayout.read(lab.bpffs) == pinlayout.Record(
        pinlayout.LAYOUT, pinlayout.OLDEST_READER, THIS.version
    )
    status = lab.agent_status()["pin_layout"]
    assert status["found"] == previous_layout and status["layout"] == pinlayout.LAYOUT, status
    assert agent_programs(lab) == programs  # replaced or adopted, never added
    replaced = lab.cgroup_programs() != ids
    print(f"upgrade: socket-LB programs {'replaced' if replaced else 'adopted'}")
    record_property("upgrade_replaced_programs", replaced)

    # Down: what the previous release does with this one's pins follows the record.
    expected = pinlayout.judge(
        pinlayout.Record(pinlayout.LAYOUT, pinlayout.OLDEST_READER, THIS.version),
        True,
        layout=previous_layout,
    )
    traffic = Traffic.start(lab)
    time.sleep(1.0)
    rolled = time.monotonic()
    downgraded = roll(lab, upgraded, THIS, PREVIOUS)
    if expected is pinlayout.Verdict.NEWER_REFUSED:
        # It stays up, unready, and leaves this release's datapath serving.
        wait_until(
            lab,
            downgraded,
            lambda: lab.agent_status()["pin_layout"].get("verdict") == expected.value,
            "refusing the newer pins",
        )
        assert lab.http_status("/readyz") == 503 and lab.http_status("/livez") == 200
    else:
        frontends.add(created_while_no_agent_runs(lab, "cache", "10.96.0.30"))
        wait_until(lab, downgraded, lambda: lab.http_status("/readyz") == 200, "ready")
        lab.wait_frontends(frontends, downgraded)
    seconds = time.monotonic() - rolled
    time.sleep(AFTER_READY)
    print(f"downgrade: {PREVIOUS.version} {expected.value}, {seconds:.1f}s after the SIGTERM")
    record_property("downgrade_seconds", round(seconds, 1))
    traffic.check("downgrade", record_property)
    assert agent_programs(lab) == programs
    if expected is not pinlayout.Verdict.NEWER_REFUSED and previous_record is not None:
        assert pinlayout.read(lab.bpffs) == previous_record
    assert served(lab.clusterip()) == set(PODS)
