"""In-kernel cost of ebpflb's connect4 program per call (kernel.bpf_stats_enabled:
run_time_ns / run_cnt), for connects to one hot service and to random ones among N.

    python scripts/connect_prog_stats.py N [N...] [--connects C] [--rounds R] [-- AGENT-ARGS]

For each N: the bench's services (ebpflb.bench.scenario, 2 endpoints each) served from a
fake API to an agent in a fresh network namespace with only `lo` (so every translated
connect() fails at once with ENETUNREACH: the program's cost is all that is measured, and
nothing leaves the namespace), socket-LB on a fresh cgroup; a client in both does C
blocking connect()s per round, alternating hot and random rounds, and the program's
counters are read around each round. Prints one JSON line per (N, target): ns per run,
median over rounds, and the rounds. Run as root; it sets kernel.bpf_stats_enabled for its
duration and restores it. Wall-clock figures are not taken: the machine may be shared.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

from ebpflb.bench.agentrun import running_agent
from ebpflb.bench.scenario import bench_services, vip
from ebpflb.testing.netns import Cgroup

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


def measure(n: int, connects: int, rounds: int, agent_args: list[str]) -> None:
    netns = f"ebpflb-cs-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    cgroup = Cgroup.create(f"ebpflb-cs-{uuid.uuid4().hex[:6]}")
    try:
        subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
        services = bench_services(n, 2, node_port=False)
        with running_agent(services, netns=netns, cgroup=cgroup.path, extra_args=agent_args):
            results: dict[str, list[float]] = {"hot": [], "random": []}
            for r in range(rounds * 2):
                target = "hot" if r % 2 == 0 else "random"
                hot = n // 2 if target == "hot" else -1
                before = connect4_stats(cgroup.path)
                subprocess.run(
                    [
                        "nsenter",
                        f"--net=/run/netns/{netns}",
                        "sh",
                        "-c",
                        f'echo $$ > {cgroup.path}/cgroup.procs && exec "$0" "$@"',
                        sys.executable,
                        "-c",
                        CLIENT,
                        str(n),
                        str(connects),
                        str(hot),
                        str(r),
                    ],
                    check=True,
                )
                after = connect4_stats(cgroup.path)
                runs = after[1] - before[1]
                assert runs == connects, (runs, connects)
                results[target].append((after[0] - before[0]) / runs)
            for target, per_round in results.items():
                print(
                    json.dumps(
                        {
                            "services": n,
                            "target": target,
                            "agent_args": agent_args,
                            "ns_per_connect4": round(statistics.median(per_round), 1),
                            "rounds": [round(x, 1) for x in per_round],
                            "connects_per_round": connects,
                            "hot_vip": str(vip(n // 2)),
                        }
                    ),
                    flush=True,
                )
    finally:
        cgroup.close()
        subprocess.run(["ip", "netns", "del", netns], check=False)


def main(argv: list[str]) -> int:
    agent_args: list[str] = []
    if "--" in argv:
        agent_args = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    connects, rounds, sizes = 20000, 5, []
    it = iter(argv)
    for arg in it:
        if arg == "--connects":
            connects = int(next(it))
        elif arg == "--rounds":
            rounds = int(next(it))
        else:
            sizes.append(int(arg))
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    previous = stats.read_text().strip()
    stats.write_text("1\n")
    try:
        for n in sizes:
            measure(n, connects, rounds, agent_args)
    finally:
        stats.write_text(previous + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
