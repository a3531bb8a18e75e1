"""The datapath's decisions for one connection or packet, mirrored from the C code and
computed from the maps (read only).

Each step function mirrors one decision of bpf/sock_lb.c (`Path.SOCKET`) or
bpf/lib/nodeport.h (`Path.OUTSIDE`; `Path.POD`, its pod-interface build, in pod.py), in
the order the C code takes them, and either
records what it found and returns None (go on) or returns the final Explanation. A new
datapath step is one more function in SOCKET_STEPS/OUTSIDE_STEPS at the place the C code
has it. Over 400 lines: the two paths share most steps, and splitting them across modules
would hide the C order this file exists to show.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from ipaddress import ip_address

from ebpflb.datapath.contract import CtFlags, NatFlags
from ebpflb.datapath.maps import (
    PRIMARY_IFINDEX,
    AddrPort,
    BackendEntry,
    Flow,
    MapSet,
    ServiceEntry,
    network_order,
)
from ebpflb.explain.affinity import AffinityEntry, AffinityKey, AffinityTable
from ebpflb.explain.flowhash import flow_hash, mix64
from ebpflb.explain.model import (
    Affinity,
    AffinityClient,
    Candidate,
    Explanation,
    MatchedFrontend,
    Nat,
    Path,
    Query,
    Selection,
    Step,
    Verdict,
)
from ebpflb.model import BackendFlags, Frontend, IPAddress, Proto, Scope, SvcFlags

TYPE_FLAGS = SvcFlags.CLUSTER_IP | SvcFlags.EXTERNAL
MASK64 = (1 << 64) - 1
NSEC_PER_SEC = 1_000_000_000  # EBPFLB_NSEC_PER_SEC


@dataclass(frozen=True, slots=True)
class Settings:
    """What the programs were compiled with that the maps do not hold."""

    flow_hash_seed: int  # Config.flow_hash_seed, from the cluster-wide --hash-seed
    # The agent's --snat-port-range, when known (the first SNAT port tried is then named).
    snat_ports: tuple[int, int] | None = None
    ifindex: Callable[[str], int] | None = None  # interface name -> index (socket.if_nametoindex)
    # The interface the route to an address leaves by (`ip route get`), when known: the
    # SNAT source is that interface's address, as the programs find it.
    egress: Callable[[IPAddress], int | None] | None = None
    now_ns: int | None = None  # CLOCK_MONOTONIC now (conntrack deadlines)


@dataclass(slots=True)
class Work:
    """What the steps found so far."""

    query: Query
    maps: MapSet
    settings: Settings
    steps: list[Step] = field(default_factory=list)
    frontend: Frontend | None = None
    entry: ServiceEntry | None = None
    matched: MatchedFrontend | None = None
    candidates: list[Candidate] = field(default_factory=list)
    selection: Selection | None = None
    backend: Candidate | None = None
    nat: Nat | None = None
    affinity_table: AffinityTable | None = None  # ebpflb_aff4; None: not read
    affinity: Affinity | None = None

    @property
    def now_ns(self) -> int:
        """CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns()."""
        now = self.settings.now_ns
        return now if now is not None else time.monotonic_ns()

    def note(self, name: str, outcome: str) -> None:
        self.steps.append(Step(name, outcome))

    def done(self, verdict: Verdict, reason: str) -> Explanation:
        counters = None
        if self.entry is not None:
            counters = self.maps.service_counters.get(self.entry.svc_id)
        return Explanation(
            self.query,
            verdict,
            reason,
            self.steps,
            self.matched,
            self.selection,
            self.backend,
            self.candidates,
            self.nat,
            counters,
            self.affinity,
        )

    @property
    def flow(self) -> Flow | None:
        """The packet's 5-tuple, when the client's port is known."""
        q = self.query
        if q.client_port is None:
            return None
        return Flow(AddrPort(q.client, q.client_port), AddrPort(q.address, q.port), q.protocol)


StepFn = Callable[[Work], Explanation | None]


# ---- steps shared by both paths -----------------------------------------------------------


def lookup_frontend(work: Work) -> Explanation | None:
    """lb4_lookup_service(..., LB_SCOPE_EXTERNAL): the entry every hook looks up first."""
    q = work.query
    frontend = Frontend(q.address, q.port, q.protocol, Scope.EXTERNAL)
    entry = work.maps.services.get(frontend)
    if entry is None:
        table = "ebpflb_svc4" if frontend.address.version == 4 else "ebpflb_svc6"
        work.note("frontend", f"{frontend} is not in {table}" + not_a_frontend(work))
        verb = "connect()/sendmsg() proceeds" if q.path is Path.SOCKET else "the packet passes"
        return work.done(Verdict.NOT_TRANSLATED, f"not a frontend: {verb} untranslated")
    use_entry(work, frontend, entry)
    return None


def not_a_frontend(work: Work) -> str:
    """Why an address a client uses may have no entry: --nodeport-addresses left this node
    address out, or a LoadBalancer ingress IP in ipMode Proxy (never programmed)."""
    q = work.query
    nodeports, known = set(), False
    for frontend, entry in work.maps.services.items():
        known = known or frontend.address == q.address
        if (frontend.port, frontend.protocol) == (q.port, q.protocol) and (
            entry.flags & SvcFlags.NODE_PORT
        ):
            nodeports.add(frontend.address)
    if nodeports:
        where = ", ".join(str(a) for a in sorted(nodeports, key=lambda a: (a.version, int(a))))
        return (
            f"; port {q.port}/{q.protocol.name} is a NodePort on {where} only"
            " (--nodeport-addresses: the node addresses NodePorts answer on)"
        )
    if not known:
        return (
            f"; no frontend has the address {q.address} (a LoadBalancer ingress IP with"
            " ipMode: Proxy is never programmed: its traffic goes out to the load balancer)"
        )
    return ""


def use_entry(work: Work, frontend: Frontend, entry: ServiceEntry) -> None:
    work.frontend, work.entry = frontend, entry
    work.matched = MatchedFrontend(
        str(frontend),
        work.maps.service_meta.get(entry.svc_id) or "?",
        entry.flags.type_name(),
        frontend.scope.name.lower(),
        entry.svc_id,
        [f.name.lower() for f in SvcFlags if f & entry.flags and not f & TYPE_FLAGS and f.name],
        entry.table_off,
        entry.table_size,
    )
    policies = [
        text
        for flag, text in (
            (SvcFlags.ITP_LOCAL, "internalTrafficPolicy: Local, this node's endpoints only"),
            (SvcFlags.ETP_LOCAL, "externalTrafficPolicy: Local, this node's endpoints only"),
            (SvcFlags.AFFINITY, "sessionAffinity: ClientIP"),
        )
        if entry.flags & flag
    ]
    work.note(
        "frontend" if frontend.scope is Scope.EXTERNAL else "internal scope",
        f"{frontend}: {work.matched.service} ({work.matched.type}), service id {entry.svc_id},"
        f" {entry.backend_count} backends in a table of M={entry.table_size}"
        + "".join(f"; {p}" for p in policies),
    )
    work.candidates = candidates(work.maps, entry)


def lookup_frontend_in_node(work: Work) -> Explanation | None:
    """lb4_lookup_service_in_node(): the external entry, then, when it has
    SVC_F_INTERNAL_SCOPE (externalTrafficPolicy: Local), the internal one: in-node clients
    reach every endpoint, as kube-proxy sends in-cluster traffic to external addresses to
    the cluster-wide chain."""
    found = lookup_frontend(work)
    entry = work.entry
    if found is not None or entry is None or not entry.flags & SvcFlags.INTERNAL_SCOPE:
        return found
    q = work.query
    inside = Frontend(q.address, q.port, q.protocol, Scope.INTERNAL)
    internal = work.maps.services.get(inside)
    if internal is None:
        work.note(
            "internal scope",
            f"{inside} is missing (being written): the external entry stays in use",
        )
        return None
    use_entry(work, inside, internal)
    work.steps[-1] = Step(
        "internal scope",
        "SVC_F_INTERNAL_SCOPE (externalTrafficPolicy: Local): in-node clients use the"
        f" internal entry, every endpoint of the service: {work.steps[-1].outcome}",
    )
    return None


def candidates(maps: MapSet, entry: ServiceEntry) -> list[Candidate]:
    """Every backend of the frontend's Maglev table with its number of slots."""
    if not entry.table_size:
        return []
    table = maps.slots.read(entry.table_off, entry.table_size)
    found = []
    for backend_id, slots in sorted(Tally(table.tolist()).items()):
        be = maps.backends.get(backend_id) if backend_id else None
        found.append(candidate(backend_id, be, slots, entry.table_size))
    return sorted(found, key=lambda c: c.backend)


