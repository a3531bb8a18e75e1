"""The kernel feature probe on the running kernel, and what a real agent shows of it.

On this machine's kernel every feature is there; in the kernel matrix's guests (5.10, 6.1)
the features newer than the guest (bpf_set_retval) must be reported missing by a running
agent, in /status and in the metric, while it serves all the same.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import pytest

from ebpflb.datapath import probes
from lab.harness.agentproc import TIMEOUT_SCALE
from lab.harness.netns import Cgroup
from tests.kernel.conftest import AgentFactory

pytestmark = pytest.mark.kernel


def _mainline(release: str) -> tuple[int, ...]:
    major, minor = release.split(".")[:2]
    return (int(major), int("".join(c for c in minor if c.isdigit())))


def test_every_feature_of_this_kernel_version_is_found_in_milliseconds() -> None:
    started = time.perf_counter()
    report = probes.probe()
    elapsed = time.perf_counter() - started
    assert [p.feature.key for p in report.probed] == list(probes.BY_KEY)
    running = _mainline(platform.release())
    expected = {key for key, f in probes.BY_KEY.items() if probes._version(f.since) <= running}
    found = {key for key, ok in report.availability().items() if ok}
    # A distribution kernel may have backported more; it must not have less.
    assert expected <= found, {p.feature.key: p.error for p in report.probed if not p.available}
    assert elapsed < 0.5 * TIMEOUT_SCALE, f"probing took {elapsed:.3f}s"


def test_the_agent_shows_the_kernel_features_in_status_and_metrics(
    cgroup: Cgroup, manifests: Path, start_agent: AgentFactory
) -> None:
    agent = start_agent("--manifests", str(manifests))
    found = probes.probe().availability()
    features = agent.status()["features"]
    assert {key: entry["available"] for key, entry in features.items()} == found
    for key, entry in features.items():
        assert entry["used_for"] and entry["fallback"], key
    scrape = agent.metrics()
    for key, available in found.items():
        assert scrape.value("ebpflb_kernel_feature", feature=key) == float(available)
