"""Command line: argument parsing and dispatch only; the work happens in the modules named.

Over 400 lines on purpose: the argument parsers of every sub-command, kept together so
the flags read as one reference.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ebpflb import __version__, configfile, privileges
from ebpflb.bench import command as bench_command
from ebpflb.config import DEFAULT_BPFFS_DIR, Config, XdpMode
from ebpflb.errors import ConfigError, EbpflbError, PinDirBusyError

log = logging.getLogger("ebpflb")
DEFAULTS = Config()

EXAMPLES = """\
examples:
  ebpflb run                                       # in a pod: the cluster's Services
  ebpflb run --kubeconfig ~/.kube/config           # ... from outside the cluster
  ebpflb run --manifests examples/                 # program the Services in examples/
  ebpflb status                                    # the agent's state (or the pins')
  ebpflb maps dump                                 # what the pinned maps hold
  ebpflb maps dump --json --tables                 # ... with every Maglev slot
  ebpflb maps dump --service default/web           # ... of one service only
  ebpflb explain 10.244.1.5 10.96.0.10:80/TCP      # what socket-LB does with that connect()
  ebpflb explain 203.0.113.7:41000 192.168.1.1:30080/TCP --ingress eth0   # ... a NodePort packet
  ebpflb explain [2001:db8::7]:41000 [2001:db8::1]:30080 --ingress eth0   # ... over IPv6
  ebpflb bench --quick --plot bench.png             # ebpflb vs kube-proxy, ~2 minutes
  ebpflb bench                                     # the full run (under 15 minutes)
  ebpflb bench compare --from-report report.json   # ... its tables again, from a saved run
  ebpflb bench maglev                              # balance, disruption, memory, speed
  ebpflb bench sync                                # the agent's start-up and updates in detail
  ebpflb run --config /etc/ebpflb/config.yaml      # options from a file (flags override it)
  ebpflb cleanup                                   # detach programs, remove pins
  ebpflb cleanup --kube-proxy                      # remove what kube-proxy left on this node
