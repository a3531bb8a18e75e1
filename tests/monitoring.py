"""deploy/monitoring/ as the tests read it: the alert rules (the PrometheusRule's `spec`,
the one copy of them), the dashboard's queries, the metric selectors inside a PromQL
expression, and the catalogue of what the agent exports (its collectors rendered with no
kernel), which tests/unit/repo/test_monitoring.py checks every name against and
tests/kernel/agent/test_prometheus.py queries on a real agent."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from ebpflb.datapath.contract import Counter, MapName
from ebpflb.datapath.maps import ServiceEntry
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.datapath.probes import FEATURES, FeatureCollector, KernelReport, Probed
from ebpflb.model import Frontend, Proto, SvcFlags
from ebpflb.observe.fill import MapFill, MapFillCollector, has_fill_level
from ebpflb.observe.kubeproxy_metrics import IP_FAMILY
from ebpflb.observe.metrics import DatapathCollector, Metrics, SourceCollector, StatusCollector
from ebpflb.observe.status import Phase
from ebpflb.observe.svccounters import ServiceCounterCollector
from ebpflb.sync.runner import SyncKind
from tests import REPO

MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "dashboard.json"
PODMONITOR = MONITORING / "podmonitor.yaml"
ALERTS_TEST = MONITORING / "tests" / "alerts-test.yaml"
RULE_FILE_NAME = "ebpflb.rules.yaml"  # what alerts-test.yaml's rule_files names
JOB = "ebpflb"  # the PodMonitor's job (the pods' k8s-app label)

# Labels a series gets from its target rather than from the agent: Prometheus's job and
# instance, the operator's namespace, pod, container and endpoint, the PodMonitor's node.
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "container", "endpoint", "node"})


# ---- the rules and the dashboard --------------------------------------------------------


def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's spec: a Prometheus rule file's document (`groups:`)."""
    spec: dict[str, Any] = yaml.safe_load(RULES.read_text())["spec"]
    return spec


def alerts() -> list[dict[str, Any]]:
    return [rule for group in rule_groups()["groups"] for rule in group["rules"]]


def write_rule_file(directory: Path) -> Path:
    """The rules as a plain Prometheus rule file (promtool, a Prometheus without the
    operator), written into `directory`."""
    path = directory / RULE_FILE_NAME
    path.write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
    return path


def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def panels(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in document["panels"]:
        yield panel
        yield from panel.get("panels", [])


@dataclass(frozen=True, slots=True)
class Query:
    panel: str
    expr: str
    legend: str


def dashboard_queries(document: dict[str, Any]) -> list[Query]:
    return [
        Query(panel["title"], target["expr"], target.get("legendFormat", ""))
        for panel in panels(document)
        for target in panel.get("targets", [])
    ]


LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[A-Za-z_]\w*)\)$")


def variable_queries(document: dict[str, Any]) -> list[tuple[str, str]]:
    """(selector, label) of each `label_values(selector, label)` variable."""
    found = []
    for variable in document["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = LABEL_VALUES.match(text)
        assert match, f"variable {variable['name']}: not label_values(selector, label): {text}"
        found.append((match["selector"], match["label"]))
    return found


# Grafana's variables in a query, as a Prometheus of its own would take them: every agent
# and service, the rate window one minute (several scrapes of 1 s or 30 s).
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "1h",
    "$instance": ".*",
    "$service": ".*",
}


def substitute(expr: str) -> str:
    for name in sorted(GRAFANA_VARIABLES, key=len, reverse=True):  # $__rate_interval first
        expr = expr.replace(name, GRAFANA_VARIABLES[name])
    assert "$" not in expr, f"a Grafana variable the tests do not know: {expr}"
    return expr


# ---- PromQL: the selectors of an expression ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value)
    text: str  # as written, without a range: queryable as an instant vector


@dataclass(frozen=True, slots=True)
class Parsed:
    selectors: tuple[Selector, ...]
    grouping: frozenset[str]  # labels named in by, without, on, ignoring, group_left/right


