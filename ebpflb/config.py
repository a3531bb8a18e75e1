"""The agent's configuration: one frozen value, validated once, owning every size.

The datapath's sizes live here and reach the C code as -D flags
(``ebpflb.datapath.contract.cflags(config)``, following its ``DEFINES``); the C headers
only keep ``#ifndef`` defaults.
Changing a size changes the pinned maps' layout, which the loader detects and handles (see
``ebpflb.datapath.programs.loader``).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path

from ebpflb.errors import ConfigError
from ebpflb.maglev import DEFAULT_HASH_SEED, DEFAULT_MAX_TABLE_SIZE, TABLE_SIZES

DEFAULT_BPFFS_DIR = Path("/sys/fs/bpf/ebpflb")
# kube-proxy's metricsBindAddress and healthzBindAddress defaults. Cloud load balancers
# probe 10256/healthz on every node (GCE hard-codes the port for externalTrafficPolicy:
# Cluster services), so the health server keeps kube-proxy's address.
DEFAULT_METRICS_BIND_ADDRESS = "127.0.0.1:10249"
DEFAULT_HEALTHZ_BIND_ADDRESS = "0.0.0.0:10256"
# The Maglev hash is keyed blake2b (ebpflb.maglev), whose key is at most 64 bytes.
MAX_HASH_SEED_BYTES = 64


class XdpMode(enum.Enum):
    """Where the NodePort ingress path runs (--xdp)."""

    OFF = "off"  # tc only
    GENERIC = "generic"  # XDP in the stack (any driver; little gain, for testing)
    NATIVE = "native"  # XDP in the driver (veth, most 10G+ NICs), falling back to tc


# Pods' host-side interface names of common CNIs: veth-based ones (bridge, flannel, kindnet,
# Weave: veth*), Calico (cali*), Cilium (lxc*), AWS VPC CNI (eni*), GKE (gke*), Azure (azv*).
DEFAULT_POD_INTERFACES = ("veth*", "cali*", "lxc*", "eni*", "gke*", "azv*")


class SocketLbScope(enum.Enum):
    """Which sockets socket-LB translates at connect()/sendmsg() (--socket-lb)."""

    ALL = "all"  # every socket in the attached cgroup
    # The agent's network namespace's only (the host's): pods' traffic keeps the ClusterIP
    # until the per-packet path on their interfaces (--pod-interfaces), as service meshes'
    # sidecars need (they intercept by destination, SO_ORIGINAL_DST).
    HOSTNS_ONLY = "hostns-only"
    OFF = "off"  # no socket programs attached


@dataclass(frozen=True, slots=True)
class Config:
    bpffs_dir: Path = DEFAULT_BPFFS_DIR
    # cgroup v2 directory the socket programs attach to; None = the cgroup2 mount root.
    cgroup_dir: Path | None = None
    node_name: str = ""
    # This node's topology.kubernetes.io/zone, for EndpointSlice zone hints; "": unknown
    # (zone hints are then ignored, as kube-proxy does for a node without the label).
    zone: str = ""
    hash_seed: str = DEFAULT_HASH_SEED
    maglev_max_table_size: int = DEFAULT_MAX_TABLE_SIZE
    max_services: int = 65536
    max_backends: int = 65536
    slot_pool_size: int = 8 * 1024 * 1024  # slots; 4 bytes each in the kernel; the limit
    # Slots the pool starts with (1 MiB); it doubles when a table does not fit, up to
    # slot_pool_size (ebpflb.datapath.maps.growable). A pool already pinned keeps its size.
    slot_pool_initial: int = 256 * 1024
    rev_sk_max: int = 262144
    # Interfaces the NodePort/LoadBalancer programs attach to; None: those holding the
    # node's IPv4 addresses, () : none (socket-LB only).
    interfaces: tuple[str, ...] | None = None
    # Name patterns (fnmatch) of pods' host-side interfaces that get the per-packet ClusterIP
    # path (ebpflb.datapath.programs.podlb), followed as pods come and go; (): none.
    pod_interfaces: tuple[str, ...] = DEFAULT_POD_INTERFACES
    xdp: XdpMode = XdpMode.OFF
    socket_lb: SocketLbScope = SocketLbScope.ALL
    ct_max: int = 262144  # the limit conntrack grows to
    # Conntrack entries at start (1 MiB); doubled at a full resync that finds the table
    # half full, up to ct_max (ebpflb.datapath.maps.growable).
    ct_initial: int = 8192
    rnat_max: int = 262144
    src_range_max: int = 16384
    affinity_max: int = 65536  # session-affinity clients, and affinity backend pairs
    # Source ports of masqueraded NodePort flows. Unless given (snat_port_auto False), the
    # agent places them above the node's ephemeral ports: see place_snat_ports.
    snat_port_min: int = 1024
    snat_port_max: int = 29999
    snat_port_auto: bool = True
    ct_tcp_timeout: int = 21600
    ct_tcp_syn_timeout: int = 60
    ct_tcp_close_timeout: int = 10
    # A half-closed TCP flow (one side's FIN): kube-proxy's --conntrack-tcp-timeout-close-wait
    # (1 h), for ebpflb's conntrack and, as kube-proxy sets it, the node's nf_conntrack.
    ct_tcp_close_wait_timeout: int = 3600
    # Set the node's nf_conntrack sysctls kube-proxy sets (ebpflb.host.sysctl).
    conntrack_sysctls: bool = True
    ct_udp_timeout: int = 60
    # Bounded-frequency sync (kube-proxy's minSyncPeriod / syncPeriod): bursts within
    # min_sync_period coalesce; every max_sync_period the maps are re-read and repaired.
    min_sync_period: float = 0.5
    max_sync_period: float = 30.0
    retry_period: float = 2.0
    # HOST:PORT of /metrics and /status, and of /healthz, /livez and /readyz; "" disables.
    metrics_bind_address: str = DEFAULT_METRICS_BIND_ADDRESS
    # Service externalIPs that may be programmed (CVE-2020-8554); none by default, as with
    # Kubernetes' DenyServiceExternalIPs admission plugin. 0.0.0.0/0: kube-proxy's behaviour.
    healthz_bind_address: str = DEFAULT_HEALTHZ_BIND_ADDRESS
    external_ip_cidrs: tuple[IPv4Network | IPv6Network, ...] = ()
    # One series per frontend for the datapath counters (ebpflb_service_*); False keeps
    # only their totals, for clusters where that many series are too many.
    per_service_metrics: bool = True
    # TCP sockets' reverse entries (getpeername) in socket storage where the kernel allows
    # it (probed), or (False, the default) in the LRU ebpflb_revsk4. Off by default: the
    # per-socket allocation at connect() and its RCU free at close cost ~1 us a connection
    # (`ebpflb bench`: connect p50 x1.06-1.12 of no proxy with it, x1.00-1.04 without),
    # more than the LRU insert it saves; the entry's lifetime is its only gain.
    socket_storage: bool = False
    # Seconds `run` waits for another agent on the same pin directory to exit (a
    # DaemonSet update whose old pod is still terminating) before giving up.
    lock_timeout: float = 60.0
    # kube-proxy's --nodeport-addresses: the node addresses NodePorts answer on, by CIDR;
    # empty: every node address (and 127.0.0.1, for host processes).
    nodeport_addresses: tuple[IPv4Network | IPv6Network, ...] = ()
    # --nodeport-addresses=primary instead: only the node's primary addresses (those of the
    # default route's interface), kube-proxy's value of the same name.
    nodeport_primary: bool = False

    def __post_init__(self) -> None:
        for name in (
            "max_services",
            "max_backends",
            "slot_pool_size",
            "slot_pool_initial",
            "rev_sk_max",
            "ct_max",
            "ct_initial",
            "rnat_max",
            "src_range_max",
            "affinity_max",
            "ct_tcp_timeout",
            "ct_tcp_syn_timeout",
            "ct_tcp_close_timeout",
            "ct_tcp_close_wait_timeout",
            "ct_udp_timeout",
        ):
            value = getattr(self, name)
            if not 1 <= value < 2**31:
                raise ConfigError(f"{name.replace('_', '-')} must be in [1, 2^31), got {value}")
        for flag, slots in (
            ("slot-pool-size", self.slot_pool_size),
            ("slot-pool-initial", self.slot_pool_initial),
        ):
            if slots % 2:
                raise ConfigError(f"{flag} {slots} must be even (slot pairs)")
        if self.maglev_max_table_size not in TABLE_SIZES:
            raise ConfigError(
                f"maglev-max-table-size {self.maglev_max_table_size} is not one of {TABLE_SIZES}"
            )
        self._check_limits()
        if not 1 <= self.snat_port_min <= self.snat_port_max <= 65535:
            raise ConfigError(
                f"snat-port-range {self.snat_port_min}-{self.snat_port_max} is not a port range"
            )
        if not self.hash_seed:
            raise ConfigError("hash-seed must not be empty (it must match on every node)")
        if len(self.hash_seed.encode()) > MAX_HASH_SEED_BYTES:
            raise ConfigError(
                f"hash-seed is {len(self.hash_seed.encode())} bytes: Maglev keys its hash with"
                f" it (blake2b), which takes at most {MAX_HASH_SEED_BYTES}; use a shorter seed"
            )
        if not 0 < self.min_sync_period <= self.max_sync_period:
            raise ConfigError("need 0 < min-sync-period <= max-sync-period")
        if not self.lock_timeout >= 0:
            raise ConfigError(f"lock-timeout must be >= 0 seconds, got {self.lock_timeout}")
        if not self.retry_period > 0:
            raise ConfigError(f"retry-period must be > 0 seconds, got {self.retry_period}")
        for flag, address in (
            ("metrics-bind-address", self.metrics_bind_address),
            ("healthz-bind-address", self.healthz_bind_address),
        ):
            if address:
                parse_bind_address(address, flag)
        if self.nodeport_primary and self.nodeport_addresses:
            raise ConfigError("nodeport-addresses: either CIDRs or primary, not both")
        for network in (*self.external_ip_cidrs, *self.nodeport_addresses):
            if not isinstance(network, (IPv4Network, IPv6Network)):
                raise ConfigError(f"external-ip-cidrs: {network!r} is not a network (CIDR)")

    @staticmethod
    def parse_cidrs(text: str) -> tuple[IPv4Network | IPv6Network, ...]:
        """ "CIDR,CIDR,..." (empty: none) as --external-ip-cidrs takes it; strict: host bits
        set are a mistake worth hearing about (10.0.0.1/8 would allow all of 10/8)."""
        networks = []
        for part in text.split(","):
            if not part.strip():
                continue
            try:
                networks.append(ip_network(part.strip(), strict=True))
            except ValueError as exc:
                raise ConfigError(f"external-ip-cidrs: {part.strip()!r}: {exc}") from None
        return tuple(networks)

    @property
    def health_timeout(self) -> float:
        """How long a queued change may wait before /healthz answers 503: twice the full
        resync period, as kube-proxy derives its healthTimeout from syncPeriod."""
        return 2 * self.max_sync_period

    def _check_limits(self) -> None:
        """Limits that contradict each other: no state of the cluster could make them work.

        Refused: a largest Maglev table that the slot pool cannot hold (a table of M slots
        takes M + 1 with the padding of its last slot pair). A service large enough to get
        that table could never be placed, although a smaller limit would serve it; and a
        pool below the smallest table serves no service with an endpoint at all.

        Not refused, because they are runtime conditions of one frontend, which then
        fails alone (named, counted, retried) or works with a warning:
        - max-backends above the table-size limit, or a table-size limit below the backend
          count some service may have: only a service with more backends than the
          largest table has slots fails (Maglev needs M >= N);
        - a table-size limit below 100 slots per backend: such services get the largest
          table, with a looser balance, a warning and ebpflb_maglev_undersized_tables;
        - a slot pool too small for max-services tables: most services need far fewer
          slots than the largest table, and frontends without endpoints take none.
        """
        pool, largest = self.slot_pool_size, self.maglev_max_table_size
        if largest + 1 <= pool:
            return
        smallest = TABLE_SIZES[0]
        if smallest + 1 > pool:
            raise ConfigError(
                f"slot-pool-size {pool} cannot hold even the smallest Maglev table"
                f" ({smallest} slots, {smallest + 1} with padding): raise --slot-pool-size"
                f" to {smallest + 1} or more"
            )
        fitting = max(m for m in TABLE_SIZES if m + 1 <= pool)
        raise ConfigError(
            f"maglev-max-table-size {largest} does not fit in slot-pool-size {pool} (a table"
            f" of {largest} slots takes {largest + 1}): raise --slot-pool-size to"
            f" {largest + 1} or more, or lower --maglev-max-table-size to {fitting}"
        )

    @property
    def flow_hash_seed(self) -> int:
        """32-bit seed of the datapath's 5-tuple hash, derived from the cluster-wide seed."""
        digest = hashlib.blake2b(self.hash_seed.encode(), digest_size=4, person=b"ebpflb-flow")
        return int.from_bytes(digest.digest(), "little")


