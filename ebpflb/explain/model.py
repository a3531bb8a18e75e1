"""What `ebpflb explain` is asked and what it answers: plain values, rendered as text
(render.py) or JSON (`Explanation.to_json`)."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from ipaddress import IPv6Address, ip_address
from typing import Any

from ebpflb.datapath.maps import ServiceCounters
from ebpflb.errors import ConfigError
from ebpflb.model import IPAddress, Proto, host_port


class Path(enum.Enum):
    """Which program sees the connection."""

    # A process on the node or in a pod calls connect() (TCP, connected UDP) or sendmsg()
    # (unconnected UDP): socket-LB, cgroup programs.
    SOCKET = "socket"
    # A packet arrives on one of the node's interfaces: the tc/XDP ingress program.
    OUTSIDE = "outside"
    # A pod sends a packet no socket hook translated: the per-packet path on its interface
    # (--pod-interfaces; bpf/nodeport.c built with EBPFLB_POD_PATH).
    POD = "pod"


class Verdict(enum.Enum):
    NOT_TRANSLATED = "not translated"  # not a frontend (for this path): left alone
    TRANSLATED = "translated"  # to a backend
    REFUSED = "refused"  # socket-LB: the syscall fails (ECONNREFUSED, EPERM before 5.18)
    DROPPED = "dropped"  # tc/XDP: the packet is dropped
    REJECTED = "rejected"  # tc: answered with a TCP RST or ICMP port unreachable (REJECT)
    REPLY = "reply translated"  # a reply of a SNATed flow, sent back to its client


@dataclass(frozen=True, slots=True)
class Query:
    client: IPAddress
    client_port: int | None  # None: any source port (the choice may depend on it)
    address: IPAddress  # of the client's family from outside (IPv4-mapped: socket-LB only)
    port: int
    protocol: Proto
    path: Path = Path.SOCKET
    ingress: str | None = None  # interface the packet arrives on (Path.OUTSIDE)
    connected: bool = True  # UDP over socket-LB: connect() (True) or sendmsg() to an address
    socket_cookie: int | None = None  # unconnected UDP: the socket's cookie, when known
    # Socket-LB: the client's network namespace cookie (SO_NETNS_COOKIE), which keys its
    # session affinity; None: not known.
    netns_cookie: int | None = None

    def __str__(self) -> str:
        client = host_port(self.client, self.client_port) if self.client_port else str(self.client)
        return f"{client} -> {host_port(self.address, self.port)}/{self.protocol.name}"


def parse_query(
    client: str,
    target: str,
    *,
    outside: bool = False,
    ingress: str | None = None,
    pod: bool = False,
    sendmsg: bool = False,
    socket_cookie: int | None = None,
    netns_cookie: int | None = None,
) -> Query:
    """CLIENT ("IP" or "IP:PORT") and "VIP:PORT[/PROTO]" (TCP by default) as a Query;
    ConfigError naming the argument when one is not that."""
    client_ip, client_port = _split(client)
    address, sep, rest = target.rpartition(":") if target.startswith("[") else target.partition(":")
    if address.startswith("["):
        address, rest = address[1:].removesuffix("]"), rest
    port, _, proto = rest.partition("/")
    if sendmsg and (proto or "TCP").upper() != "UDP":
        raise ConfigError(f"explain {target}: --sendmsg is for UDP (sendmsg4 sees UDP only)")
    per_packet = outside or ingress is not None or pod
    if netns_cookie is not None and per_packet:
        raise ConfigError(
            f"explain {target}: --netns-cookie is for socket-LB (tc/XDP key affinity by the"
            " client's address)"
        )
    try:
        vip, source = ip_address(address), ip_address(client_ip)
        mapped = vip.ipv4_mapped if isinstance(vip, IPv6Address) else None
        if per_packet and (mapped is not None or vip.version != source.version):
            # A packet's two addresses are of one family; ::ffff:a.b.c.d is a dual-stack
            # socket's spelling, never on the wire.
            raise ValueError(
                "from outside, the client and the frontend are of one family (an IPv4-mapped"
                " address is a socket's view: give the IPv4 address)"
            )
        if mapped is not None:
            vip = mapped  # a dual-stack socket's ::ffff:a.b.c.d: the IPv4 tables decide
        return Query(
            source,
            _port(client_port, "CLIENT") if client_port else None,
            vip,
            _port(port if sep else "", "VIP:PORT"),
            Proto.parse(proto or "TCP"),
            Path.POD if pod else Path.OUTSIDE if outside or ingress else Path.SOCKET,
            ingress,
            connected=not sendmsg,
            socket_cookie=socket_cookie,
            netns_cookie=netns_cookie,
        )
    except ValueError as exc:
        raise ConfigError(f"explain {client} {target}: {exc}") from None


def _split(text: str) -> tuple[str, str]:
    """IP, IP:PORT, IPv6 or [IPv6]:PORT -> (IP, PORT or "")."""
    if text.startswith("["):
        address, _, port = text[1:].partition("]")
        return address, port.removeprefix(":")
    if text.count(":") > 1:
        return text, ""  # a bare IPv6 address
    address, _, port = text.partition(":")
    return address, port


def _port(text: str, what: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{what}: {text!r} is not a port (1-65535)")
    return int(text)


@dataclass(frozen=True, slots=True)
class Step:
    """One decision the datapath takes, in order: what it looked at, what it found."""

    name: str
    outcome: str


@dataclass(frozen=True, slots=True)
class MatchedFrontend:
    frontend: str  # "VIP:PORT/PROTO"
    service: str  # "namespace/name:port"
    type: str  # ClusterIP, NodePort, LoadBalancer, ExternalIP
    scope: str  # which backend set the entry describes (external: all usable ones)
    svc_id: int
    flags: list[str]
    table_off: int
    table_size: int  # M; 0: no usable backend


@dataclass(frozen=True, slots=True)
class Candidate:
    """A backend the selection may pick, with its share of the Maglev table."""

    backend: str  # "IP:PORT"
    backend_id: int
    slots: int
    share: float  # slots / M: the probability for a uniformly random hash
    local: bool  # runs on this node
    terminating: bool


@dataclass(frozen=True, slots=True)
class Selection:
    """How the backend is chosen: the hash, whether it is reproducible here, the slot."""

    hash_inputs: str
    deterministic: bool
    hash: int | None = None
    slot: int | None = None  # index in the table (0..M-1)
    pool_slot: int | None = None  # table_off + slot, in ebpflb_slots
    from_conntrack: bool = False  # an existing flow keeps the backend it has
    from_affinity: bool = False  # the client's session-affinity entry decides


@dataclass(frozen=True, slots=True)
class Nat:
    snat: bool
    reason: str
    source: str | None = None  # what the client's address becomes ("IP", port dynamic)
    first_port: int | None = None  # first SNAT port tried (a live flow's port is skipped)


@dataclass(frozen=True, slots=True)
class AffinityClient:
    """One entry of ebpflb_aff4 for the frontend, and whether lb_affinity_backend() would
    follow it now."""

    client: str  # the source address, or "netns cookie N"
    backend: str  # "IP:PORT"; "(backend id N, gone)" when ebpflb_be4 lacks it
    backend_id: int
    age_s: float  # since its last new connection
    fresh: bool  # age within the timeout
    matched: bool  # ebpflb_affpair4 holds (service id, backend id): still the frontend's
    followed: bool  # fresh, matched and the backend exists: the next connection goes there


@dataclass(frozen=True, slots=True)
class Affinity:
    """sessionAffinity: ClientIP: what lb4_pick_backend() finds for this client."""

    keyed_by: str  # "network namespace" (socket-LB) or "source address" (tc/XDP)
    client: str | None  # None: the client's netns cookie is not known
    timeout_s: int | None  # the frontend's timeout (from ebpflb_affpair4)
    # "hit": its entry decides; "miss": no usable entry, the Maglev choice is remembered;
    # "unknown": the client is not known (entries lists every client of the frontend);
    # "not read": ebpflb_aff4 was not given to explain().
    outcome: str
    entries: list[AffinityClient] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Explanation:
    query: Query
    verdict: Verdict
    reason: str
    steps: list[Step] = field(default_factory=list)
    frontend: MatchedFrontend | None = None
    selection: Selection | None = None
    backend: Candidate | None = None  # the backend chosen, when deterministic
    candidates: list[Candidate] = field(default_factory=list)  # every backend of the table
    nat: Nat | None = None
    counters: ServiceCounters | None = None  # the frontend's datapath counters so far
    affinity: Affinity | None = None  # sessionAffinity: ClientIP frontends

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        query = document["query"]
        query.update(
            client=str(self.query.client),
            address=str(self.query.address),
            protocol=self.query.protocol.name,
            path=self.query.path.value,
        )
        document["verdict"] = self.verdict.value
        return document
