"""In-kernel cost of ebpflb's connect4 program per call (kernel.bpf_stats_enabled:
run_time_ns / run_cnt), for connects to one hot service and to random ones among N.

    python scripts/connect_prog_stats.py N [N...] [--connects C] [--rounds R]
        [--variant NAME[:TREE[:AGENT-ARGS]]]...

For each N: the bench's services (lab.bench.scenario, 2 endpoints each) served from a
fake API to one agent per variant (TREE: another checkout of ebpflb, e.g. main's, run with
PYTHONPATH=TREE), each in a fresh network namespace with only `lo` (so every translated
connect() fails at once with ENETUNREACH: the program's cost is all that is measured, and
nothing leaves the namespace), socket-LB on a fresh cgroup; a client in both does C
blocking connect()s per round, rounds alternating between variants and hot and random
targets, and the program's counters are read around each round. Prints one JSON line per
(N, variant, target): ns per run, median over rounds, and the rounds. Run as root; it sets
kernel.bpf_stats_enabled for its duration and restores it. Wall-clock figures are not
taken: the machine may be shared.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from lab.bench.agentrun import running_agent
from lab.bench.scenario import bench_services
from lab.harness.machinelock import machine_lock
from lab.harness.netns import Cgroup

CLIENT = r"""
import random, socket, sys, errno
n, connects, hot, seed = (int(a) for a in sys.argv[1:5])
rng = random.Random(seed)
base = int.from_bytes(socket.inet_aton("10.96.0.0"), "big")
for _ in range(connects):
    index = hot if hot >= 0 else rng.randrange(n)
    address = socket.inet_ntoa((base + index + 1).to_bytes(4, "big"))
    s = socket.socket()
    try:
        s.connect((address, 80))
    except OSError as exc:
        assert exc.errno in (errno.ENETUNREACH, errno.ECONNREFUSED), exc
    s.close()
"""


def connect4_stats(cgroup: Path) -> tuple[int, int]:
    shown = json.loads(
        subprocess.run(
            ["bpftool", "-j", "cgroup", "show", str(cgroup)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    (prog,) = [p for p in shown if p["name"] == "ebpflb_connect4"]
    info = json.loads(
        subprocess.run(
            ["bpftool", "-j", "prog", "show", "id", str(prog["id"])],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    return int(info.get("run_time_ns", 0)), int(info.get("run_cnt", 0))


@dataclass
class Variant:
    """One agent to measure: a name, the source tree it runs from (None: this one) and its
    extra arguments."""

    name: str
    tree: str | None
    args: list[str]
    cgroup: Cgroup | None = None
    netns: str = ""


def parse_variant(spec: str) -> Variant:
    """NAME[:TREE[:ARGS]]: TREE a checkout of ebpflb (its agent runs with PYTHONPATH=TREE),
    empty for this one; ARGS space-separated agent arguments."""
    name, _, rest = spec.partition(":")
    tree, _, args = rest.partition(":")
    return Variant(name, tree or None, args.split())


def client(variant: Variant, n: int, connects: int, hot: int, seed: int) -> None:
    assert variant.cgroup is not None
    subprocess.run(
        [
            "nsenter",
            f"--net=/run/netns/{variant.netns}",
            "sh",
            "-c",
            f'echo $$ > {variant.cgroup.path}/cgroup.procs && exec "$0" "$@"',
            sys.executable,
            "-c",
            CLIENT,
            *(str(x) for x in (n, connects, hot, seed)),
        ],
        check=True,
    )


def measure(n: int, connects: int, rounds: int, variants: list[Variant]) -> None:
    """Every variant's agent runs at once; rounds alternate between variants and targets
    (the order rotating), so a change in the machine's load hits every variant alike."""
    services = bench_services(n, 2, node_port=False)
    with contextlib.ExitStack() as stack:
        for variant in variants:
            variant.netns = f"ebpflb-cs-{uuid.uuid4().hex[:6]}"
            subprocess.run(["ip", "netns", "add", variant.netns], check=True)
            stack.callback(subprocess.run, ["ip", "netns", "del", variant.netns], check=False)
            subprocess.run(["ip", "-n", variant.netns, "link", "set", "lo", "up"], check=True)
            variant.cgroup = Cgroup.create(f"ebpflb-cs-{uuid.uuid4().hex[:6]}")
            stack.callback(variant.cgroup.close)
            previous = os.environ.get("PYTHONPATH")
            if variant.tree:  # the agent process inherits it when it is spawned
                os.environ["PYTHONPATH"] = variant.tree
            try:
                stack.enter_context(
                    running_agent(
                        services,
                        netns=variant.netns,
                        cgroup=variant.cgroup.path,
                        extra_args=variant.args,
                    )
                )
            finally:
                if previous is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = previous
        results: dict[tuple[str, str], list[float]] = {}
        for r in range(rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for variant in order:
                assert variant.cgroup is not None
                for target in ("hot", "random"):
                    before = connect4_stats(variant.cgroup.path)
                    client(variant, n, connects, n // 2 if target == "hot" else -1, r)
                    after = connect4_stats(variant.cgroup.path)
                    runs = after[1] - before[1]
                    assert runs == connects, (runs, connects)
                    per_run = (after[0] - before[0]) / runs
                    results.setdefault((variant.name, target), []).append(per_run)
        for (name, target), per_round in results.items():
            print(
                json.dumps(
                    {
                        "services": n,
                        "variant": name,
                        "target": target,
                        "ns_per_connect4": round(statistics.median(per_round), 1),
                        "rounds": [round(x, 1) for x in per_round],
                        "connects_per_round": connects,
                    }
                ),
                flush=True,
            )


def main(argv: list[str]) -> int:
    connects, rounds, sizes, variants = 20000, 5, [], []
    it = iter(argv)
    for arg in it:
        if arg == "--connects":
            connects = int(next(it))
        elif arg == "--rounds":
            rounds = int(next(it))
        elif arg == "--variant":
            variants.append(parse_variant(next(it)))
        else:
            sizes.append(int(arg))
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    # Its namespaces and agents must not meet a kernel test session's leftover checks.
    with machine_lock("scripts/connect_prog_stats.py"):
        previous = stats.read_text().strip()
        stats.write_text("1\n")
        try:
            for n in sizes:
                measure(n, connects, rounds, variants or [Variant("this", None, [])])
        finally:
            stats.write_text(previous + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
