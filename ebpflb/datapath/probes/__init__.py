"""What this kernel's BPF subsystem offers, found by trying each thing the agent uses.

Each probe makes one bpf(2) call with a hand-assembled program (a few instructions), a tiny
map or a BTF blob, and drops it at once: no compiler, no verifier log, a few milliseconds
for all of them. Probing by trying rather than by version number is what distribution
kernels need: they backport features (and a few leave some out).

What the agent does with the answers is pure (`assess`), so it is unit-tested with made-up
results: a missing feature the configuration needs stops the start with a KernelSetupError
naming it and the kernel it needs, before anything is compiled or attached; a missing
optional one costs one log line saying what the user loses, and is shown in /status
(`features`) and in the metric ebpflb_kernel_feature{feature}.

features.py is the table (each feature, the trial finding it, what its absence costs),
trials.py the trials (hand-assembled programs and tiny maps); this module runs them and
judges the answers.
"""

from __future__ import annotations

import errno
import json
import logging
import platform
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ebpflb.datapath.probes.features import BY_KEY, FEATURES, Feature, Need
from ebpflb.datapath.probes.trials import Probe
from ebpflb.datapath.syscall import bpfsys
from ebpflb.errors import KernelSetupError

__all__ = [
    "BY_KEY",
    "FEATURES",
    "Assessment",
    "Feature",
    "FeatureCollector",
    "KernelReport",
    "Need",
    "Probed",
    "assess",
    "check",
    "main",
    "minimum_kernel",
    "probe",
    "setup_error",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Probed:
    feature: Feature
    available: bool
    error: str  # the errno's name when unavailable ("EINVAL"), else ""
    seconds: float


@dataclass(frozen=True, slots=True)
class KernelReport:
    """The probe's findings on one kernel."""

    release: str
    probed: tuple[Probed, ...]

    def has(self, key: str) -> bool:
        return any(p.available for p in self.probed if p.feature.key == key)

    def availability(self) -> dict[str, bool]:
        return {p.feature.key: p.available for p in self.probed}

    def seconds(self) -> float:
        return sum(p.seconds for p in self.probed)

    def status(self) -> dict[str, dict[str, Any]]:
        """The /status `features` section: {key: {available, used_for, fallback, ...}}."""
        return {
            p.feature.key: {
                "available": p.available,
                "name": p.feature.name,
                "since": p.feature.since,
                "needed": p.feature.need.value,
                "used_for": p.feature.used_for,
                "fallback": p.feature.fallback,
                **({"error": p.error} if p.error else {}),
            }
            for p in self.probed
        }


def probe(features: Sequence[tuple[Feature, Probe]] = FEATURES) -> KernelReport:
    """Try every feature on the running kernel. KernelSetupError when the probe itself is
    refused (EPERM: not root / no CAP_BPF), which no kernel feature explains."""
    results = []
    for feature, attempt in features:
        started = time.perf_counter()
        error = ""
        try:
            attempt()
        except bpfsys.BpfError as exc:
            if exc.errno == errno.EPERM:
                raise KernelSetupError(
                    f"probing kernel features failed: {exc} (the agent needs root, or "
                    "CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON)"
                ) from exc
            error = errno.errorcode.get(exc.errno, str(exc.errno))
        results.append(Probed(feature, not error, error, time.perf_counter() - started))
    return KernelReport(platform.release(), tuple(results))


# --- what the agent does with the findings (pure) -------------------------------------------


@dataclass(frozen=True, slots=True)
class Assessment:
    missing_required: tuple[Feature, ...]
    lost: tuple[str, ...]  # one log line per missing feature that is not required here


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def minimum_kernel(nodeport: bool) -> str:
    """The oldest mainline kernel with every feature the agent needs (with --interfaces
    when `nodeport`)."""
    needed = [
        f.since
        for f, _ in FEATURES
        if f.need is Need.ALWAYS or (nodeport and f.need is Need.NODEPORT)
    ]
    return max(needed, key=_version)


def assess(available: Mapping[str, bool], *, nodeport: bool, xdp: bool) -> Assessment:
    """Which missing features stop the start (for this configuration: `nodeport` is
    --interfaces naming any, `xdp` is --xdp other than off), and the line to log for each
    other missing one. A feature absent from `available` counts as missing."""
    required: list[Feature] = []
    lost: list[str] = []
    for feature in BY_KEY.values():
        if available.get(feature.key, False):
            continue
        needed = feature.need is Need.ALWAYS or (nodeport and feature.need is Need.NODEPORT)
        if needed:
            required.append(feature)
        elif feature.need is Need.NODEPORT:
            lost.append(
                f"kernel lacks {feature.name} ({feature.since}+): NodePort (--interfaces) "
                f"cannot run here; socket-LB is unaffected"
            )
        elif feature.need is Need.OPTIONAL and (feature.key != "xdp" or xdp):
            lost.append(f"kernel lacks {feature.name} ({feature.since}+): {feature.fallback}")
        else:
            lost.append(f"kernel lacks {feature.name} ({feature.since}+): not used, nothing lost")
    return Assessment(tuple(required), tuple(lost))


def setup_error(missing: Sequence[Feature], release: str, nodeport: bool) -> KernelSetupError:
    names = "; ".join(f"{f.name} (Linux {f.since}+, for {f.used_for})" for f in missing)
    return KernelSetupError(
        f"kernel {release} lacks what ebpflb needs: {names}. ebpflb needs Linux "
        f"{minimum_kernel(nodeport)} or newer{' with --interfaces' if nodeport else ''}"
    )


def check(report: KernelReport, *, nodeport: bool, xdp: bool) -> Assessment:
    """Log one line per missing feature that is not required; KernelSetupError naming
    the required ones that are missing."""
    verdict = assess(report.availability(), nodeport=nodeport, xdp=xdp)
    if verdict.missing_required:
        raise setup_error(verdict.missing_required, report.release, nodeport)
    for line in verdict.lost:
        log.warning("%s", line)
    log.info(
        "probed %d kernel features in %.1f ms: %d available",
        len(report.probed),
        report.seconds() * 1000,
        sum(p.available for p in report.probed),
    )
    return verdict


class FeatureCollector(Collector):
    """ebpflb_kernel_feature{feature}: 1 where the kernel has it, 0 where it does not."""

    def __init__(self, report: KernelReport) -> None:
        self._report = report

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "ebpflb_kernel_feature",
            "Whether the kernel has a BPF feature ebpflb uses (1) or not (0), by probing.",
            labels=["feature"],
        )
        for probed in self._report.probed:
            family.add_metric([probed.feature.key], 1.0 if probed.available else 0.0)
        yield family


def main(argv: Sequence[str]) -> int:
    """`python -m ebpflb.datapath.probes [--json]`: this kernel's features (the kernel
    matrix records the JSON per kernel)."""
    report = probe()
    if "--json" in argv:
        print(json.dumps(report.availability(), indent=2, sort_keys=True))
        return 0
    for p in report.probed:
        state = "yes" if p.available else f"no ({p.error})"
        print(f"{p.feature.key:16} {state:12} {p.seconds * 1000:6.2f} ms  {p.feature.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
