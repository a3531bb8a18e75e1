"""Reports saved before the typed records (schema 1: nested dicts, no "kind"), converted to
schema 2's JSON shape so the codec decodes them like any other (docs/bench/*.json are
schema 1). Pure data in, data out; codec.py then checks every field.

Schema 1 shapes: compare {"machine", "settings", "results": {"N": {mode: {"latency",
"connections", "nodeport", "control": {..., "kernel_memory_bytes", "details"}, "phase_s",
"listed"}}}, "total_s", "problems", "targets"}; maglev: as schema 2 without "kind"; sync
{"services", "endpoints_per_service", "changes", "cpus", "kernel", "ebpflb": {agent
figures, "memory_after_sync", ...}, "total_s"}. The agent's start-up figures were one flat
dict ("start_to_<phase>_s", "<set>_compile_s", "<kind>_listed", "<kind>_list_s", ...).
"""

from __future__ import annotations

from typing import Any

from lab.bench.records import ReportError

TARGETS = ("first", "last", "random")
# schema 1's "start_to_<name>_s" -> the phase names of the agent's /status.
PHASES = {
    "socket_lb_compiled": "socket_lb_compiled",
    "nodeport_compiled": "nodeport_compiled",
    "attached": "attached",
    "services_listed": "services_listed",
    "slices_listed": "slices_listed",
    "synced": "first_sync",
}
LISTS = {"services": "Service", "slices": "EndpointSlice"}
MAP_SIZES = ("slot_pool_size", "max_services", "max_backends")


def upgrade(data: dict[str, Any], where: str) -> dict[str, Any]:
    """A schema 1 report as schema 2 JSON data (with "kind" and "schema")."""
    try:
        if "results" in data:
            body = _compare(data)
            kind = "compare"
        elif "configs" in data:
            body, kind = dict(data), "maglev"
        elif "ebpflb" in data:
            body, kind = _sync(data), "sync"
        else:
            raise ReportError(f"{where}: not an ebpflb bench report (no kind, no results)")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ReportError(
            f"{where}: malformed schema 1 report ({type(exc).__name__}: {exc})"
        ) from exc
    return {"kind": kind, "schema": 2, **body}


def _compare(data: dict[str, Any]) -> dict[str, Any]:
    settings = dict(data["settings"])
    # Before the iptables-nft cap existed, iptables-nft ran as far as the other kube-proxy modes.
    settings.setdefault("iptables_nft_max_services", settings.get("kube_proxy_max_services"))
    sizes = [
        {"services": int(n), "modes": [_mode(mode, fig) for mode, fig in per_mode.items()]}
        for n, per_mode in data["results"].items()
    ]
    return {
        "machine": data["machine"],
        "settings": settings,
        "sizes": sizes,
        "total_s": data["total_s"],
        "problems": data.get("problems", []),
        "targets": data.get("targets", []),
    }


def _rate(figures: dict[str, Any]) -> dict[str, Any]:
    return {"errors": 0, **figures}


def _mode(mode: str, figures: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if "latency" in figures:
        latency = figures["latency"]
        data["latency"] = {t: latency[t] for t in TARGETS}
        if "first_error" in latency:
            data["latency"]["first_error"] = latency["first_error"]
    for kind in ("connections", "nodeport"):
        if kind in figures:
            data[kind] = _rate(figures[kind])
    result: dict[str, Any] = {"mode": mode, "data": data, "listed": figures.get("listed", True)}
    if "phase_s" in figures:
        result["phase_s"] = figures["phase_s"]
    if "control" in figures:
        result["control"] = _control(figures["control"])
    return result


def _control(control: dict[str, Any]) -> dict[str, Any]:
    details = control.get("details", {})
    out: dict[str, Any] = {
        key: control[key]
        for key in ("program_s", "program_cpu_s", "change_s", "change_cpu_s")
        if key in control
    }
    out["memory"] = {
        "cgroup_bytes": control.get("kernel_memory_bytes"),
        "bpf_map_bytes": details.get("bpf_map_bytes"),
    }
    if "command" in details:
        out["rules"] = {
            "command": details["command"],
            "input_bytes": details["input_bytes"],
            "rules": details.get("rules"),
        }
    if "start_to_synced_s" in details:
        out["agent"] = startup(details)
    return out


def startup(figures: dict[str, Any]) -> dict[str, Any]:
    """The agent's flat schema 1 start-up figures as an AgentStartup's JSON data."""
    out: dict[str, Any] = {
        "start_to_synced_s": figures["start_to_synced_s"],
        "cpu_s_at_synced": figures["cpu_s_at_synced"],
        "frontends": figures["frontends"],
        "sync_errors": figures.get("sync_errors", 0),
        "first_sync_s": figures.get("sync_s"),
        "phases": {
            new: figures[f"start_to_{old}_s"]
            for old, new in PHASES.items()
            if f"start_to_{old}_s" in figures
        },
        "compile_s": {
            name: figures[f"{name}_compile_s"]
            for name in ("socket_lb", "nodeport")
            if f"{name}_compile_s" in figures
        },
        "lists": {
            kind: {"objects": figures[f"{old}_listed"], "seconds": figures[f"{old}_list_s"]}
            for old, kind in LISTS.items()
            if f"{old}_listed" in figures
        },
        "api_load_s": figures.get("api_load_s"),
        "table_size": figures.get("table_size"),
    }
    if all(key in figures for key in MAP_SIZES):
        out["map_sizes"] = {key: figures[key] for key in MAP_SIZES}
    return out


def _sync(data: dict[str, Any]) -> dict[str, Any]:
    e = data["ebpflb"]
    return {
        "settings": {
            "services": data["services"],
            "endpoints": data["endpoints_per_service"],
            "changes": data["changes"],
            "sync_period": e["sync_period_s"],
            "min_sync_period": e["min_sync_period_s"],
        },
        "cpus": data["cpus"],
        "kernel": data["kernel"],
        "startup": startup(e),
        "memory_after_sync": e["memory_after_sync"],
        "slot_tables_mib": e["slot_tables_mib"],
        "cpu_s_settled": e["cpu_s_settled"],
        "periodic_full_resync_s": e.get("periodic_full_resync_s"),
        "change_to_map_s": e["change_to_map_s"],
        "change_cpu_s": e["change_cpu_s"],
        "drift_repaired_svc4": e.get("drift_repaired_svc4", 0.0),
        "memory_end": e["memory_end"],
        "cpu_s_end": e["cpu_s_end"],
        "total_s": data["total_s"],
    }
