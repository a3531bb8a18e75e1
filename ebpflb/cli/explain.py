"""`ebpflb explain`: what the datapath does with one connection or packet, from the pinned
maps (ebpflb.explain)."""

from __future__ import annotations

import argparse
import json
import socket

from ebpflb.cli.common import DEFAULTS, add_config_arg, add_datapath_args, port_range
from ebpflb.config import Config


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    explain = sub.add_parser(
        "explain",
        help="what the datapath does with a connection or packet, from the pinned maps",
        description="Mirror the datapath's decisions for CLIENT -> VIP:PORT/PROTO from the"
        " pinned maps (read only; the agent may be down): frontend, table slot, backend,"
        " NAT, or why it is refused or dropped.",
    )
    add_config_arg(explain)
    explain.add_argument("client", metavar="CLIENT", help="IP or IP:PORT of the client")
    explain.add_argument("target", metavar="VIP:PORT[/PROTO]", help="what it connects to")
    add_datapath_args(explain, cgroup=False)
    explain.add_argument("--json", action="store_true", help="machine-readable output")
    side = explain.add_mutually_exclusive_group()
    side.add_argument(
        "--from-outside",
        action="store_true",
        help="a packet arriving on a node interface (tc/XDP); default: a connect() or"
        " sendmsg() on this node or in a pod (socket-LB)",
    )
    side.add_argument(
        "--from-pod",
        action="store_true",
        help="a packet a pod sends without a socket hook's translation, through the"
        " per-packet path on its interface (--pod-interfaces)",
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
        type=port_range,
        metavar="MIN-MAX",
        help="the agent's --snat-port-range, to name the first SNAT port a new flow tries",
    )


def run(args: argparse.Namespace) -> int:
    from ebpflb.datapath.maps.kernel import KernelMapSet
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
        pod=args.from_pod,
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
