"""The pin layout's verdicts, and the guard that makes a layout change bump the version."""

from __future__ import annotations

from pathlib import Path

import pytest

from ebpflb.datapath.maps import pinlayout
from ebpflb.datapath.maps.pinlayout import Record, Verdict, judge


def test_the_fingerprint_follows_the_pinned_layout() -> None:
    """A changed map shape, struct field or stored flag changes describe(): bump LAYOUT
    (and OLDEST_READER if older agents would misread the new pins), then FINGERPRINT."""
    assert pinlayout.fingerprint() == pinlayout.FINGERPRINT, (
        "the pinned maps' layout changed: bump pinlayout.LAYOUT (and OLDEST_READER if an"
        f" older agent would misread it) and set FINGERPRINT = {pinlayout.fingerprint()!r}"
    )
    assert pinlayout.UNVERSIONED < pinlayout.OLDEST_READER <= pinlayout.LAYOUT
    description = pinlayout.describe()
    assert "ebpflb_ct4 LRU_HASH" in description and "CT_F_SNAT=1" in description
    assert "STAT_" not in description  # counters are only ever added


@pytest.mark.parametrize(
    ("found", "has_maps", "verdict"),
    [
        (None, False, Verdict.FRESH),
        (Record(9, 9, "9.0"), False, Verdict.FRESH),  # a record left without maps
        (None, True, Verdict.OLDER),  # pins from before the record: layout 1
        (Record(2, 2, "0.1.0"), True, Verdict.SAME),
        (Record(1, 1, "0.0.9"), True, Verdict.OLDER),
        (Record(3, 2, "0.3.0"), True, Verdict.NEWER_READABLE),
        (Record(3, 3, "0.3.0"), True, Verdict.NEWER_REFUSED),
    ],
)
def test_verdicts(found: Record | None, has_maps: bool, verdict: Verdict) -> None:
    assert judge(found, has_maps, layout=2) is verdict


def test_the_refusal_names_both_versions_and_the_ways_out() -> None:
    message = pinlayout.refusal(Path("/sys/fs/bpf/ebpflb"), Record(7, 5, "0.9.0"))
    assert "layout 7 (written by ebpflb 0.9.0)" in message
    assert f"has layout {pinlayout.LAYOUT}" in message and "readable by layout 5" in message
    assert "Run ebpflb 0.9.0 or newer" in message and "ebpflb cleanup" in message