_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<number>0[xX][0-9a-fA-F]+
      |(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?(?:(?:ms|[smhdwy])[0-9]*)*)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<punct>[{}(),])
  | (?P<op>==|!=|=~|!~|>=|<=|[-+*/%^<>=@])
    """,
    re.VERBOSE,
)
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {
    *("sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values"),
    *("bottomk", "topk", "quantile", "and", "or", "unless", "bool", "offset", "inf", "nan"),
}


def _tokens(expr: str) -> list[tuple[str, str, int, int]]:
    tokens = []
    position = 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        assert match and match.lastgroup, f"cannot read PromQL at {expr[position:]!r}"
        if match.lastgroup != "space":
            tokens.append((match.lastgroup, match.group(), match.start(), match.end()))
        position = match.end()
    return tokens


def parse(expr: str) -> Parsed:
    """The vector selectors of `expr` and the labels it groups by: a reader of PromQL's
    tokens, enough for the expressions of deploy/monitoring (it refuses what it cannot
    read rather than guessing)."""
    tokens = _tokens(expr)
    selectors: list[Selector] = []
    grouping: set[str] = set()
    i = 0

    def following(index: int) -> str:
        return tokens[index][1] if index < len(tokens) else ""

    while i < len(tokens):
        kind, text, start, _ = tokens[i]
        word = text.lower()
        if kind == "ident" and word in _LABEL_LISTS and following(i + 1) == "(":
            i += 2
            while following(i) != ")":
                if tokens[i][0] == "ident":
                    grouping.add(tokens[i][1])
                i += 1
            i += 1
        elif kind == "ident" and (word in _KEYWORDS or word in _LABEL_LISTS):
            i += 1
        elif kind == "ident" and following(i + 1) == "(":
            i += 1  # a function
        elif kind == "ident" or text == "{":
            name = text if kind == "ident" else ""
            matchers: list[tuple[str, str, str]] = []
            end = tokens[i][3]
            j = i + 1 if kind == "ident" else i
            if following(j) == "{":
                j += 1
                while following(j) != "}":
                    label, op, value = tokens[j], tokens[j + 1], tokens[j + 2]
                    assert label[0] == "ident" and op[1] in ("=", "!=", "=~", "!~"), expr
                    assert value[0] == "string", expr
                    matchers.append((label[1], op[1], _unquote(value[1])))
                    j += 3
                    if following(j) == ",":
                        j += 1
                end = tokens[j][3]
                j += 1
            for label, op, value in matchers:
                if label == "__name__" and op == "=":
                    name = value
            assert name, f"a selector without a metric name: {expr}"
            selectors.append(Selector(name, tuple(matchers), expr[start:end]))
            i = j
        else:
            i += 1
    return Parsed(tuple(selectors), frozenset(grouping))


def _unquote(literal: str) -> str:
    """A PromQL string literal's value (Go's escapes, which JSON's cover here)."""
    if literal.startswith("`"):
        return literal[1:-1]
    if literal.startswith("'"):
        literal = '"' + literal[1:-1].replace("\\'", "'").replace('"', '\\"') + '"'
    value: str = json.loads(literal)
    return value


# ---- what the agent exports -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Catalogue:
    labels: dict[str, frozenset[str]]  # sample name as exposed (with _total, _bucket) -> labels
    values: dict[str, frozenset[str]]  # label -> every value the agent gives it, where known


class _Record:
    """One programmed frontend for the per-service collector (reconcile.state.Realized)."""

    entry = ServiceEntry(svc_id=1, table_off=0, table_size=0, backend_count=0, flags=SvcFlags(0))
    name = "default/web:http"


def agent_catalogue() -> Catalogue:
    """Every series name the agent's /metrics can carry, with its labels: the collectors
    ebpflb.app registers, fed made-up readings (no kernel), rendered by prometheus_client
    as a scrape renders them; enumerated label values from the enumerations the agent
    takes them from. A renamed metric or label changes this, not the tests' lists."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    registry.register(StatusCollector(lambda: {p.value: 0.0 for p in Phase}, lambda: {"added": 0}))
    registry.register(SourceCollector(lambda: {"Service": {"lists": 0}}))
    registry.register(DatapathCollector(lambda: {c.label: 0 for c in Counter}))
    report = KernelReport("test", tuple(Probed(f, True, "", 0.0) for f, _ in FEATURES))
    registry.register(FeatureCollector(report))
    fill = [MapFill(name.value, 0, 1) for name in MapName if has_fill_level(name)]
    registry.register(MapFillCollector(lambda: fill))
    frontend = Frontend(IPv4Address("10.96.0.10"), 80, Proto.TCP)
    registry.register(
        ServiceCounterCollector(FakeMapSet().service_counters, lambda: {frontend: _Record()})
    )
    # A labelled metric shows no series before its first child: make one of each. The
    # label names are only on the private attribute (prometheus_client has no accessor).
    for owner in (metrics, metrics.kube_proxy):
        for metric in vars(owner).values():
            if isinstance(metric, MetricWrapperBase) and metric._labelnames:
                metric.labels(*("x" for _ in metric._labelnames))
    labels: dict[str, frozenset[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            labels[sample.name] = labels.get(sample.name, frozenset()) | set(sample.labels)
    values = {
        "event": frozenset(c.label for c in Counter),
        "map": frozenset(name.value for name in MapName),
        "feature": frozenset(f.key for f, _ in FEATURES),
        "kind": frozenset(k.value for k in SyncKind),
        "ip_family": frozenset({IP_FAMILY}),
        "job": frozenset({JOB}),
    }
    return Catalogue(labels, values)
