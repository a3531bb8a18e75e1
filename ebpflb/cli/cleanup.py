"""`ebpflb cleanup`: detach the programs and remove the pins (refused while an agent holds
them, unless --force); with --kube-proxy, what kube-proxy left on the node instead."""

from __future__ import annotations

import argparse
import logging

from ebpflb.cli.common import add_config_arg, add_datapath_args, interfaces
from ebpflb.errors import PinDirBusyError

log = logging.getLogger("ebpflb")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cleanup = sub.add_parser(
        "cleanup",
        help="detach ebpflb's programs and remove its pins; or, with --kube-proxy, remove"
        " what kube-proxy left on this node",
    )
    add_config_arg(cleanup)
    add_datapath_args(cleanup)
    cleanup.add_argument(
        "--interfaces",
        type=interfaces,
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


def run(args: argparse.Namespace) -> int:
    if args.kube_proxy:
        from ebpflb.host import migrate

        report = migrate.cleanup_kube_proxy()
        print(report.summary())
        return 0 if not report.errors else 1

    from ebpflb.datapath.programs import loader
    from ebpflb.datapath.syscall.mounts import cgroup2_root
    from ebpflb.host.lock import PinDirLock

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
