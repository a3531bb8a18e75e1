"""Find (and with --remove, delete) what a crashed test or demo run may have left behind:
network namespaces, cgroups and bpffs pin directories named like the ones tests create.

Names: namespaces "elb*" / "ebpflb-*", cgroups and pin directories "ebpflb-*" (never the
production pin directory /sys/fs/bpf/ebpflb itself).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from ebpflb.datapath.syscall.mounts import cgroup2_root

BPFFS = Path("/sys/fs/bpf")
NETNS_PREFIXES = ("elb", "ebpflb-")
DIR_PREFIX = "ebpflb-"


def namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return sorted(n.split()[0] for n in out.splitlines() if n.startswith(NETNS_PREFIXES))


def cgroups() -> list[Path]:
    return sorted(p for p in cgroup2_root().glob(f"{DIR_PREFIX}*") if p.is_dir())


def pin_dirs() -> list[Path]:
    return sorted(p for p in BPFFS.glob(f"{DIR_PREFIX}*"))


def find() -> dict[str, list[str]]:
    found = {
        "namespaces": namespaces(),
        "cgroups": [str(p) for p in cgroups()],
        "pins": [str(p) for p in pin_dirs()],
    }
    return {k: v for k, v in found.items() if v}


def remove() -> None:
    from ebpflb.datapath.programs import loader  # needs bcc: only when removing

    for cg in cgroups():
        loader.cleanup(BPFFS / "ebpflb-unused", cg, interfaces=())
        for pid in (cg / "cgroup.procs").read_text().split():
            subprocess.run(["kill", "-9", pid], check=False)
        cg.rmdir()
    for pins in pin_dirs():
        for pin in pins.iterdir():
            pin.unlink()
        pins.rmdir()
    for ns in namespaces():
        subprocess.run(["ip", "netns", "del", ns], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.harness.leftovers")
    parser.add_argument("--remove", action="store_true")
    args = parser.parse_args()
    if args.remove:
        remove()
    found = find()
    for kind, items in found.items():
        print(f"{kind}: {' '.join(items)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