def candidate(backend_id: int, be: BackendEntry | None, slots: int, size: int) -> Candidate:
    name = str(be.backend) if be is not None else "(missing backend: a slot miss)"
    flags = be.flags if be is not None else BackendFlags.NONE
    return Candidate(
        name,
        backend_id,
        slots,
        round(slots / size, 6),
        bool(flags & BackendFlags.LOCAL),
        bool(flags & BackendFlags.TERMINATING),
    )


def table(work: Work) -> Explanation | None:
    """lb_select_backend()'s first test: table_size 0 means no usable backend (before
    any affinity: lb4_pick_backend() goes straight to it then)."""
    entry, q = work.entry, work.query
    assert entry is not None
    if entry.table_size:
        return None
    why = "no usable endpoint"
    if q.path is Path.OUTSIDE and entry.flags & SvcFlags.ETP_LOCAL:
        why += " on this node (externalTrafficPolicy: Local)"
    elif entry.flags & SvcFlags.ITP_LOCAL:
        why += " on this node (internalTrafficPolicy: Local)"
    work.note("table", f"empty (M=0): {why}")
    if q.path is Path.POD:
        return work.done(
            Verdict.REJECTED,
            f"{why}: answered with a TCP RST or ICMP port unreachable from the frontend, as"
            " socket-LB refuses such a connect(); the client fails at once (ECONNREFUSED)",
        )
    if q.path is Path.SOCKET:
        return work.done(
            Verdict.REFUSED,
            f"{why}: the call fails with ECONNREFUSED (EPERM on kernels before 5.18),"
            " as kube-proxy's REJECT rule; counted as refused",
        )
    if not entry.flags & SvcFlags.REJECT:
        if entry.flags & SvcFlags.ETP_LOCAL:
            why += ", endpoints on other nodes only (as kube-proxy: dropped, not rejected)"
        return work.done(Verdict.DROPPED, f"{why}: the packet is dropped (np_no_backend)")
    answer = (
        "a TCP RST from the frontend (a RST segment, or one with IP options, is dropped instead)"
        if q.protocol is Proto.TCP
        else "an ICMP port unreachable from the frontend (packets with IP options are"
        " dropped instead)"
    )
    work.note(
        "reject",
        "SVC_F_REJECT: no endpoint in the whole service; tc answers (XDP passes the packet"
        " to tc), counted np_reject and np_no_backend",
    )
    return work.done(
        Verdict.REJECTED,
        f"no endpoint anywhere: answered with {answer}, as kube-proxy's REJECT; the client"
        " fails at once (ECONNREFUSED)",
    )


