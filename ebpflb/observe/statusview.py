"""`ebpflb status`: what the agent says it is doing (/status, /metrics), and what the pinned
maps say when the agent does not answer.

Two steps, each testable alone: `gather` reads (HTTP from the agent's metrics address, or
the pins), `render_text` turns the document into a few readable lines and a map table.
`--json` prints the document itself:

    {"agent": {"address", "answering", "error"},
     "status": the agent's /status document, or null,
     "kube_proxy": {figures from kube-proxy's metrics}, or null,
     "datapath": {event: count} (ebpflb_datapath_events_total; only from the agent),
     "source": {kind or "manifests": {event: count}} (ebpflb_source_events_total; idem),
     "maps": {"<pinned map>": {"entries", "capacity", "ratio"}},
     "maps_from": "agent" | "pins" | null,
     "pins": {"dir", "frontends", "services", "backends", "slots_used", "counters",
              "error"} (only when the agent does not answer)}
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ebpflb.datapath.contract import MapName
from ebpflb.errors import EbpflbError
from ebpflb.observe.fill import MapFill, pins_fill

# Figures of kube-proxy's metrics shown by `status` (sample name -> document key).
KUBE_PROXY_FIGURES = {
    "kubeproxy_network_programming_duration_seconds_count": "programming_count",
    "kubeproxy_network_programming_duration_seconds_sum": "programming_seconds",
    "kubeproxy_sync_proxy_rules_duration_seconds_count": "syncs",
    "kubeproxy_sync_proxy_rules_duration_seconds_sum": "sync_seconds",
    "kubeproxy_sync_proxy_rules_service_changes_total": "service_changes",
    "kubeproxy_sync_proxy_rules_endpoint_changes_total": "endpoint_changes",
}
_KNOWN = {
    "ready", "healthy", "process_start", "phases", "compile_seconds", "lists", "sync",
    "frontends", "frontend_changes", "programs", "interfaces", "problems", "pin_layout",
    "pod_interfaces", "socket_lb",
}  # fmt: skip


def agent_url(address: str, path: str) -> str:
    """http://HOST:PORT/path for the agent's --metrics-bind-address (a wildcard address is
    reached on loopback)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


# No proxy: the agent is on this node (an http_proxy in the environment must not apply).
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str, timeout: float) -> bytes:
    with _OPENER.open(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body


def gather(address: str, bpffs: Path, *, timeout: float = 2.0) -> dict[str, Any]:
    """The `status --json` document: from the agent at `address` if it answers, else from
    the pins under `bpffs`."""
    document: dict[str, Any] = {
        "agent": {"address": address, "answering": False, "error": None},
        "status": None,
        "kube_proxy": None,
        "maps": {},
        "maps_from": None,
    }
    if address:
        try:
            status = json.loads(_get(agent_url(address, "/status"), timeout))
            metrics = _get(agent_url(address, "/metrics"), timeout).decode()
        except (OSError, urllib.error.URLError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            document["agent"]["error"] = str(getattr(reason, "strerror", None) or reason)
        else:
            document["agent"]["answering"] = True
            document["status"] = status
            samples = metric_samples(metrics)
            document["kube_proxy"] = kube_proxy_figures(samples)
            document["maps"] = fill_from_metrics(samples)
            document["datapath"] = datapath_counters(samples)
            document["source"] = source_counters(samples)
            document["maps_from"] = "agent"
            return document
    else:
        document["agent"]["error"] = "no metrics address (--metrics-bind-address is empty)"
    document["pins"] = {"dir": str(bpffs)}
    try:
        pins, levels = read_pins(bpffs)
    except (EbpflbError, OSError) as exc:
        document["pins"]["error"] = str(exc)
        return document
    document["pins"].update(pins)
    document["maps"] = {level.map: level.to_json() for level in levels}
    document["maps_from"] = "pins"
    return document


def metric_samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def kube_proxy_figures(
    samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float],
) -> dict[str, float]:
    figures: dict[str, float] = {}
    for (name, _), value in samples.items():
        key = KUBE_PROXY_FIGURES.get(name)
        if key is not None:
            figures[key] = figures.get(key, 0.0) + value  # summed over ip_family
    return figures


def fill_from_metrics(
    samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float],
) -> dict[str, dict[str, object]]:
    entries: dict[str, float] = {}
    capacity: dict[str, float] = {}
    grows: dict[str, float] = {}
    for (name, labels), value in samples.items():
        target = {
            "ebpflb_map_entries": entries,
            "ebpflb_map_capacity": capacity,
            "ebpflb_map_grows_total": grows,
        }.get(name)
        if target is not None:
            target[dict(labels)["map"]] = value
    order = {name.value: i for i, name in enumerate(MapName)}  # as the pins list them
    levels = {
        name: MapFill(name, int(entries[name]), int(capacity.get(name, 0))).to_json()
        for name in sorted(entries, key=lambda n: (order.get(n, len(order)), n))
    }
    for name, count in grows.items():  # a growable map: how often this agent grew it
        if name in levels:
            levels[name]["grows"] = int(count)
    return levels


