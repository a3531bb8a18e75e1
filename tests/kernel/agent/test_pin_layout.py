"""The pin directory's layout version with real agents and pins (ebpflb/datapath/maps/
pinlayout.py): recorded at start, older pins migrated, newer ones read where their writer
allows it and otherwise refused, with the pins and attached programs left serving."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ebpflb import __version__
from ebpflb.datapath.maps import pinlayout
from ebpflb.datapath.maps.pinlayout import Record
from ebpflb.datapath.syscall import bpfsys
from lab.harness.agentproc import AgentProcess
from lab.harness.netns import Cgroup, Topology
from tests.kernel.conftest import AgentFactory, served_by, wait_until

WEB = "10.96.0.10:80"
THIS = Record(pinlayout.LAYOUT, pinlayout.OLDEST_READER, __version__)


def pinned_maps(bpffs: Path) -> dict[str, int]:
    """Every map pinned under `bpffs`: name -> the kernel's map id."""
    found = {}
    for pin in bpffs.iterdir():
        fd = bpfsys.obj_get(str(pin))
        try:
            found[pin.name] = bpfsys.map_info(fd, pin.name).id
        except bpfsys.BpfError:  # a program's pin
            continue
        finally:
            os.close(fd)
    return found


def pin_layout_of(agent: AgentProcess) -> dict[str, Any] | None:
    """/status's pin_layout once the agent serves /status and has judged its pins."""
    try:
        layout: dict[str, Any] | None = agent.status().get("pin_layout")
    except OSError:  # not listening yet
        return None
    return layout


def test_the_layout_is_recorded_and_pins_from_before_it_are_migrated(
    topology: Topology, cgroup: Cgroup, manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    first = start_agent("--manifests", str(manifests))
    assert first.status()["pin_layout"] == {
        "layout": pinlayout.LAYOUT,
        "found": None,
        "written_by": None,
        "verdict": "fresh",
        "refused": None,
    }
    assert pinlayout.read(bpffs) == THIS
    first.stop()

    (bpffs / pinlayout.PIN).unlink()  # as an ebpflb from before the record left its pins
    second = start_agent("--manifests", str(manifests))
    layout = second.status()["pin_layout"]
    assert (layout["found"], layout["verdict"]) == (pinlayout.UNVERSIONED, "older")
    assert pinlayout.read(bpffs) == THIS
    assert second.status()["sync"]["first"]["unchanged"] == 3  # read, not rebuilt
    assert len(served_by(topology.requests(topology.node_ns, "tcp", WEB, 30, cgroup))) == 3


def test_pins_of_a_newer_layout_are_refused_and_keep_serving(
    topology: Topology, cgroup: Cgroup, manifests: Path, start_agent: AgentFactory, bpffs: Path
) -> None:
    start_agent("--manifests", str(manifests)).stop()
    newer = Record(pinlayout.LAYOUT + 1, pinlayout.LAYOUT + 1, "9.9.9")
    pinlayout.write(bpffs, newer.layout, newer.oldest_reader, newer.written_by)
    before = pinned_maps(bpffs)

    refusing = start_agent("--manifests", str(manifests), wait=False)
    wait_until(lambda: pin_layout_of(refusing) is not None, "the pin layout verdict in /status")
    layout = pin_layout_of(refusing)
    assert layout is not None
    assert (layout["found"], layout["written_by"], layout["verdict"]) == (
        newer.layout,
        "9.9.9",
        "newer-refused",
    )
    for part in (
        f"have layout {newer.layout} (written by ebpflb 9.9.9)",
        f"this ebpflb {__version__} has layout {pinlayout.LAYOUT}",
    ):
        assert part in layout["refused"]
    # Up (no restart loop) and unready; the pins, their record and the programs the
    # previous agent attached are untouched, and they keep serving.
    assert refusing.get("healthz", "/livez")[0] == 200
    assert refusing.get("healthz", "/readyz")[0] == 503
    assert refusing.proc.poll() is None
    assert pinned_maps(bpffs) == before and pinlayout.read(bpffs) == newer
    assert len(served_by(topology.requests(topology.node_ns, "tcp", WEB, 30, cgroup))) == 3
    assert refusing.stop() == 0

    # A newer writer that says this layout reads its pins: read, then recorded as this one's.
    readable = Record(pinlayout.LAYOUT + 1, pinlayout.LAYOUT, "9.9.9")
    pinlayout.write(bpffs, readable.layout, readable.oldest_reader, readable.written_by)
    reader = start_agent("--manifests", str(manifests))
    assert reader.status()["pin_layout"]["verdict"] == "newer-readable"
    assert pinlayout.read(bpffs) == THIS
    assert len(served_by(topology.requests(topology.node_ns, "tcp", WEB, 30, cgroup))) == 3
