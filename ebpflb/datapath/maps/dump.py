"""`ebpflb maps dump`: what the maps hold, read back as typed rows, as a table or JSON.

Works on any MapSet, so it needs neither a running agent nor a compiler (the CLI opens the
pins with KernelMapSet) and is unit-tested on the fake. Slot counts come from the slot
pool itself, not from the agent's memory, so the dump shows what the datapath really uses.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any, TypeVar

import numpy as np

from ebpflb.datapath.contract import CtFlags, NatFlags
from ebpflb.datapath.maps import (
    AddrPort,
    BackendEntry,
    ConntrackEntry,
    Flow,
    MapSet,
    NatEntry,
    ServiceEntry,
    network_order,
)
from ebpflb.errors import ConfigError
from ebpflb.model import (
    BackendFlags,
    Frontend,
    IPAddress,
    IPNetwork,
    NamespacedName,
    Proto,
    SvcFlags,
    host_port,
)

FLOWS = 100  # conntrack and NAT entries shown by default
_TYPE_FLAGS = SvcFlags.CLUSTER_IP | SvcFlags.EXTERNAL  # shown as the type
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Selection:
    """`maps dump --service NS/NAME` / `--frontend VIP:PORT/PROTO`: the frontends of one
    service (every port, every address), or one frontend (both scopes); then only the
    backends, source ranges, conntrack and NAT entries of those frontends."""

    service: NamespacedName | None = None
    frontend: tuple[IPAddress, int, Proto] | None = None

    @classmethod
    def parse(cls, service: str | None = None, frontend: str | None = None) -> Selection:
        """ConfigError naming the flag for a malformed value."""
        name = None
        if service is not None:
            namespace, sep, rest = service.partition("/")
            if not sep or not namespace or not rest or "/" in rest:
                raise ConfigError(f"--service {service!r}: not NAMESPACE/NAME")
            name = NamespacedName(namespace, rest)
        where = None
        if frontend is not None:
            address, _, tail = frontend.rpartition(":")
            port, _, proto = tail.partition("/")
            if address.startswith("[") and address.endswith("]"):
                address = address[1:-1]  # [IPv6]:PORT
            try:
                where = (ip_address(address), int(port), Proto.parse(proto or "TCP"))
            except ValueError:
                raise ConfigError(f"--frontend {frontend!r}: not VIP:PORT/PROTO") from None
            if not 0 < where[1] < 65536:
                raise ConfigError(f"--frontend {frontend!r}: port not in 1-65535")
        return cls(name, where)

    @property
    def everything(self) -> bool:
        return self.service is None and self.frontend is None

    def wants(self, frontend: Frontend, service_name: str) -> bool:
        """`service_name`: the frontend's metadata, "namespace/name:port"."""
        if self.frontend is not None and self.frontend != (
            frontend.address,
            frontend.port,
            frontend.protocol,
        ):
            return False
        return self.service is None or service_name.startswith(f"{self.service}:")


def collect(
    maps: MapSet,
    *,
    tables: bool = False,
    flows: int = FLOWS,
    now_ns: int | None = None,
    select: Selection = Selection(),
) -> dict[str, Any]:
    """The JSON document `maps dump --json` prints. `flows`: conntrack and NAT entries at
    most (0: none); `now_ns`: CLOCK_MONOTONIC now, for their remaining lifetimes; `select`:
    one service's or frontend's rows only (then no datapath-wide counters)."""
    now = time.monotonic_ns() if now_ns is None else now_ns
    backends: dict[int, BackendEntry] = dict(maps.backends.items())
    ranges: dict[int, list[IPNetwork]] = {}
    for source_range, _ in maps.source_ranges.items():
        ranges.setdefault(source_range.svc_id, []).append(source_range.network)
    metas = dict(maps.service_meta.items())
    entries = [
        (frontend, entry)
        for frontend, entry in sorted(
            maps.services.items(), key=lambda item: _frontend_key(item[0])
        )
        if select.everything or select.wants(frontend, metas.get(entry.svc_id, ""))
    ]
    services = _services(maps, entries, metas, backends, ranges, tables=tables)
    conntrack: Iterable[tuple[Flow, ConntrackEntry]] = maps.conntrack.items()
    nat: Iterable[tuple[Flow, NatEntry]] = maps.reply_nat.items()
    if not select.everything:
        used = {be["id"] for s in services for be in s["backends"]}
        backends = {i: be for i, be in backends.items() if i in used}
        svc_ids = {entry.svc_id for _, entry in entries}
        conntrack = (row for row in conntrack if row[1].svc_id in svc_ids)
        # A reply translation names the frontend its client used (not the service).
        addresses = {(AddrPort(f.address, f.port), f.protocol) for f, _ in entries}
        nat = (row for row in nat if (row[1].frontend, row[0].protocol) in addresses)
    slots_used = sum(s["maglev"]["table_size"] for s in services)
    report: dict[str, Any] = {
        "services": services,
        "backends": [
            {"id": backend_id, "address": str(be.backend), "protocol": be.backend.protocol.name}
            | ({"flags": _flag_names(be.flags)} if be.flags else {})
            for backend_id, be in sorted(
                backends.items(), key=lambda kv: _addr_key(backends, kv[0])
            )
        ],
        "summary": {
            "frontends": len(services),
            "backends": len(backends),
            "slots_used": slots_used,
            "slot_pool_size": maps.slots.capacity,
            "slot_memory_bytes": slots_used * np.dtype(np.uint32).itemsize,
        },
        "counters": maps.counters(),
        # IPv4 flows, then IPv6 ones (ebpflb_ct4 then ebpflb_ct6): `flows` at most in all.
        "conntrack": [
            _conntrack_row(flow, entry, now)
            for flow, entry in sorted(_first(conntrack, flows), key=lambda row: row[0].order)
        ],
        "nat": [
            _nat_row(flow, entry, now)
            for flow, entry in sorted(_first(nat, flows), key=lambda row: row[0].order)
        ],
    }
    if not select.everything:
        del report["counters"]  # the datapath's, not this service's
        report["selection"] = {
            "service": str(select.service) if select.service else None,
            "frontend": (
                f"{host_port(select.frontend[0], select.frontend[1])}/{select.frontend[2].name}"
                if select.frontend
                else None
            ),
        }
    return report


