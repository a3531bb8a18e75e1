"""`ebpflb bench compare|maglev|sync|bulk|pps`: each sub-command's options, and what it runs.

ebpflb's command line hands `ebpflb bench`'s arguments here (ebpflb/cli/bench.py imports
this module only when the verb runs): `parse_args` reads them, `run` runs them.

Every sub-command takes --quick (its short settings), --json (print the report as JSON),
--save FILE (also write the JSON report) and --from-report FILE (render a saved report
instead of measuring), measures into a typed record (lab.bench.records) and prints it
through one renderer (lab.bench.render). `ebpflb bench` without a sub-command is
`ebpflb bench compare` (with_default_subcommand), as the README's commands use it.
Measuring modules are imported only when a sub-command runs, so --help and
--from-report need neither bcc nor root.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ebpflb.errors import ConfigError
from lab.bench import scenario
from lab.bench import settings as bench_settings
from lab.bench.settings import (
    BULK_QUICK,
    COMPARE_QUICK,
    MAGLEV_QUICK,
    PPS_QUICK,
    SYNC_QUICK,
    BulkSettings,
    CompareSettings,
    MaglevSettings,
    PpsSettings,
    SyncSettings,
)

if TYPE_CHECKING:
    from lab.bench.records.codec import Report

SUBCOMMANDS = ("compare", "maglev", "sync", "bulk", "pps")
COMPARE = CompareSettings()
SYNC = SyncSettings()
BULK = BulkSettings()
PPS = PpsSettings()
S = TypeVar("S", BulkSettings, PpsSettings)


def with_default_subcommand(argv: list[str]) -> list[str]:
    """`ebpflb bench [options]` means `ebpflb bench compare [options]` (`argv`: what follows
    `bench`)."""
    if argv and argv[0] in (*SUBCOMMANDS, "-h", "--help"):
        return argv
    return ["compare", *argv]


def _numbers(text: str, option: str = "--services") -> tuple[int, ...]:
    try:
        return tuple(int(n.replace("_", "")) for n in text.split(",") if n)
    except ValueError as exc:
        raise ConfigError(f"{option}: comma-separated numbers, not {text!r}") from exc


def _common(parser: argparse.ArgumentParser, quick: str) -> None:
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--save", type=Path, metavar="FILE", help="also write the JSON report")
    parser.add_argument(
        "--from-report",
        type=Path,
        metavar="FILE",
        help="render a saved JSON report instead of measuring",
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The arguments following `ebpflb bench`."""
    return build_parser().parse_args(with_default_subcommand(argv))