"""


def _add_config_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="YAML file mapping `ebpflb run` option names to values (e.g. `ct-max: 262144`);"
        " options given as flags override it",
    )


def _add_datapath_args(parser: argparse.ArgumentParser, *, cgroup: bool = True) -> None:
    parser.add_argument(
        "--bpffs",
        type=Path,
        default=DEFAULT_BPFFS_DIR,
        metavar="DIR",
        help=f"bpffs directory holding the pinned maps (default {DEFAULT_BPFFS_DIR})",
    )
    if cgroup:
        parser.add_argument(
            "--cgroup",
            type=Path,
            metavar="DIR",
            help="cgroup v2 directory the socket programs attach to "
            "(default: the cgroup2 mount root, from /proc/mounts)",
        )


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ebpflb",
        description="eBPF Kubernetes service load balancer (kube-proxy replacement).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ebpflb {__version__}")
    parser.add_argument("--debug", action="store_true", help="debug logging and tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the agent in the foreground")
    _add_config_arg(run)
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
    _add_datapath_args(run)
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
        type=_interfaces,
        metavar="IF[,IF]",
        help="interfaces for NodePort/LoadBalancer/external IPs (default: those holding the "
        "node's IPv4 addresses; empty: none, socket-LB only)",
    )
    run.add_argument(
        "--snat-port-range",
        type=_port_range,
        default=None,
        metavar="MIN-MAX",
        help="source ports for masqueraded NodePort flows, outside the node's"
        " net.ipv4.ip_local_port_range (default: the ports above it)",
    )
    run.add_argument(
        "--xdp",
        type=XdpMode,
        choices=list(XdpMode),
        default=XdpMode.OFF,
        metavar="{native,generic,off}",
        help="run the NodePort ingress path in XDP where the driver allows (tc otherwise)",
    )

    cleanup = sub.add_parser(
        "cleanup",
        help="detach ebpflb's programs and remove its pins; or, with --kube-proxy, remove"
        " what kube-proxy left on this node",
    )
    _add_config_arg(cleanup)
    _add_datapath_args(cleanup)
    cleanup.add_argument(
        "--interfaces",
        type=_interfaces,
        metavar="IF[,IF]",
        help="interfaces to remove tc programs from (default: every interface here)",
    )
    cleanup.add_argument(
        "--force",
        action="store_true",
        help="also while an agent holds the pins: for a roll-back, run in the agent's own pod"
        " right before the DaemonSet is deleted (that agent then serves nothing)",
    )
    cleanup.add_argument(
        "--kube-proxy",
        action="store_true",
        help="instead: remove kube-proxy's rules from this network namespace, as"
        " `kube-proxy --cleanup` does (KUBE-* iptables chains in both iptables backends and"
        " the jumps to them, the `kube-proxy` nftables tables, the kube-ipvs0 interface);"
        " other rules stay",
    )

    maps = sub.add_parser("maps", help="inspect the pinned maps")
    maps_sub = maps.add_subparsers(dest="maps_command", required=True)
    dump = maps_sub.add_parser("dump", help="print frontends, backends and slot counts")
    _add_datapath_args(dump, cgroup=False)
    dump.add_argument("--json", action="store_true", help="machine-readable output")
    dump.add_argument(
        "--flows",
        type=int,
        default=100,
        metavar="N",
        help="conntrack and NAT entries to show at most (0: none)",
    )
    dump.add_argument(
        "--tables",
        action="store_true",
        help="with --json: every Maglev slot's backend, in slot order",
    )
    dump.add_argument(
        "--service",
        metavar="NS/NAME",
        help="only this service's frontends (every port and address), and their backends,"
        " conntrack and NAT entries",
    )
    dump.add_argument(
        "--frontend",
        metavar="VIP:PORT/PROTO",
        help="only this frontend (e.g. 10.96.0.10:80/TCP) and its backends and flows",
    )

    status = sub.add_parser(
        "status",
        help="what the agent is doing (its /status and /metrics); from the pins when it does"
        " not answer",
    )
    _add_config_arg(status)
    _add_datapath_args(status, cgroup=False)
    status.add_argument(
        "--metrics-bind-address",
        default=DEFAULTS.metrics_bind_address,
        metavar="HOST:PORT",
        help="where the agent serves /status and /metrics (default %(default)s)",
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument(
        "--timeout", type=float, default=2.0, metavar="S", help="seconds to wait for the agent"
    )

    _add_explain_parser(sub)
    bench_command.add_parser(sub)
    return parser


def _add_explain_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    explain = sub.add_parser(
        "explain",
        help="what the datapath does with a connection or packet, from the pinned maps",
        description="Mirror the datapath's decisions for CLIENT -> VIP:PORT/PROTO from the"
        " pinned maps (read only; the agent may be down): frontend, table slot, backend,"
        " NAT, or why it is refused or dropped.",
    )
    _add_config_arg(explain)
    explain.add_argument("client", metavar="CLIENT", help="IP or IP:PORT of the client")
    explain.add_argument("target", metavar="VIP:PORT[/PROTO]", help="what it connects to")
    _add_datapath_args(explain, cgroup=False)
    explain.add_argument("--json", action="store_true", help="machine-readable output")
    side = explain.add_mutually_exclusive_group()
    side.add_argument(
        "--from-outside",
        action="store_true",
        help="a packet arriving on a node interface (tc/XDP); default: a connect() or"
        " sendmsg() on this node or in a pod (socket-LB)",
    )
    side.add_argument(
        "--ingress",
        metavar="IFACE",
        help="like --from-outside, arriving on IFACE (its node address is the SNAT source)",
    )
    explain.add_argument(
        "--sendmsg",
        action="store_true",
        help="UDP sent with sendto() on an unconnected socket (default: connect())",
    )
    explain.add_argument(
        "--socket-cookie", type=int, metavar="N", help="with --sendmsg: the socket's cookie"
    )
    explain.add_argument(
        "--netns-cookie",
        type=int,
        metavar="N",
        help="socket-LB: the client's network namespace cookie (SO_NETNS_COOKIE), which keys"
        " its session affinity",
    )
    explain.add_argument(
        "--hash-seed",
        default=DEFAULTS.hash_seed,
        help="the agent's --hash-seed (the NodePort flow hash derives from it)",
    )
    explain.add_argument(
        "--snat-port-range",
        type=_port_range,
        metavar="MIN-MAX",
        help="the agent's --snat-port-range, to name the first SNAT port a new flow tries",
    )


def _interfaces(text: str) -> tuple[str, ...]:
    return tuple(name for name in text.split(",") if name)


def _snat_ports(given: tuple[int, int] | None) -> dict[str, Any]:
    if given is None:
        return {}
    return {"snat_port_min": given[0], "snat_port_max": given[1], "snat_port_auto": False}


def _port_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    if not sep or not low.isdigit() or not high.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN-MAX")
    return int(low), int(high)


def _setup_logging(debug: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def cmd_run(args: argparse.Namespace) -> int:
    from ebpflb import app

    config = Config(
        bpffs_dir=args.bpffs,
        cgroup_dir=args.cgroup,
        node_name=node_name(args.node_name),
        interfaces=args.interfaces,
        xdp=args.xdp,
        **_snat_ports(args.snat_port_range),
        **_nodeport_fields({field: getattr(args, field) for _, field, _, _ in _CONFIG_FLAGS}),
    )
    if args.manifests is not None and args.kubeconfig is not None:
        raise ConfigError("--manifests and --kubeconfig are two sources: choose one")
    privileges.check(privileges.needed_by_run(nodeport=config.interfaces != ()))
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


def cmd_cleanup(args: argparse.Namespace) -> int:
    if args.kube_proxy:
        from ebpflb import migrate

        report = migrate.cleanup_kube_proxy()
        print(report.summary())
        return 0 if not report.errors else 1

    from ebpflb.datapath import loader
    from ebpflb.datapath.mounts import cgroup2_root
    from ebpflb.lock import PinDirLock

    cgroup = args.cgroup or cgroup2_root()
    # Refused while an agent runs on these pins: it would carry on with maps nobody can
    # open, and its programs detached. Held meanwhile, so no agent starts half-way.
    with PinDirLock(args.bpffs) as lock:
        if args.bpffs.is_dir() and not lock.try_acquire():
            if not args.force:
                raise PinDirBusyError(args.bpffs, str(lock.holder()))
            log.warning(
                "cleanup --force: the agent holding %s (pid %s) keeps running without a"
                " datapath until it is stopped",
                args.bpffs,
                lock.holder(),
            )
        programs, pins = loader.cleanup(args.bpffs, cgroup, args.interfaces)
    print(f"detached {programs} programs from {cgroup}, removed {pins} pins under {args.bpffs}")
    return 0


def cmd_maps_dump(args: argparse.Namespace) -> int:
    from ebpflb.datapath import dump
    from ebpflb.datapath.kernel import KernelMapSet

    select = dump.Selection.parse(args.service, args.frontend)
    with KernelMapSet(args.bpffs) as maps:
        report = dump.collect(maps, tables=args.tables, flows=args.flows, select=select)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(dump.render_text(report))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Exit status 0 when the agent answers, 1 when it does not (the pins are shown)."""
    from ebpflb import statuscmd

    document = statuscmd.gather(args.metrics_bind_address, args.bpffs, timeout=args.timeout)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(statuscmd.render_text(document))
    return 0 if document["agent"]["answering"] else 1


