"""`ebpflb run`: the agent in the foreground, its options each setting one Config field."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ebpflb.cli import configfile
from ebpflb.cli.common import DEFAULTS, add_config_arg, add_datapath_args, interfaces, port_range
from ebpflb.config import Config, SocketLbScope, XdpMode
from ebpflb.errors import ConfigError
from ebpflb.host import privileges


def _cidrs(text: str) -> object:
    try:
        return Config.parse_cidrs(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


PRIMARY = "primary"


def _nodeport_addresses(text: str) -> object:
    """CIDR[,CIDR], or kube-proxy's "primary" (Config.nodeport_primary)."""
    return PRIMARY if text.strip() == PRIMARY else _cidrs(text)


def _nodeport_fields(fields: dict[str, Any]) -> dict[str, Any]:
    if fields.get("nodeport_addresses") == PRIMARY:
        return {**fields, "nodeport_addresses": (), "nodeport_primary": True}
    return fields


# Options that each set one Config field: (flag, field, type, help).
_CONFIG_FLAGS: tuple[tuple[str, str, Callable[[str], object], str], ...] = (
    ("--hash-seed", "hash_seed", str, "Maglev hash seed; must be identical on every node"),
    ("--maglev-max-table-size", "maglev_max_table_size", int, "largest Maglev table (a prime)"),
    ("--max-services", "max_services", int, "frontend map size"),
    ("--max-backends", "max_backends", int, "backend map size"),
    (
        "--slot-pool-size",
        "slot_pool_size",
        int,
        "most slots shared by all Maglev tables, 4 B each (the pool grows up to it)",
    ),
    (
        "--slot-pool-initial",
        "slot_pool_initial",
        int,
        "slots the pool starts with (doubling when full, up to --slot-pool-size)",
    ),
    (
        "--min-sync-period",
        "min_sync_period",
        float,
        "least seconds between two syncs (bursts of changes coalesce)",
    ),
    ("--sync-period", "max_sync_period", float, "seconds between full resyncs that repair drift"),
    ("--ct-max", "ct_max", int, "most NodePort conntrack entries (the table grows up to it)"),
    (
        "--ct-initial",
        "ct_initial",
        int,
        "NodePort conntrack entries at start (doubling when half full)",
    ),
    ("--nat-max", "rnat_max", int, "reply-translation (and SNAT port) entries"),
    ("--affinity-max", "affinity_max", int, "session-affinity clients (and backend pairs)"),
    ("--zone", "zone", str, "this node's topology.kubernetes.io/zone (EndpointSlice hints)"),
    (
        "--ct-udp-timeout",
        "ct_udp_timeout",
        int,
        "seconds an idle UDP flow keeps its backend and SNAT port",
    ),
    (
        "--ct-tcp-timeout",
        "ct_tcp_timeout",
        int,
        "seconds an idle established TCP flow keeps its backend",
    ),
    (
        "--conntrack-tcp-timeout-close-wait",
        "ct_tcp_close_wait_timeout",
        int,
        "seconds an idle half-closed TCP flow (one side's FIN) keeps its backend, in"
        " ebpflb's conntrack and the node's nf_conntrack (kube-proxy's flag; 1 h)",
    ),
    (
        "--conntrack-sysctls",
        "conntrack_sysctls",
        configfile.parse_bool,
        "true (default): set the node's nf_conntrack CLOSE_WAIT timeout to"
        " --conntrack-tcp-timeout-close-wait, as kube-proxy does; false: leave it",
    ),
    (
        "--metrics-bind-address",
        "metrics_bind_address",
        str,
        "HOST:PORT for /metrics and /status; empty disables",
    ),
    (
        "--healthz-bind-address",
        "healthz_bind_address",
        str,
        "HOST:PORT for /healthz, /livez (kube-proxy's) and /readyz; empty disables",
    ),
    (
        "--external-ip-cidrs",
        "external_ip_cidrs",
        _cidrs,
        "Service externalIPs that may be programmed, CIDR[,CIDR] (CVE-2020-8554: an"
        " externalIP captures that address's traffic); none by default, like the"
        " DenyServiceExternalIPs admission plugin; 0.0.0.0/0 allows all, like kube-proxy",
    ),
    (
        "--per-service-metrics",
        "per_service_metrics",
        configfile.parse_bool,
        "true: datapath counters per frontend (ebpflb_service_*, one series each); false:"
        " only their totals, for very large clusters",
    ),
    (
        "--socket-storage",
        "socket_storage",
        configfile.parse_bool,
        "true: a TCP socket's reverse entry (for getpeername) is kept in the socket itself"
        " where the kernel allows it (5.3+; costs ~1 us a connection); false (default): in"
        " the LRU map ebpflb_revsk4",
    ),
    (
        "--lock-timeout",
        "lock_timeout",
        float,
        "seconds to wait for another agent using the same --bpffs directory to exit (a"
        " rolling update's old pod) before giving up; 0: do not wait",
    ),
    (
        "--nodeport-addresses",
        "nodeport_addresses",
        _nodeport_addresses,
        "node addresses NodePorts answer on, CIDR[,CIDR] of either family (a family none"
        " is of: all its addresses) or primary (the addresses of each family's default"
        " route's interface), as kube-proxy's flag; followed as addresses come and go;"
        " default: every IPv4 and global IPv6 address of the attached interfaces and"
        " 127.0.0.1",
    ),
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run the agent in the foreground")
    add_config_arg(run)
    run.add_argument(
        "--manifests",
        type=Path,
        metavar="PATH",
        help="YAML file or directory of v1 Services and discovery.k8s.io/v1 EndpointSlices"
        " (default: list and watch them in the API server)",
    )
    run.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="kubeconfig for the API server (default: in-cluster service account)",
    )
    add_datapath_args(run)
    run.add_argument(
        "--node-name",
        help="this node's name, marking local endpoints (default: $NODE_NAME, then the hostname)",
    )
    for flag, field, kind, text in _CONFIG_FLAGS:
        run.add_argument(
            flag,
            dest=field,
            type=kind,
            default=getattr(DEFAULTS, field),
            metavar=flag.lstrip("-").replace("-", "_").upper(),
            help=f"{text} (default %(default)s)" if getattr(DEFAULTS, field) != () else text,
        )
    run.add_argument(
        "--interfaces",
        type=interfaces,
        metavar="IF[,IF]",
        help="interfaces for NodePort/LoadBalancer/external IPs (default: those holding the "
        "node's IPv4 addresses; empty: none, socket-LB only)",
    )
    run.add_argument(
        "--socket-lb",
        type=SocketLbScope,
        choices=list(SocketLbScope),
        default=SocketLbScope.ALL,
        metavar="{all,hostns-only,off}",
        help="sockets translated at connect(): all, the host network namespace's only"
        " (pods' then per packet with --pod-interfaces: service-mesh sidecars see the"
        " ClusterIP), or none",
    )
    run.add_argument(
        "--pod-interfaces",
        type=interfaces,
        default=DEFAULTS.pod_interfaces,
        metavar="GLOB[,GLOB]",
        help="pods' host-side interfaces (name patterns) whose traffic to ClusterIPs is"
        " translated per packet, for what no socket hook sees (default: "
        + ",".join(DEFAULTS.pod_interfaces)
        + "; empty: none)",
    )
    run.add_argument(
        "--snat-port-range",
        type=port_range,
        default=None,
        metavar="MIN-MAX",
        help="source ports for masqueraded NodePort flows, outside the node's"
        " net.ipv4.ip_localport_range (default: the ports above it)",
    )
    run.add_argument(
        "--xdp",
        type=XdpMode,
        choices=list(XdpMode),
        default=XdpMode.OFF,
        metavar="{native,generic,off}",
        help="run the NodePort ingress path in XDP where the driver allows (tc otherwise)",
    )