def source_counters(
    samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float],
) -> dict[str, dict[str, int]]:
    """ebpflb_source_events_total by source (a kind, or manifests) and event."""
    found: dict[str, dict[str, int]] = {}
    for (name, labels), value in samples.items():
        if name == "ebpflb_source_events_total":
            label = dict(labels)
            found.setdefault(label["source"], {})[label["event"]] = int(value)
    return {source: dict(sorted(events.items())) for source, events in sorted(found.items())}


def datapath_counters(
    samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float],
) -> dict[str, int]:
    return {
        dict(labels)["event"]: int(value)
        for (name, labels), value in samples.items()
        if name == "ebpflb_datapath_events_total"
    }


def read_pins(bpffs: Path) -> tuple[dict[str, Any], list[MapFill]]:
    """What the pinned maps hold, without an agent: counts and fill levels."""
    from ebpflb.datapath.maps import dump  # the datapath adapter: BCC's libbpf bindings
    from ebpflb.datapath.maps.kernel import KernelMapSet

    with KernelMapSet(bpffs) as maps:
        report = dump.collect(maps, flows=0)
        max_entries = {MapName(n): info.max_entries for n, info in maps.map_infos().items()}
        levels = pins_fill(max_entries, maps.count_entries, report["summary"]["slots_used"])
    services = {s["service"].rpartition(":")[0] or s["service"] for s in report["services"]}
    pins = {
        "frontends": report["summary"]["frontends"],
        "services": len(services - {""}),
        "backends": report["summary"]["backends"],
        "slots_used": report["summary"]["slots_used"],
        "refusing": sum(1 for s in report["services"] if not s["backends"]),
        "counters": report["counters"],
    }
    return pins, levels


# ---- text ----------------------------------------------------------------------------------


def _seconds(value: float) -> str:
    if value < 1:
        return f"{value * 1000:.1f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    return f"{value / 3600:.1f} h"


def _utc(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix))


def render_text(document: Mapping[str, Any], *, now: float | None = None) -> str:
    """A few lines a person reads at a glance, then one line per map."""
    now = time.time() if now is None else now
    agent = document["agent"]
    lines: list[str] = []
    status = document.get("status")
    if agent["answering"] and status is not None:
        lines += _agent_lines(agent["address"], status, document.get("kube_proxy") or {}, now)
        for source, events in (document.get("source") or {}).items():
            shown = ", ".join(f"{event}={count:,}" for event, count in events.items())
            lines.append(f"source      {source}: {shown}")
        lines += _counter_lines(document.get("datapath") or {})
    else:
        lines += _pins_lines(agent, document.get("pins") or {})
    maps = document.get("maps") or {}
    if maps:
        source = "the agent" if document.get("maps_from") == "agent" else "the pins"
        width = max(len(name) for name in maps)
        lines += ["", f"{'MAP':<{width}}  {'ENTRIES':>11}  {'CAPACITY':>11}    FILL  ({source})"]
        for name, level in maps.items():
            full = level["capacity"] and level["entries"] >= level["capacity"]
            grown = f"  grew {level['grows']}x" if level.get("grows") else ""
            lines.append(
                f"{name:<{width}}  {level['entries']:>11,}  {level['capacity']:>11,}"
                f"  {level['ratio'] * 100:5.1f}%" + ("  FULL" if full else "") + grown
            )
    return "\n".join(lines)