def build_parser() -> argparse.ArgumentParser:
    """`ebpflb bench` and its sub-commands."""
    bench = argparse.ArgumentParser(
        prog="ebpflb bench",
        description="ebpflb vs kube-proxy's modes (compare, the default), Maglev tables"
        " (maglev), the agent's control plane (sync), bulk TCP through a NodePort (bulk),"
        " packets/s through a NodePort on one core (pps)."
        " Without a sub-command: compare.",
    )
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)

    compare = bench_sub.add_parser(
        "compare",
        help="ebpflb vs kube-proxy's iptables and nftables modes, data and control plane"
        " (root; builds and removes its own namespaces)",
        description="For every N and mode, program N services in a network of namespaces of"
        " its own, measure connect() latency, connection and NodePort request rates,"
        " programming and update times and kernel memory, and print a table (see README,"
        " 'Benchmark').",
    )
    _common(compare, "N=100,1000, fewer and shorter runs (about two minutes)")
    compare.add_argument(
        "--services",
        help="numbers of services to measure at, comma-separated"
        f" (default {','.join(map(str, COMPARE.services))})",
    )
    compare.add_argument(
        "--modes",
        default=",".join(COMPARE.modes),
        help="modes to compare, comma-separated (default %(default)s)",
    )
    compare.add_argument("--endpoints", type=int, default=COMPARE.endpoints)
    compare.add_argument(
        "--mix",
        default="",
        help="also program services with these semantics on both sides, comma-separated:"
        " affinity (every 4th service: sessionAffinity ClientIP), local (every 4th:"
        " internalTrafficPolicy Local, every 4th: a NodePort with externalTrafficPolicy"
        " Local); default none",
    )
    compare.add_argument(
        "--kube-proxy-max-services",
        type=int,
        default=COMPARE.kube_proxy_max_services,
        help="largest N for the kube-proxy modes (default %(default)s)",
    )
    compare.add_argument(
        "--iptables-nft-max-services",
        type=int,
        default=COMPARE.iptables_nft_max_services,
        help="largest N for iptables-nft, whose load grows quadratically (default %(default)s)",
    )
    compare.add_argument("--rounds", type=int, help=f"latency rounds (default {COMPARE.rounds})")
    compare.add_argument("--batch", type=int, help=f"connects per batch (default {COMPARE.batch})")
    compare.add_argument(
        "--rate-seconds", type=float, metavar="S", help=f"default {COMPARE.rate_seconds}"
    )
    compare.add_argument(
        "--family",
        choices=[f.value for f in scenario.Family],
        default=COMPARE.family.value,
        help="the IP family of every address: kube-proxy's IPv4 or IPv6 proxier (ip6tables,"
        " table ip6), ebpflb over IPv4 or IPv6 (default %(default)s)",
    )
    compare.add_argument("--no-xdp", action="store_true", help="skip the XDP NodePort run")
    compare.add_argument("--plot", type=Path, metavar="FILE.png", help="draw the figures")

    maglev = bench_sub.add_parser("maglev", help="Maglev balance, disruption, memory, build time")
    _common(maglev, "fewer repetitions")

    sync = bench_sub.add_parser(
        "sync",
        help="the agent's start-up, first sync, updates and resync through the API, in detail"
        " (root; own cgroup and pins, all removed)",
    )
    _common(sync, f"{SYNC_QUICK.services:,} services, a shorter resync period")
    sync.add_argument("--services", type=int, help=f"default {SYNC.services}")
    sync.add_argument(
        "--endpoints", type=int, help=f"endpoints per service (default {SYNC.endpoints})"
    )
    sync.add_argument(
        "--changes", type=int, help=f"single-slice changes timed (default {SYNC.changes})"
    )
    sync.add_argument(
        "--source",
        choices=[s.value for s in bench_settings.SyncSource],
        help="the fake API server (api, the default) or one manifest file of every Service"
        " and EndpointSlice, a change being one document edited (manifests)",
    )
    sync.add_argument(
        "--min-sync-period",
        type=float,
        metavar="S",
        help=f"the agent's --min-sync-period (default {SYNC.min_sync_period:g}; the agent's"
        " own default is 0.5)",
    )
    sync.add_argument(
        "--sync-period",
        type=float,
        metavar="S",
        help=f"the agent's full resync period (default {SYNC.sync_period:g}); the churn"
        " runs right after one resync and must end before the next",
    )
    sync.add_argument(
        "--churn-rate",
        type=int,
        metavar="PER_S",
        help=f"endpoint changes per second in the churn (default {SYNC.churn_rate}; 0: none)",
    )
    sync.add_argument(
        "--agent-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="one more flag for `ebpflb run`, e.g. --agent-arg=--per-service-metrics=false"
        " (repeatable)",
    )
    sync.add_argument(
        "--churn-seconds",
        type=float,
        metavar="S",
        help=f"how long the churn lasts (default {SYNC.churn_seconds:g})",
    )

    bulk = bench_sub.add_parser(
        "bulk",
        help="bulk TCP through a NodePort with SNAT (GRO on) per mode, against plain"
        " forwarding (root; builds and removes its own namespaces)",
    )
    _common(bulk, f"{BULK_QUICK.repeats} x {BULK_QUICK.seconds} s per direction")
    bulk.add_argument(
        "--modes",
        default=",".join(BULK.modes),
        help="modes to measure, comma-separated (default %(default)s)",
    )
    bulk.add_argument("--plot", type=Path, metavar="FILE.png", help="draw the figure")
    bulk.add_argument("--seconds", type=int, help=f"per transfer (default {BULK.seconds})")
    bulk.add_argument("--repeats", type=int, help=f"per direction (default {BULK.repeats})")
    bulk.add_argument(
        "--family",
        choices=[f.value for f in scenario.Family],
        default=BULK.family.value,
        help="the IP family of every address (default %(default)s)",
    )

    pps = bench_sub.add_parser(
        "pps",
        help="packets/s through a UDP NodePort on one node core per mode (trafgen), against"
        " plain forwarding, and the core's share at fixed rates (root; builds and removes"
        " its own namespaces)",
    )
    _common(pps, f"{PPS_QUICK.repeats} x {PPS_QUICK.seconds:g} s at saturation, one rate")
    pps.add_argument(
        "--modes",
        default=",".join(PPS.modes),
        help="modes to measure, comma-separated (default %(default)s)",
    )
    pps.add_argument(
        "--seconds", type=float, help=f"per saturation window (default {PPS.seconds:g})"
    )
    pps.add_argument("--repeats", type=int, help=f"saturation windows (default {PPS.repeats})")
    pps.add_argument(
        "--rates",
        metavar="PPS,...",
        help=f"offered rates for the CPU figures (default {','.join(str(r) for r in PPS.rates)})",
    )
    pps.add_argument(
        "--family",
        choices=[f.value for f in scenario.Family],
        default=PPS.family.value,
        help="the IP family of every address (default %(default)s)",
    )
    return bench