def cmd_explain(args: argparse.Namespace) -> int:
    from ebpflb.datapath.kernel import KernelMapSet
    from ebpflb.explain import explain
    from ebpflb.explain.affinity import PinnedAffinity
    from ebpflb.explain.engine import Settings
    from ebpflb.explain.model import parse_query
    from ebpflb.explain.render import render_text

    query = parse_query(
        args.client,
        args.target,
        outside=args.from_outside or args.ingress is not None,
        ingress=args.ingress,
        sendmsg=args.sendmsg,
        socket_cookie=args.socket_cookie,
        netns_cookie=args.netns_cookie,
    )
    seed = Config(hash_seed=args.hash_seed).flow_hash_seed
    from ebpflb.datapath.addrwatch import route_egress

    settings = Settings(seed, args.snat_port_range, socket.if_nametoindex, route_egress)
    with KernelMapSet(args.bpffs) as maps, PinnedAffinity(args.bpffs) as affinity:
        result = explain(maps, query, settings, affinity)
    print(json.dumps(result.to_json(), indent=2) if args.json else render_text(result))
    return 0


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with a --config file's values as defaults flags override."""
    parser = build_parser()
    argv = bench_command.with_default_subcommand(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if getattr(args, "config", None) is not None:
        commands = _commands(parser)
        target = commands[args.command]
        target.set_defaults(
            **configfile.defaults(
                args.config,
                configfile.options(commands["run"]),
                configfile.options(target),
                list_types={_interfaces},
            )
        )
        args = parser.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ConfigError as exc:
        print(f"ebpflb: {exc}", file=sys.stderr)
        return 2
    _setup_logging(args.debug)
    handler = {
        "run": cmd_run,
        "cleanup": cmd_cleanup,
        "maps": cmd_maps_dump,
        "status": cmd_status,
        "explain": cmd_explain,
        "bench": bench_command.run,
    }[args.command]
    try:
        return handler(args)
    except EbpflbError as exc:
        if args.debug:
            log.exception("failed")
        print(f"ebpflb: {exc}", file=sys.stderr)
        hint = privileges.permission_hint(exc)
        if hint:
            print(f"ebpflb: {hint}", file=sys.stderr)
        return 1
    except PermissionError as exc:  # a syscall no ebpflb layer wrapped: still no traceback
        if args.debug:
            log.exception("failed")
        print(f"ebpflb: {exc}", file=sys.stderr)
        print(f"ebpflb: {privileges.permission_hint(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