def _agent_lines(
    address: str, status: Mapping[str, Any], kube_proxy: Mapping[str, float], now: float
) -> list[str]:
    state = "ready" if status.get("ready") else "starting (no full sync yet)"
    health = "healthy" if status.get("healthy") else "NOT healthy"
    start = status.get("process_start")
    up = f"; up {_seconds(now - start)} (since {_utc(start)})" if start else ""
    lines = [f"agent       answering on {address}: {state}, {health}{up}"]
    phases = status.get("phases") or {}
    if phases:
        steps = ", ".join(f"{name} {_seconds(seconds)}" for name, seconds in phases.items())
        lines.append(f"start-up    {steps} after the process started")
    lists = status.get("lists") or {}
    if lists:
        listed = "; ".join(
            f"{kind}: {figures['objects']:,} in {_seconds(figures['seconds'])}"
            for kind, figures in lists.items()
        )
        lines.append(f"lists       {listed}")
    sync = status.get("sync") or {}
    last = sync.get("last")
    if last:
        outcome = "ok" if last.get("ok") else f"FAILED {last.get('failed', 0)} service(s)"
        lines.append(
            f"sync        {sync.get('count', 0)} syncs; last: {last['kind']},"
            f" {_seconds(now - last['finished'])} ago, took {_seconds(last['duration_s'])},"
            f" +{last['added']} ~{last['updated']} -{last['removed']} frontends, {outcome}"
        )
        for error in last.get("errors", [])[:3]:
            lines.append(f"            error: {error}")
    pending = sync.get("oldest_pending_s")
    if pending is not None:
        lines.append(
            f"pending     a change has waited {_seconds(pending)}"
            f" (/healthz turns 503 at {_seconds(sync.get('health_timeout_s') or 0)})"
        )
    changes = status.get("frontend_changes") or {}
    lines.append(
        f"frontends   {status.get('frontends', 0):,} programmed"
        + (
            f" (since start: +{changes.get('added', 0)} ~{changes.get('updated', 0)}"
            f" -{changes.get('removed', 0)})"
            if changes
            else ""
        )
    )
    count = kube_proxy.get("programming_count", 0)
    if count:
        mean = kube_proxy.get("programming_seconds", 0.0) / count
        lines.append(
            f"programming {int(count)} endpoint changes programmed, mean {_seconds(mean)} from"
            " the slice's trigger time to the map write"
        )
    interfaces = status.get("interfaces") or {}
    if interfaces:
        shown = ", ".join(f"{name} (xdp {i['xdp']})" for name, i in interfaces.items())
        lines.append(f"interfaces  {shown}")
    scope = status.get("socket_lb")
    if scope and scope.get("scope") != "all":
        cookie = scope.get("netns_cookie")
        lines.append(
            f"socket-LB   {scope['scope']}"
            + (f" (the network namespace with cookie {cookie})" if cookie else "")
        )
    if scope and scope.get("udp_socket_destroy"):
        lines.append(f"stale UDP   {scope['udp_socket_destroy']}")
    pod = status.get("pod_interfaces")
    if pod:
        attached = pod.get("attached") or []
        lines.append(
            f"pod path    {','.join(pod.get('patterns') or [])}: {len(attached)} interfaces"
            + (
                f" ({', '.join(attached[:8])}{', ...' if len(attached) > 8 else ''})"
                if attached
                else ""
            )
            + (f"; {len(pod['failed'])} failed: {pod['failed'][0]}" if pod.get("failed") else "")
        )
    programs = status.get("programs") or {}
    ids = programs.get("ids") or {}
    if ids:
        lines.append("program ids " + ", ".join(f"{name} {id_}" for name, id_ in ids.items()))
    shown_parts = [f"{name} {how}" for name, how in (programs.get("origin") or {}).items()]
    replaced = programs.get("replaced_previous")
    if replaced:
        shown_parts.append(f"took over {replaced} from a previous agent")
    if shown_parts:
        lines.append(f"programs    {'; '.join(shown_parts)}")
    for name, tree in (programs.get("headers") or {}).items():
        lines.append(f"headers     {name} compiled with {tree}")
    layout = status.get("pin_layout")
    if layout:
        found = layout["found"]
        seen = "no maps pinned" if found is None else f"found {found}"
        if layout.get("written_by"):
            seen += f" (ebpflb {layout['written_by']})"
        lines.append(f"pin layout  {layout['layout']}; {seen}: {layout['verdict']}")
        if layout.get("refused"):
            lines.append(f"            REFUSED: {layout['refused']}")
    lines += _problem_lines(status.get("problems") or {})
    for key, value in status.items():  # sections other components add (e.g. features)
        if key not in _KNOWN:
            text = json.dumps(value, separators=(",", ":"), sort_keys=True)
            lines.append(f"{key:<11} {text if len(text) <= 200 else text[:197] + '...'}")
    return lines


def _problem_lines(problems: Mapping[str, Any]) -> list[str]:
    lines = []
    invalid = problems.get("invalid_object_count", 0)
    if invalid:
        first = problems["invalid_objects"][0]
        lines.append(
            f"problems    {invalid} invalid object(s), e.g. {first['kind']} {first['name']}:"
            f" {first['error']}"
        )
    errors = problems.get("source_error_count", 0)
    if errors:
        lines.append(f"problems    {errors} source error(s), e.g. {problems['source_errors'][0]}")
    orphans = problems.get("orphan_slices") or []
    if orphans:
        names = ", ".join(f"{o['slice']} (-> {o['service']})" for o in orphans[:3])
        lines.append(f"problems    slices naming no Service: {names}")
    return lines or ["problems    none"]


def _pins_lines(agent: Mapping[str, Any], pins: Mapping[str, Any]) -> list[str]:
    address = agent["address"] or "(no address)"
    lines = [f"agent       NOT answering on {address}: {agent.get('error') or 'no answer'}"]
    where = pins.get("dir", "?")
    if pins.get("error"):
        lines.append(f"pins        cannot be read under {where}: {pins['error']}")
        return lines
    lines.append(f"pins        what the maps pinned under {where} hold (traffic still uses them):")
    refusing = pins.get("refusing", 0)
    lines.append(
        f"frontends   {pins['frontends']:,} of {pins['services']:,} services"
        + (f", {refusing} refusing (no usable endpoint)" if refusing else "")
    )
    lines.append(f"backends    {pins['backends']:,}; Maglev slots in use: {pins['slots_used']:,}")
    return lines + _counter_lines(pins.get("counters") or {})


def _counter_lines(counters: Mapping[str, int]) -> list[str]:
    counted = {k: v for k, v in sorted(counters.items()) if v}
    if not counted:
        return []
    return ["datapath    " + ", ".join(f"{k}={v:,}" for k, v in counted.items())]
