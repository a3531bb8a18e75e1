"""`ebpflb maps dump`: what the maps hold, read back from the kernel, as a table or JSON.

Works on any MapSet, so it needs neither a running agent nor a compiler: the CLI opens the
pins with KernelMapSet. Slot counts come from the slot pool itself, not from the agent's
memory, so the dump shows what the datapath really uses.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ebpflb.datapath.maps import BackendEntry, MapSet
from ebpflb.model import BackendFlags


def collect(maps: MapSet, *, tables: bool = False) -> dict[str, Any]:
    """The JSON document `maps dump --json` prints."""
    backends: dict[int, BackendEntry] = dict(maps.backends.items())
    metas = dict(maps.service_meta.items())
    services = []
    slots_used = 0
    for frontend, entry in sorted(maps.services.items()):
        table = maps.slots.read(entry.table_off, entry.table_size) if entry.table_size else None
        slots_used += entry.table_size
        counts: Counter[int] = Counter(table.tolist()) if table is not None else Counter()
        listed = []
        for backend_id, slots in sorted(counts.items(), key=lambda kv: _addr_key(backends, kv[0])):
            be = backends.get(backend_id)
            item: dict[str, Any] = {
                "address": str(be.backend) if be else f"<missing backend id {backend_id}>",
                "slots": slots,
                "id": backend_id,
            }
            if be and be.flags:
                item["flags"] = _flag_names(be.flags)
            listed.append(item)
        maglev: dict[str, Any] = {"table_size": entry.table_size, "table_offset": entry.table_off}
        if tables and table is not None:
            maglev["table"] = [
                str(backends[i].backend) if i in backends else None for i in table.tolist()
            ]
        services.append(
            {
                "frontend": str(frontend),
                "service": metas.get(entry.svc_id, ""),
                "type": entry.flags.type_name(),
                "svc_id": entry.svc_id,
                "backends": listed,
                "maglev": maglev,
            }
        )
    return {
        "services": services,
        "summary": {
            "frontends": len(services),
            "backends": len(backends),
            "slots_used": slots_used,
            "slot_pool_size": maps.slots.capacity,
            "slot_memory_bytes": slots_used * np.dtype(np.uint32).itemsize,
        },
        "counters": maps.counters(),
    }


def _addr_key(backends: dict[int, BackendEntry], backend_id: int) -> tuple[int, int, int]:
    be = backends.get(backend_id)
    if be is None:
        return (1, 0, backend_id)
    return (0, int(be.backend.address), be.backend.port)


def _flag_names(flags: BackendFlags) -> list[str]:
    return [f.name.lower() for f in BackendFlags if f and f in flags and f.name]


def render_text(report: dict[str, Any]) -> str:
    """An aligned table: one line per backend, the frontend columns on its first line."""
    header = ("FRONTEND", "SERVICE", "TYPE", "SLOTS", "BACKEND (SLOTS)")
    rows: list[tuple[str, ...]] = []
    for svc in report["services"]:
        size = str(svc["maglev"]["table_size"])
        first = (svc["frontend"], svc["service"] or "?", svc["type"], size)
        if not svc["backends"]:
            rows.append((*first, "(no usable endpoint: refusing)"))
            continue
        for i, be in enumerate(svc["backends"]):
            flags = f" [{','.join(be['flags'])}]" if be.get("flags") else ""
            cell = f"{be['address']} ({be['slots']}){flags}"
            rows.append((*first, cell) if i == 0 else ("", "", "", "", cell))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    summary = report["summary"]
    lines.append("")
    lines.append(
        f"{summary['frontends']} frontends, {summary['backends']} backends, "
        f"{summary['slots_used']} of {summary['slot_pool_size']} slots used "
        f"({summary['slot_memory_bytes'] / 1024:.1f} KiB)"
    )
    counters = report.get("counters") or {}
    if counters:
        lines.append("datapath: " + ", ".join(f"{k}={v}" for k, v in sorted(counters.items())))
    if report.get("conntrack"):
        lines += ["", "CONNTRACK (NodePort/LoadBalancer/external IP flows)"]
        lines += [
            f"{f['proto']} {f['client']} -> {f['frontend']} => {f['backend']}"
            + (f" snat {f['snat']}" if f["snat"] else "")
            + f" [{','.join(f['flags'])}] expires={f['expires_in']}s"
            f" packets={f['packets']} bytes={f['bytes']}"
            for f in report["conntrack"]
        ]
    if report.get("nat"):
        lines += ["", "NAT (reply tuple -> client view)"]
        lines += [
            f"{n['proto']} {n['backend']} -> {n['reply_to']} => {n['frontend']} -> {n['client']}"
            + (" snat" if n["snat"] else "")
            + f" expires={n['expires_in']}s"
            for n in report["nat"]
        ]
    return "\n".join(lines)
