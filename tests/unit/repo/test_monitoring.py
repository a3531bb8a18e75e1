"""deploy/monitoring/: the alert rules pass promtool (`check rules`, and `test rules` with
deploy/monitoring/tests/alerts-test.yaml, where each alert fires and stays silent), the
dashboard is JSON whose queries are PromQL, the PodMonitor scrapes the port and path the
agent serves /metrics on, and every metric, label and label value the alerts and the
dashboard name is one the agent exports (tests.monitoring.agent_catalogue): a renamed
metric fails here. tests/kernel/agent/test_prometheus.py runs them on a real Prometheus.

promtool is Debian's prometheus package, which `make setup` installs: without it these
tests fail (CI counts a skip as a pass that tested nothing)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Set
from pathlib import Path
from typing import Any

import pytest
import yaml
from yamllint import linter

from ebpflb.config import DEFAULT_METRICS_BIND_ADDRESS, Config
from ebpflb.observe.http import metrics_routes
from tests.monitoring import (
    ALERTS_TEST,
    JOB,
    MONITORING,
    PODMONITOR,
    RULES,
    TARGET_LABELS,
    Catalogue,
    Parsed,
    Selector,
    agent_catalogue,
    alerts,
    dashboard,
    dashboard_queries,
    panels,
    parse,
    substitute,
    variable_queries,
    write_rule_file,
)
from tests.unit.repo.test_deploy_manifests import YAMLLINT, daemonset, documents

LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_]\w*)\s*\}\}")
TEMPLATE_LABEL = re.compile(r"\$labels\.([A-Za-z_]\w*)")


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool not found: `make setup` installs it (Debian's prometheus package)")
    return subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return agent_catalogue()


# ---- the rules ---------------------------------------------------------------------------


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    done = promtool("check", "rules", str(write_rule_file(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_promtool_unit_tests_each_alert_firing_and_not(tmp_path: Path) -> None:
    """The alerts-test file beside the rule file written from the PrometheusRule (promtool
    reads rule_files relative to the test file): one copy of the rules."""
    write_rule_file(tmp_path)
    shutil.copy(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    done = promtool("test", "rules", ALERTS_TEST.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # Every alert has a case where it fires and one where it does not.
    fired: set[str] = set()
    silent: set[str] = set()
    for test in yaml.safe_load(ALERTS_TEST.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            (fired if case["exp_alerts"] else silent).add(case["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert fired == names and silent == names


def test_the_rules_are_a_prometheus_rule_beside_the_daemonset() -> None:
    (rule,) = documents(RULES)
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["namespace"] == daemonset()["metadata"]["namespace"]
    for alert in alerts():
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), alert["alert"]
        assert {"summary", "description"} <= set(alert["annotations"]), alert["alert"]
        # kube-proxy exports the kubeproxy_* names too: every selector names the job.
        for selector in parse(alert["expr"]).selectors:
            assert ("job", "=", JOB) in selector.matchers, (alert["alert"], selector.text)


# ---- every name is the agent's -----------------------------------------------------------


def problems(expr: str, catalogue: Catalogue, used_labels: Set[str] = frozenset()) -> list[str]:
    """What in `expr` (and the labels its legend or annotations use) the agent does not
    export: metric names, label names in matchers and groupings, enumerated values."""
    parsed: Parsed = parse(expr)
    found = []
    known: set[str] = set(TARGET_LABELS)
    for selector in parsed.selectors:
        found += selector_problems(selector, catalogue)
        known |= catalogue.labels.get(selector.name, frozenset())
    found += [f"{label}: no such label here" for label in sorted(parsed.grouping - known)]
    found += [f"{label}: no such label here" for label in sorted(used_labels - known)]
    return found


def selector_problems(selector: Selector, catalogue: Catalogue) -> list[str]:
    if selector.name == "up":  # Prometheus's own, per target
        labels: frozenset[str] = frozenset()
    elif selector.name in catalogue.labels:
        labels = catalogue.labels[selector.name]
    else:
        return [f"{selector.name}: the agent exports no such metric"]
    found = []
    for label, op, value in selector.matchers:
        if label not in labels | TARGET_LABELS | {"__name__"}:
            found.append(f"{selector.text}: {selector.name} has no label {label}")
        elif op == "=" and label in catalogue.values and value not in catalogue.values[label]:
            found.append(f"{selector.text}: {label} is never {value!r}")
    return found


def test_every_alert_names_what_the_agent_exports(catalogue: Catalogue) -> None:
    found = {
        alert["alert"]: problems(
            alert["expr"],
            catalogue,
            {m for text in alert["annotations"].values() for m in TEMPLATE_LABEL.findall(text)},
        )
        for alert in alerts()
    }
    assert {name: p for name, p in found.items() if p} == {}


def test_every_dashboard_query_names_what_the_agent_exports(catalogue: Catalogue) -> None:
    document = dashboard()
    found = {
        f"{query.panel}: {query.expr}": problems(
            substitute(query.expr), catalogue, set(LEGEND_LABEL.findall(query.legend))
        )
        for query in dashboard_queries(document)
    }
    for selector, label in variable_queries(document):
        found[selector] = problems(substitute(selector), catalogue, {label})
    assert {name: p for name, p in found.items() if p} == {}
    # What the dashboard is for: per-service traffic, sync latency, map fill.
    names = {
        s.name for q in dashboard_queries(document) for s in parse(substitute(q.expr)).selectors
    }
    assert {n for n in catalogue.labels if n.startswith("ebpflb_service_")} <= names
    assert {"ebpflb_sync_duration_seconds_bucket", "ebpflb_map_fill_ratio"} <= names


def test_a_renamed_metric_label_or_value_is_caught(catalogue: Catalogue) -> None:
    assert (
        problems('rate(ebpflb_datapath_events_total{event="snat_exhausted"}[5m])', catalogue) == []
    )
    assert problems("rate(ebpflb_sync_seconds_bucket[5m])", catalogue) == [
        "ebpflb_sync_seconds_bucket: the agent exports no such metric"
    ]
    assert problems('ebpflb_map_fill_ratio{maps="x"}', catalogue) == [
        'ebpflb_map_fill_ratio{maps="x"}: ebpflb_map_fill_ratio has no label maps'
    ]
    assert problems('ebpflb_datapath_events_total{event="snat_exhausted_total"}', catalogue) == [
        'ebpflb_datapath_events_total{event="snat_exhausted_total"}: event is never'
        " 'snat_exhausted_total'"
    ]
    assert problems("sum by (services) (ebpflb_service_refused_total)", catalogue) == [
        "services: no such label here"
    ]
    assert problems("ebpflb_frontends", catalogue, {"map"}) == ["map: no such label here"]


def test_selectors_are_read_from_promql() -> None:
    parsed = parse(
        "sum(rate(x{a=\"b\",c=~'d\\'e'}[5m] offset 1h)) by (q) / on(z) group_left(w) y"
        ' or vector(1) > bool 0.9 and absent({__name__="up", job=`j`})'
        " + histogram_quantile(0.9, sum without (le) (rate(h_bucket[1m:10s])))"
    )
    assert [(s.name, s.matchers, s.text) for s in parsed.selectors] == [
        ("x", (("a", "=", "b"), ("c", "=~", "d'e")), "x{a=\"b\",c=~'d\\'e'}"),
        ("y", (), "y"),
        ("up", (("__name__", "=", "up"), ("job", "=", "j")), '{__name__="up", job=`j`}'),
        ("h_bucket", (), "h_bucket"),
    ]
    assert parsed.grouping == {"q", "z", "w", "le"}


# ---- the dashboard -----------------------------------------------------------------------


def test_the_dashboard_is_grafana_json_with_valid_promql(tmp_path: Path) -> None:
    document = dashboard()  # parses
    assert document["uid"] and document["title"] and document["schemaVersion"] >= 36
    ids = [panel["id"] for panel in panels(document)]
    assert len(ids) == len(set(ids))
    for panel in panels(document):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            # The data source is the dashboard's variable: no UID of someone's Grafana.
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
    # promtool parses each query (Grafana's variables given values) as a recording rule.
    rules = [
        {"record": f"dashboard:query{i}", "expr": substitute(query.expr)}
        for i, query in enumerate(dashboard_queries(document))
    ]
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


# ---- the PodMonitor ----------------------------------------------------------------------


def relabel(address: str, rule: dict[str, Any]) -> str:
    """One `replace` relabeling of __address__, as Prometheus applies it (anchored regex,
    ${1} for the first group)."""
    match = re.fullmatch(rule["regex"], address)
    assert match, (rule, address)
    return re.sub(r"\$\{?(\d+)\}?", lambda m: match.group(int(m.group(1))), rule["replacement"])


def test_the_podmonitor_scrapes_the_agents_metrics_port_and_path() -> None:
    (monitor,) = documents(PODMONITOR)
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    ds = daemonset()
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["namespaceSelector"]["matchNames"] == [ds["metadata"]["namespace"]]
    assert pod_labels[spec["jobLabel"]] == JOB  # the job every rule names
    (endpoint,) = spec["podMetricsEndpoints"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert endpoint["port"] in ports  # the operator targets declared ports only
    assert endpoint["path"] in metrics_routes(None, None)  # only the routes' paths: never called
    # The target moves from that port to the metrics port: the agent's default and the
    # ConfigMap's metrics-bind-address.
    (move,) = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "__address__"]
    (configmap,) = documents(MONITORING.parent / "base" / "configmap.yaml")
    configured = yaml.safe_load(configmap["data"]["config.yaml"])["metrics-bind-address"]
    metrics_port = DEFAULT_METRICS_BIND_ADDRESS.rsplit(":", 1)[1]
    assert Config().metrics_bind_address == DEFAULT_METRICS_BIND_ADDRESS
    assert configured.rsplit(":", 1)[1] == metrics_port
    port = ports[endpoint["port"]]
    assert relabel(f"192.0.2.1:{port}", move) == f"192.0.2.1:{metrics_port}"
    assert relabel(f"[2001:db8::1]:{port}", move) == f"[2001:db8::1]:{metrics_port}"
    # The node label the alerts name.
    assert any(r.get("targetLabel") == "node" for r in endpoint["relabelings"])


@pytest.mark.parametrize(
    "path", [RULES, PODMONITOR, ALERTS_TEST], ids=lambda p: str(p.relative_to(MONITORING))
)
def test_monitoring_yaml_passes_yamllint(path: Path) -> None:
    problems = [f"{p.line}:{p.column} {p.message}" for p in linter.run(path.read_text(), YAMLLINT)]
    assert problems == []
