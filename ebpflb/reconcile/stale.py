"""Stale UDP flows: when a UDP backend leaves a frontend (NodePort, LoadBalancer, external
IP, or any one the per-packet path on pods' interfaces translates, ClusterIPs included), its
conntrack entries (and their reply translations) are deleted, so the next datagram of
such a flow starts over on a live backend instead of going into the void until the entry
idles out (kube-proxy deletes the kernel's conntrack entries for the same reason:
pkg/proxy/conntrack, kubernetes#59368). TCP flows keep their backend: they end when it
stops answering, as with kube-proxy.

This reads both conntrack maps whole, so it runs only when a UDP frontend lost a backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from ebpflb.datapath.maps import AddrPort, Flow, MapSet
from ebpflb.model import Proto

# service id -> backends (address, port) that left its table
Left = Mapping[int, Set[AddrPort]]


def purge_udp_flows(maps: MapSet, left: Left) -> dict[str, int]:
    """Delete the UDP conntrack entries (and the reply translations they own) of the
    backends in `left`, IPv4 and IPv6 alike (a frontend's flows and backends are of its
    family); the flows deleted by conntrack table (ebpflb_ct4, ebpflb_ct6)."""
    if not left:
        return {}
    doomed = [
        (flow, entry)
        for flow, entry in maps.conntrack.items()
        if flow.protocol is Proto.UDP
        and entry.svc_id in left
        and entry.backend in left[entry.svc_id]
    ]
    deleted: dict[str, int] = {}
    for flow, entry in doomed:
        maps.conntrack.delete(flow)
        table = maps.conntrack.twin(flow.family).name
        deleted[table] = deleted.get(table, 0) + 1
        reply = Flow(entry.backend, entry.snat or flow.source, Proto.UDP)
        nat = maps.reply_nat.get(reply)
        if nat is not None and nat.client == flow.source and nat.frontend == flow.destination:
            maps.reply_nat.delete(reply)
    return deleted