def parse_bind_address(address: str, flag: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [ADDR]:PORT; an empty HOST means every address) -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{flag} {address!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"{flag} {address!r}: write an IPv6 address as [ADDRESS]:PORT")
    return host or "0.0.0.0", int(port)


MIN_SNAT_PORTS = 1024  # fewer would exhaust under an ordinary burst of flows to one backend
# Kubernetes' default --service-node-port-range: replies from backends never come to these.
NODEPORT_RANGE = (30000, 32767)


def place_snat_ports(config: Config, ephemeral: tuple[int, int]) -> Config:
    """The SNAT port range, kept apart from `ephemeral` (the node's
    net.ipv4.ip_local_port_range, where its own sockets' ports come from).

    A reply to a host connection whose port lies in the SNAT range would be taken for the
    reply of a masqueraded flow that once used that port towards the same backend, and
    translated away from the socket waiting for it. Not given: the larger of the gaps
    below and above the ephemeral range, outside the default NodePort range (with Linux's
    32768-60999: 1024-29999, 28,976 ports per node address and backend). Given and
    overlapping: refused, naming both ranges.
    """
    low, high = ephemeral
    if config.snat_port_auto:
        gaps = [
            (1024, min(low, NODEPORT_RANGE[0]) - 1),
            (max(high, NODEPORT_RANGE[1]) + 1, 65535),
        ]
        first, last = max(gaps, key=lambda gap: gap[1] - gap[0])
        if last - first + 1 < MIN_SNAT_PORTS:
            raise ConfigError(
                f"net.ipv4.ip_local_port_range {low}-{high} leaves fewer than"
                f" {MIN_SNAT_PORTS} ports outside it (and outside NodePorts"
                f" {NODEPORT_RANGE[0]}-{NODEPORT_RANGE[1]}) for SNAT: narrow the ephemeral"
                " range or give --snat-port-range outside it"
            )
        return dataclasses.replace(config, snat_port_min=first, snat_port_max=last)
    if config.snat_port_min <= high and low <= config.snat_port_max:
        raise ConfigError(
            f"snat-port-range {config.snat_port_min}-{config.snat_port_max} overlaps the"
            f" node's ephemeral ports (net.ipv4.ip_local_port_range {low}-{high}): replies to"
            " the node's own connections would be taken for SNAT replies; choose a range"
            " outside it"
        )
    return config