def affinity(work: Work) -> Explanation | None:
    """lb4_pick_backend() with SVC_F_AFFINITY: lb_affinity_backend() follows the client's
    ebpflb_aff4 entry while ebpflb_affpair4 holds (service, backend) and the timeout has
    not passed since its last new connection; else the Maglev choice below, which is then
    remembered as the client's entry (either way the entry's time becomes now)."""
    entry, q = work.entry, work.query
    assert entry is not None
    if not entry.flags & SvcFlags.AFFINITY:
        return None
    socket = q.path is Path.SOCKET
    keyed_by = "network namespace" if socket else "source address"
    if socket:
        cookie = q.netns_cookie
        key = None if cookie is None else AffinityKey(cookie, entry.svc_id)
    else:  # tc/XDP: the source address, an IPv6 one folded to 64 bits (addr6_fold)
        key = AffinityKey.for_source(q.client, entry.svc_id)
        if q.client.version == 6:
            keyed_by = f"source address ({q.client} folded, addr6_fold)"
    timeouts = {
        m.backend_id: t for m, t in work.maps.affinity_match.items() if m.svc_id == entry.svc_id
    }
    timeout = next(iter(timeouts.values()), None)
    table = work.affinity_table
    if table is None:
        shown = None if key is None else str(key)
        work.affinity = Affinity(keyed_by, shown, timeout, "not read")
        work.note("affinity", "ebpflb_aff4 not read: the client's entry may decide")
        return None
    if key is None:
        views = [
            affinity_view(work, key, value, timeouts)
            for key, value in table.items()
            if key.svc_id == entry.svc_id and key.netns
        ]
        work.affinity = Affinity(keyed_by, None, timeout, "unknown", views)
        followed = [v for v in views if v.followed]
        listed = "; ".join(
            f"{v.client} -> {v.backend} ({'fresh' if v.followed else why_not(v)})"
            for v in views[:8]
        ) + ("; ..." if len(views) > 8 else "")
        work.note(
            "affinity",
            f"keyed by the client's network namespace (bpf_get_netns_cookie): {len(views)}"
            f" entries for service id {entry.svc_id}, {len(followed)} fresh"
            + (f": {listed}" if views else "")
            + "; the client's netns decides (give --netns-cookie): a fresh entry's backend,"
            " else the choice below",
        )
        return None
    value = table.get(key)
    if value is None:
        work.affinity = Affinity(keyed_by, str(key), timeout, "miss")
        work.note(
            "affinity",
            f"no entry for {key} (service id {entry.svc_id}): the choice below,"
            " remembered as its affinity",
        )
        return None
    view = affinity_view(work, key, value, timeouts)
    if not view.followed:
        work.affinity = Affinity(keyed_by, str(key), timeout, "miss", [view])
        work.note(
            "affinity",
            f"entry of {key}: {view.backend}, {why_not(view)}: ignored; the choice below"
            " replaces it",
        )
        return None
    work.affinity = Affinity(keyed_by, str(key), timeout, "hit", [view])
    work.backend = next((c for c in work.candidates if c.backend_id == value.backend_id), None)
    if work.backend is None:  # in ebpflb_affpair4 but not in the table: still followed
        be = work.maps.backends.get(value.backend_id)
        work.backend = candidate(value.backend_id, be, 0, entry.table_size)
    flow = work.flow
    hash_value = flow_hash(flow, work.settings.flow_hash_seed) if flow and not socket else None
    work.selection = Selection(f"affinity entry of {key}", True, hash_value, from_affinity=True)
    work.note(
        "affinity",
        f"entry of {key}: {view.backend}, used {view.age_s:.0f} s ago"
        f" (timeout {timeouts[value.backend_id]} s),"
        " still the frontend's: followed (affinity_hit), its time becomes now",
    )
    return None