def _per_mode_settings(base: S, args: argparse.Namespace, given: dict[str, Any]) -> S:
    """`bench bulk`'s or `bench pps`'s settings: `base`, then --modes, --family and the
    options given explicitly."""
    settings = dataclasses.replace(
        base,
        modes=bench_settings.parse_bulk_modes(args.modes),
        family=scenario.Family(args.family),
        **{k: v for k, v in given.items() if v is not None},
    )
    settings.validate()
    return settings


def pps_settings(args: argparse.Namespace) -> PpsSettings:
    given: dict[str, Any] = {"seconds": args.seconds, "repeats": args.repeats}
    if args.rates is not None:
        given["rates"] = _numbers(args.rates, "--rates")
    return _per_mode_settings(PPS_QUICK if args.quick else PPS, args, given)


def bulk_settings(args: argparse.Namespace) -> BulkSettings:
    given = {"seconds": args.seconds, "repeats": args.repeats}
    return _per_mode_settings(BULK_QUICK if args.quick else BULK, args, given)


def compare_settings(args: argparse.Namespace) -> CompareSettings:
    """--quick's settings (or the defaults), then the options given explicitly."""
    base = COMPARE_QUICK if args.quick else COMPARE
    given: dict[str, Any] = {
        "services": _numbers(args.services) if args.services is not None else None,
        "rounds": args.rounds,
        "batch": args.batch,
        "rate_seconds": args.rate_seconds,
    }
    settings = dataclasses.replace(
        base,
        modes=bench_settings.parse_modes(args.modes),
        endpoints=args.endpoints,
        kube_proxy_max_services=args.kube_proxy_max_services,
        iptables_nft_max_services=args.iptables_nft_max_services,
        xdp=not args.no_xdp,
        mix=scenario.parse_mix(args.mix),
        family=scenario.Family(args.family),
        **{name: value for name, value in given.items() if value is not None},
    )
    settings.validate()
    return settings


def sync_settings(args: argparse.Namespace) -> SyncSettings:
    base = SYNC_QUICK if args.quick else SYNC
    given = {
        "services": args.services,
        "endpoints": args.endpoints,
        "changes": args.changes,
        "source": bench_settings.SyncSource(args.source) if args.source else None,
        "min_sync_period": args.min_sync_period,
        "sync_period": args.sync_period,
        "churn_rate": args.churn_rate,
        "churn_seconds": args.churn_seconds,
        "agent_args": tuple(args.agent_arg) or None,
    }
    settings = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    settings.validate()
    return settings


def measure(args: argparse.Namespace) -> Report:
    """Run the sub-command's benchmark; its record."""
    if args.bench_command == "compare":
        from lab.bench.compare import run_compare

        return run_compare(
            compare_settings(args), progress=lambda line: print(line, file=sys.stderr)
        )
    if args.bench_command == "maglev":
        from lab.bench.maglev import run_maglev_bench

        return run_maglev_bench(MAGLEV_QUICK if args.quick else MaglevSettings())
    if args.bench_command == "bulk":
        from lab.bench.bulk import run_bulk_bench

        return run_bulk_bench(
            bulk_settings(args), progress=lambda line: print(line, file=sys.stderr)
        )
    if args.bench_command == "pps":
        from lab.bench.pps import run_pps_bench

        return run_pps_bench(pps_settings(args), progress=lambda line: print(line, file=sys.stderr))
    from lab.bench.sync import run_sync_bench

    return run_sync_bench(sync_settings(args))


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    # Imported here: --help and a parse error need none of them (40 ms).
    from lab.bench.plot import plot, plot_bulk
    from lab.bench.records import codec
    from lab.bench.records.bulk import BulkRun
    from lab.bench.records.compare import CompareRun
    from lab.bench.render import render
    from lab.harness.machinelock import machine_lock

    if args.from_report is not None:
        report = codec.load(args.from_report)
        if args.bench_command != report.KIND:
            raise ConfigError(
                f"{args.from_report} is a {report.KIND} report:"
                f" ebpflb bench {report.KIND} --from-report {args.from_report}"
            )
    else:
        # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the namespaces, servers,
        # cgroups and pins the run made are removed by its own teardown.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        with machine_lock(f"ebpflb bench {args.bench_command}"):
            report = measure(args)
    if args.save:
        codec.save(report, args.save)
    if getattr(args, "plot", None):
        if isinstance(report, BulkRun):
            plot_bulk(report, args.plot)
        else:
            assert isinstance(report, CompareRun)
            plot(report, args.plot)
    print(codec.to_json(report) if args.json else render(report))
    return 0