def _first(rows: Iterable[T], count: int) -> Iterator[T]:
    return itertools.islice(rows, count)


def _services(
    maps: MapSet,
    entries: list[tuple[Frontend, ServiceEntry]],
    metas: dict[int, str],
    backends: dict[int, BackendEntry],
    ranges: dict[int, list[IPNetwork]],
    *,
    tables: bool,
) -> list[dict[str, Any]]:
    services = []
    for frontend, entry in entries:
        table = maps.slots.read(entry.table_off, entry.table_size) if entry.table_size else None
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
        service: dict[str, Any] = {
            "frontend": str(frontend),
            "service": metas.get(entry.svc_id, ""),
            "type": entry.flags.type_name(),
            "svc_id": entry.svc_id,
            "backends": listed,
            "maglev": maglev,
        }
        if entry.flags & ~_TYPE_FLAGS:
            service["flags"] = [
                f.name.lower() for f in SvcFlags if f in entry.flags & ~_TYPE_FLAGS and f.name
            ]
        if entry.svc_id in ranges:
            networks = sorted(ranges[entry.svc_id], key=network_order)
            service["source_ranges"] = [str(n) for n in networks]
        services.append(service)
    return services


def _conntrack_row(flow: Flow, entry: ConntrackEntry, now_ns: int) -> dict[str, Any]:
    return {
        "proto": flow.protocol.name,
        "client": str(flow.source),
        "frontend": str(flow.destination),
        "backend": str(entry.backend),
        "snat": str(entry.snat) if entry.snat else None,
        "flags": [f.name.lower() for f in CtFlags if f in entry.flags and f.name],
        "svc_id": entry.svc_id,
        "expires_in": _seconds_left(entry.expires_ns, now_ns),
        "packets": entry.packets,
        "bytes": entry.bytes,
    }


def _nat_row(flow: Flow, entry: NatEntry, now_ns: int) -> dict[str, Any]:
    return {
        "proto": flow.protocol.name,
        "backend": str(flow.source),
        "reply_to": str(flow.destination),
        "client": str(entry.client),
        "frontend": str(entry.frontend),
        "snat": bool(entry.flags & NatFlags.SNAT),
        "expires_in": _seconds_left(entry.expires_ns, now_ns),
    }


def _seconds_left(deadline_ns: int, now_ns: int) -> float:
    return round((deadline_ns - now_ns) / 1e9, 1)


def _addr_key(backends: dict[int, BackendEntry], backend_id: int) -> tuple[int, int, int, int]:
    be = backends.get(backend_id)
    if be is None:
        return (1, 0, 0, backend_id)
    address = be.backend.address
    return (0, address.version, int(address), be.backend.port)


def _frontend_key(frontend: Frontend) -> tuple[int, int, int, int, int]:
    """Frontend's own order, IPv4 before IPv6 (addresses of two families do not compare)."""
    address = frontend.address
    return (address.version, int(address), frontend.port, frontend.protocol, frontend.scope)


def _flag_names(flags: BackendFlags) -> list[str]:
    return [f.name.lower() for f in BackendFlags if f and f in flags and f.name]


def render_text(report: dict[str, Any]) -> str:
    """An aligned table: one line per backend, the frontend columns on its first line;
    then the counters, conntrack and NAT entries."""
    header = ("FRONTEND", "SERVICE", "TYPE", "SLOTS", "BACKEND (SLOTS)")
    rows: list[tuple[str, ...]] = []
    for svc in report["services"]:
        size = str(svc["maglev"]["table_size"])
        kind = svc["type"]
        if svc.get("flags"):
            kind += f" [{','.join(svc['flags'])}]"
        if svc.get("source_ranges"):
            kind += f" (from {','.join(svc['source_ranges'])})"
        first = (svc["frontend"], svc["service"] or "?", kind, size)
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
    selection = report.get("selection")
    if selection:
        only = [f"{k} {v}" for k, v in selection.items() if v]
        lines.append(f"(only {' and '.join(only)}: datapath counters left out)")
    counted = {k: v for k, v in sorted(report.get("counters", {}).items()) if v}
    if counted:
        lines.append("datapath: " + ", ".join(f"{k}={v}" for k, v in counted.items()))
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
