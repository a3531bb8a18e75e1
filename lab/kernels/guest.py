"""What runs inside a guest: `python -m lab.kernels.guest RESULTS_DIR`.

Reads RESULTS_DIR/plan.json (written by the host), records what kernel it runs on, runs the
feature probe if the plan names one, then pytest with the plan's arguments, writing only
into RESULTS_DIR and the guest's tmpfs. Its exit status is pytest's (or 3 when the probe
could not run); the init prints it on the console and the host reads it back.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Plan:
    """What the host asks the guest to run (plan.json in the results share)."""

    repo: str  # the checkout, the same path in the guest (the host's root is shared)
    pytest_args: list[str]  # after `python -m pytest`
    env: dict[str, str] = field(default_factory=dict)
    # argv after `python -m` whose stdout (JSON) is the kernel's feature report, once the
    # agent has one (e.g. ["ebpflb", "features", "--json"]); None: no probe step.
    probe: list[str] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls(**json.loads(text))


def main(argv: list[str]) -> int:
    results = Path(argv[1])
    plan = Plan.from_json((results / "plan.json").read_text())
    env = {**os.environ, **plan.env}
    started = time.time()
    (results / "guest.json").write_text(
        json.dumps(
            {
                "release": platform.release(),
                "version": Path("/proc/version").read_text().strip(),
                "started": started,
            },
            indent=2,
        )
        + "\n"
    )
    if plan.probe is not None:
        probe = subprocess.run(
            [sys.executable, "-m", *plan.probe],
            cwd=plan.repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        (results / "probe.stderr").write_text(probe.stderr)
        if probe.returncode != 0:
            print(f"guest: probe failed ({probe.returncode}):\n{probe.stderr}", flush=True)
            return 3
        (results / "features.json").write_text(probe.stdout)
    print(f"guest: pytest {' '.join(plan.pytest_args)}", flush=True)
    status = subprocess.run(
        [sys.executable, "-m", "pytest", *plan.pytest_args], cwd=plan.repo, env=env
    ).returncode
    print(f"guest: pytest exited {status} after {time.time() - started:.0f}s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