def affinity_view(
    work: Work, key: AffinityKey, value: AffinityEntry, timeouts: dict[int, int]
) -> AffinityClient:
    """lb_affinity_backend()'s tests on one entry."""
    age_ns = (work.now_ns - value.last_used_ns) & MASK64  # the C code's u64 subtraction
    timeout = timeouts.get(value.backend_id)
    fresh = timeout is not None and age_ns <= timeout * NSEC_PER_SEC
    if timeout is None:  # the timeout is the frontend's, shared by its matches
        any_timeout = next(iter(timeouts.values()), None)
        fresh = any_timeout is not None and age_ns <= any_timeout * NSEC_PER_SEC
    be = work.maps.backends.get(value.backend_id)
    name = str(be.backend) if be is not None else f"(backend id {value.backend_id}, gone)"
    matched = timeout is not None
    return AffinityClient(
        str(key),
        name,
        value.backend_id,
        round(age_ns / NSEC_PER_SEC, 3),
        fresh,
        matched,
        fresh and matched and be is not None,
    )


def why_not(view: AffinityClient) -> str:
    if not view.matched:
        return "no longer one of the frontend's backends (not in ebpflb_affpair4)"
    if not view.fresh:
        return f"expired ({view.age_s:.0f} s since its last new connection)"
    return "its backend is gone from ebpflb_be4 (ebpflb_be6 for IPv6)"


def pick(work: Work, hash_value: int | None, inputs: str) -> Explanation | None:
    """Slot hash % M of the table, its backend id, the backend (lb_select_backend())."""
    entry = work.entry
    assert entry is not None
    if hash_value is None:
        work.selection = Selection(inputs, deterministic=False)
        shares = ", ".join(f"{c.backend} {c.share:.1%}" for c in work.candidates)
        work.note("selection", f"{inputs}: not reproducible here; any of {shares}")
        return None
    slot = hash_value % entry.table_size
    pool_slot = entry.table_off + slot
    work.selection = Selection(inputs, True, hash_value, slot, pool_slot)
    (backend_id,) = work.maps.slots.read(pool_slot, 1).tolist()
    be = work.maps.backends.get(backend_id) if backend_id else None
    chosen = next((c for c in work.candidates if c.backend_id == backend_id), None)
    if be is None or chosen is None:
        work.note("selection", f"hash {hash_value:#010x} -> slot {slot}: empty or unknown")
        verdict = Verdict.REFUSED if work.query.path is Path.SOCKET else Verdict.DROPPED
        return work.done(verdict, "slot miss (a control-plane ordering bug): counted slot_miss")
    work.backend = chosen
    work.note(
        "selection",
        f"hash {hash_value:#010x} % {entry.table_size} = slot {slot} (pool slot {pool_slot})"
        f" -> backend id {backend_id}: {chosen.backend}",
    )
    return None