def _snat_ports(given: tuple[int, int] | None) -> dict[str, Any]:
    if given is None:
        return {}
    return {"snat_port_min": given[0], "snat_port_max": given[1], "snat_port_auto": False}


def run(args: argparse.Namespace) -> int:
    from ebpflb import app

    config = Config(
        bpffs_dir=args.bpffs,
        cgroup_dir=args.cgroup,
        node_name=node_name(args.node_name),
        interfaces=args.interfaces,
        pod_interfaces=args.pod_interfaces,
        socket_lb=args.socket_lb,
        xdp=args.xdp,
        **_snat_ports(args.snat_port_range),
        **_nodeport_fields({field: getattr(args, field) for _, field, _, _ in _CONFIG_FLAGS}),
    )
    if args.manifests is not None and args.kubeconfig is not None:
        raise ConfigError("--manifests and --kubeconfig are two sources: choose one")
    tc = config.interfaces != () or config.pod_interfaces != ()
    privileges.check(privileges.needed_by_run(nodeport=tc))
    if args.manifests is not None:
        source = app.manifest_source(args.manifests)
    else:
        source = app.kubernetes_source(args.kubeconfig)
    app.run(config, source)
    return 0


def node_name(given: str | None) -> str:
    """--node-name, else $NODE_NAME (the downward API's spec.nodeName), else the hostname
    lower-cased as kube-proxy does (node names are DNS names)."""
    if given is not None:
        return given
    return os.environ.get("NODE_NAME") or socket.gethostname().strip().lower()
