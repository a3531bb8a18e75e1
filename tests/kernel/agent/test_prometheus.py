"""deploy/monitoring/ against a real Prometheus (Debian's `prometheus`, started here on a free
port of 127.0.0.1, its storage in a temporary directory) scraping a real agent every second,
with the alert rules loaded (the PrometheusRule's `spec`, as tests.monitoring writes it).

What "each expression finds its series" means here, so that a renamed metric or label
fails:

- a dashboard query is a graph: queried as it is (Grafana's variables given every agent
  and service, a one-minute rate window), it must return at least one series;
- an alert's expression is a condition, empty on a healthy agent by design (`up == 0`, a
  fill ratio above 0.9): each of its selectors (`ebpflb_map_fill_ratio{job="ebpflb"}`,
  ranges dropped) is queried on its own and must return a series. Prometheus also
  evaluates every rule, each of which must report health "ok", and the two conditions this
  agent is made to meet are active (pending: their `for` is minutes).

The agent is made to produce the series that appear only on an event: traffic through the
socket-LB (per-service counters moving), a Service over --max-backends (a failed frontend:
map errors, failing syncs), and a map entry deleted behind its back (drift repaired at the
next full resync, every 2 s here)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import yaml

from ebpflb.datapath.maps.kernel import KernelMapSet
from ebpflb.model import Frontend, Proto
from lab.harness.agentproc import TIMEOUT_SCALE
from lab.harness.netns import Cgroup, Topology
from lab.harness.nshttp import free_ports, http_get
from tests.kernel.conftest import AgentFactory, served_by, wait_until
from tests.kernel.datapath.test_capacity import big_service
from tests.monitoring import (
    JOB,
    agent_catalogue,
    alerts,
    dashboard,
    dashboard_queries,
    parse,
    substitute,
    variable_queries,
    write_rule_file,
)

pytestmark = pytest.mark.kernel

WEB = "10.96.0.10:80"
DNS = "10.96.0.53:53"
# examples/dns.yaml's Service without endpoints: deleting its entry costs no traffic.
PENDING = Frontend(IPv4Address("10.96.0.99"), 80, Proto.TCP)
WAIT = 60.0  # seconds (times TIMEOUT_SCALE) for each wait on Prometheus


class Prometheus:
    """One Prometheus process on 127.0.0.1:`port`; stop() ends it (by its PID)."""

    def __init__(self, binary: str, workdir: Path, target: str) -> None:
        (self.port,) = free_ports(1)
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(write_rule_file(workdir))],
            "scrape_configs": [
                {
                    "job_name": JOB,
                    # The label the PodMonitor adds, which the alerts name.
                    "static_configs": [{"targets": [target], "labels": {"node": "test-node"}}],
                }
            ],
        }
        path = workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={path}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"prometheus exited ({self.proc.returncode}):\n{self.output()}")
        try:
            return http_get("127.0.0.1", self.port, "/-/ready", timeout=2)[0] == 200
        except OSError:  # not listening yet
            return False

    def api(self, path: str) -> Any:
        status, _, body = http_get("127.0.0.1", self.port, path, timeout=10)
        assert status == 200, (path, body[:500])
        return json.loads(body)["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        result: list[dict[str, Any]] = self.api("/api/v1/query?" + urlencode({"query": expr}))[
            "result"
        ]
        return result

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


@pytest.fixture
def prometheus() -> Iterator[Callable[[str], Prometheus]]:
    """Start Prometheus scraping `target` (HOST:PORT of an agent's /metrics); stopped and
    its directory removed afterwards, also on failure."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus not found: `make setup` installs it (Debian's prometheus package)")
    workdir = Path(tempfile.mkdtemp(prefix="ebpflb-prometheus-"))
    servers: list[Prometheus] = []

    def start(target: str) -> Prometheus:
        server = Prometheus(binary, workdir, target)
        servers.append(server)
        wait_until(server.ready, "prometheus ready (/-/ready 200)", timeout=30)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def alert_selectors() -> set[str]:
    return {s.text for rule in alerts() for s in parse(rule["expr"]).selectors}


def dashboard_expressions() -> set[str]:
    document = dashboard()
    exprs = {substitute(q.expr) for q in dashboard_queries(document)}
    return exprs | {substitute(selector) for selector, _ in variable_queries(document)}


def test_every_dashboard_and_alert_query_finds_the_agents_series(
    topology: Topology,
    cgroup: Cgroup,
    manifests: Path,
    start_agent: AgentFactory,
    bpffs: Path,
    prometheus: Callable[[str], Prometheus],
    record_property: pytest.RecordProperty,
) -> None:
    (manifests / "big.yaml").write_text(big_service(10))  # 10 endpoints, 8 backends allowed
    agent = start_agent("--manifests", str(manifests), "--max-backends", "8", "--sync-period", "2")
    served_by(topology.requests(topology.node_ns, "tcp", WEB, 10, cgroup))
    served_by(topology.requests(topology.node_ns, "udp", DNS, 10, cgroup))
    with KernelMapSet(bpffs) as maps:
        assert maps.services.delete(PENDING)

    def repaired() -> bool:
        return agent.metrics().value("ebpflb_drift_repaired_total", map="ebpflb_svc4") is not None

    wait_until(repaired, "the deleted entry repaired at a full resync", timeout=15)
    scrape = agent.metrics()
    assert scrape.value("ebpflb_frontends_failed") == 1
    # The unit tests' catalogue (tests/unit/repo/test_monitoring.py) knows every series the
    # real agent exports, so checking names against it checks them against the agent.
    exported = {name for name, _ in scrape.samples}
    assert exported - set(agent_catalogue().labels) == set()

    assert agent.metrics_address is not None
    server = prometheus(agent.metrics_address)
    started = time.monotonic()
    wait_until(lambda: server.query(f'up{{job="{JOB}"}} == 1') != [], "the agent up", WAIT)
    record_property("target_up_seconds", round(time.monotonic() - started, 1))

    queries = sorted(dashboard_expressions() | alert_selectors())
    empty: list[str] = list(queries)

    def all_found() -> bool:
        # A rate needs two scrapes in its window: queried again until each has a series.
        empty[:] = [expr for expr in empty if not server.query(expr)]
        return not empty

    deadline = time.monotonic() + WAIT * TIMEOUT_SCALE
    while not all_found():
        assert time.monotonic() < deadline, f"no series for: {empty}\n{server.output()}"
        time.sleep(0.5)
    record_property("queries", len(queries))
    record_property("all_found_seconds", round(time.monotonic() - started, 1))

    def rules() -> list[dict[str, Any]]:
        return [r for group in server.api("/api/v1/rules")["groups"] for r in group["rules"]]

    wait_until(lambda: all(r["health"] != "unknown" for r in rules()), "every rule evaluated", WAIT)
    assert {r["name"]: r["health"] for r in rules()} == {a["alert"]: "ok" for a in alerts()}
    active = {a["labels"]["alertname"]: a["state"] for a in server.api("/api/v1/alerts")["alerts"]}
    # The failed frontend, and no sync that left nothing to retry since the start.
    assert active.get("EbpflbFrontendsFailed") == "pending", active
    assert active.get("EbpflbSyncStale") == "pending", active
    assert not {"EbpflbAgentDown", "EbpflbAgentAbsent"} & set(active), active