# ---- socket-LB (bpf/sock_lb.c) --------------------------------------------------------------


def socket_select(work: Work) -> Explanation | None:
    q = work.query
    if work.selection is not None and work.selection.from_affinity:
        return None
    if q.protocol is Proto.UDP and not q.connected:
        inputs = "mix64(socket cookie) (sendmsg4: every datagram of one socket, one backend)"
        cookie = q.socket_cookie
        return pick(work, mix64(cookie) if cookie is not None else None, inputs)
    return pick(work, None, "bpf_get_prandom_u32() at connect() (connect4: a random slot)")


def socket_nat(work: Work) -> Explanation | None:
    work.nat = Nat(
        False,
        "socket-LB rewrites the socket's destination at connect()/sendmsg(): packets carry"
        " the backend's address from the start, the source stays the client's;"
        " getpeername()/recvmsg() show the frontend",
    )
    backend = work.backend.backend if work.backend else "one of the candidates"
    return work.done(Verdict.TRANSLATED, f"destination rewritten to {backend}, no NAT")


SOCKET_STEPS: Sequence[StepFn] = (
    lookup_frontend_in_node,
    table,
    affinity,
    socket_select,
    socket_nat,
)


# ---- tc/XDP ingress (bpf/lib/nodeport.h np4_ingress) ---------------------------------------


def reply_of_snat(work: Work) -> Explanation | None:
    """Replies to SNATed flows come back to a port of the SNAT range."""
    ports, flow = work.settings.snat_ports, work.flow
    if flow is None or (ports is not None and not ports[0] <= work.query.port <= ports[1]):
        return None  # (any SNAT reservation is inside the agent's range)
    nat = work.maps.reply_nat.get(flow)
    if nat is None or not nat.flags & NatFlags.SNAT:
        return None
    work.note("reply", f"{flow.destination} is the SNAT port of a flow of {nat.client}")
    return work.done(Verdict.REPLY, f"reply translated: from {nat.frontend} to {nat.client}")


def outside_frontend(work: Work) -> Explanation | None:
    """Only NodePort, LoadBalancer and external-IP frontends serve outside traffic."""
    assert work.entry is not None
    if work.entry.flags & SvcFlags.EXTERNAL:
        return None
    work.note("scope", "a ClusterIP frontend: never served to traffic from outside")
    return work.done(Verdict.NOT_TRANSLATED, "ClusterIP from outside: the packet passes")


def source_ranges(work: Work) -> Explanation | None:
    entry = work.entry
    assert entry is not None
    if not entry.flags & SvcFlags.SOURCE_RANGES:
        return None
    # The frontend's family's map (ebpflb_srcrng4 or ebpflb_srcrng6): a frontend only has
    # ranges of its own family (desired.py), and an address is in no network of the other.
    client = work.query.client
    table = work.maps.source_ranges.twin(client.version)
    allowed = sorted(
        (r.network for r, _ in table.items() if r.svc_id == entry.svc_id), key=network_order
    )
    match = next((n for n in allowed if client in n), None)
    if match is not None:
        work.note("source ranges", f"{client} is in {match} ({table.name}): allowed")
        return None
    listed = ", ".join(map(str, allowed)) or f"nothing (no entry in {table.name})"
    work.note("source ranges", f"{client} is in none of {listed}")
    return work.done(Verdict.DROPPED, "source outside loadBalancerSourceRanges: dropped")


def conntrack(work: Work) -> Explanation | None:
    """ct4_lookup() + np4_flow_continue() (their IPv6 twins in ebpflb_ct6 for an IPv6
    flow): a live flow keeps its backend and SNAT."""
    flow = work.flow
    if flow is None:
        return None
    ct = work.maps.conntrack.get(flow)
    now = work.settings.now_ns if work.settings.now_ns is not None else time.monotonic_ns()
    if ct is None or ct.expires_ns < now:
        work.note("conntrack", "no live flow for this 5-tuple: a new flow")
        return None
    if ct.snat is not None:
        reply = work.maps.reply_nat.get(Flow(ct.backend, ct.snat, flow.protocol))
        if reply is None or (reply.client, reply.frontend) != (flow.source, flow.destination):
            work.note("conntrack", "flow found, but its SNAT port is no longer its own: new flow")
            return None
    left = (ct.expires_ns - now) / 1e9
    work.note("conntrack", f"live flow ({left:.0f} s left): backend {ct.backend} kept")
    work.selection = Selection("conntrack entry of this 5-tuple", True, from_conntrack=True)
    work.backend = next((c for c in work.candidates if c.backend == str(ct.backend)), None)
    if work.backend is None:  # the backend left the service: the flow keeps it anyway
        work.backend = Candidate(str(ct.backend), ct.backend_id, 0, 0.0, False, False)
    snat = ct.snat is not None and bool(ct.flags & CtFlags.SNAT)
    work.nat = Nat(snat, "as when the flow started", str(ct.snat) if ct.snat else None)
    return work.done(Verdict.TRANSLATED, f"existing flow: to {ct.backend}")


def outside_select(work: Work) -> Explanation | None:
    if work.selection is not None and work.selection.from_affinity:
        return None
    flow, q = work.flow, work.query
    seed = work.settings.flow_hash_seed
    inputs = (
        f"jhash(client, frontend, ports ^ proto, seed {seed:#x})"
        if q.client.version == 4
        else f"jhash chained over client, frontend, ports ^ proto (flow6_hash, seed {seed:#x})"
    )
    if flow is None:
        return pick(work, None, inputs + " of the 5-tuple: depends on the client's port")
    return pick(work, flow_hash(flow, seed), inputs)


def outside_nat(work: Work) -> Explanation | None:
    entry, chosen = work.entry, work.backend
    assert entry is not None
    if entry.flags & SvcFlags.ETP_LOCAL:
        work.nat = Nat(False, "externalTrafficPolicy: Local: the client's address is kept")
    elif chosen is not None and chosen.local:
        work.nat = Nat(False, "the backend runs on this node: DNAT only, replies pass here")
    elif chosen is None and all(c.local for c in work.candidates):
        work.nat = Nat(False, "every candidate runs on this node: DNAT only")
    else:
        backend = candidate_address(chosen) if chosen is not None else None
        address = node_address(work, backend)
        if address is None and chosen is not None:
            work.note("nat", "no node address for the interface the backend is reached by")
            return work.done(Verdict.DROPPED, "SNAT needed, no node address: dropped")
        first = None
        sel, ports = work.selection, work.settings.snat_ports
        if sel is not None and sel.hash is not None and ports is not None:
            first = ports[0] + sel.hash % (ports[1] - ports[0] + 1)
        remote = "the backend runs on another node" if chosen else "SNAT if the backend"
        if chosen is None:
            remote += " chosen runs on another node (the candidates not marked local)"
        family = "" if work.query.client.version == 4 else "IPv6 "
        work.nat = Nat(
            True,
            f"{remote} (externalTrafficPolicy: Cluster): SNAT to the node's {family}address"
            " on the interface the route to the backend leaves by, as kube-proxy's"
            " masquerade (the primary address for one without)",
            str(address) if address is not None else "the egress interface's address",
            first,
        )
    work.note("nat", work.nat.reason)
    target = chosen.backend if chosen is not None else "one of the candidates"
    return work.done(Verdict.TRANSLATED, f"DNAT to {target}" + (", SNAT" if work.nat.snat else ""))


def candidate_address(chosen: Candidate) -> IPAddress:
    """A candidate's address, from its "IP:PORT" ("[IPv6]:PORT")."""
    return ip_address(chosen.backend.rsplit(":", 1)[0].strip("[]"))


def node_address(work: Work, backend: IPAddress | None) -> IPAddress | None:
    """The SNAT source, as the programs pick it (snat4_source): the entry of the interface
    the route to the backend leaves by, else the primary entry (ebpflb_ifaddr4 or
    ebpflb_ifaddr6); without a route lookup, the one address all entries share."""
    addresses = work.maps.interface_addresses().of(work.query.client.version)
    route = work.settings.egress
    if backend is not None and route is not None:
        egress = route(backend)
        if egress is not None and egress in addresses:
            return addresses[egress]
        return addresses.get(PRIMARY_IFINDEX)
    distinct = set(addresses.values())
    return distinct.pop() if len(distinct) == 1 else None


OUTSIDE_STEPS: Sequence[StepFn] = (
    reply_of_snat,
    lookup_frontend,
    outside_frontend,
    source_ranges,
    conntrack,
    table,
    affinity,
    outside_select,
    outside_nat,
)
