"""The NodePort programs packet by packet: every case of tests/kernel/nodeport/packet_cases.py run
through BPF_PROG_TEST_RUN (ebpflb.datapath.programs.testrun) on the real programs, loaded by the
real loader into a private pin directory and programmed by the real control plane
(tests/kernel/nodeport/packet_runner.py). One compile per module; the table runs in seconds.

The programs look routes up (bpf_fib_lookup) in the network namespace of the thread that
runs them, so each run happens inside a namespace built as packet_cases describes the
node (setns on this thread for the syscall, then back).

test_cost_per_packet measures what a packet costs each program: the figures are reported,
not asserted; that each run took the path it is named for and was timed is (see its
docstring for why most figures come from single runs).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import partial

import pytest
from scapy.layers.inet import UDP
from scapy.layers.l2 import Ether

from ebpflb.datapath.contract import Counter
from tests.kernel.nodeport import packet_cases as pc
from tests.kernel.nodeport.packet_cases import Case, Frame, Program
from tests.kernel.nodeport.packet_runner import (
    REPEAT,
    RUNS,
    Datapath,
    Flows,
    Measurement,
    build,
    measure,
    open_datapath,
    prerequisite,
    run_case,
)

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def datapath() -> Iterator[Datapath]:
    with open_datapath() as dp:
        yield dp


@pytest.mark.parametrize("case", pc.CASES, ids=str)
def test_packet(datapath: Datapath, case: Case) -> None:
    problems = run_case(datapath, case)
    assert not problems, f"{case.id}:\n  " + "\n  ".join(problems)


def test_the_table_exercises_what_it_says() -> None:
    """Guards for cases whose point hides in their data."""
    zero_sum = next(c for c in pc.CASES if c.name.startswith("UDP whose checksum becomes 0"))
    assert isinstance(zero_sum.out, Frame)
    assert Ether(build(zero_sum.out, lambda: 0))[UDP].chksum == 0xFFFF
    assert Ether(build(zero_sum.packet, lambda: 0))[UDP].chksum not in (0, 0xFFFF)
    ids = [case.id for case in pc.CASES]
    assert len(ids) == len(set(ids))
    for case in pc.CASES:
        for name in case.after:
            prerequisite(name, case.program)


# ---- cost per packet -----------------------------------------------------------------------


def _new_flows(frontend: tuple[str, int]) -> Callable[[Flows], list[bytes]]:
    return lambda _: [build(pc.client(41000 + i, frontend), int) for i in range(RUNS)]


def _same(frame: Frame) -> Callable[[Flows], list[bytes]]:
    return lambda flows: [build(frame, flows.snat_port)] * RUNS


NO_SERVICE = _same(pc.client(40000, (pc.NODE, 30999)))
# eTP=Local without a local backend: still a drop (30085, no endpoint at all, answers a RST)
NO_BACKEND = _same(pc.client(40000, (pc.NODE, 30084)))
LOCAL_ACK = _same(pc.client(40000, (pc.NODE, 30080), tcp_flags="A"))
REMOTE_ACK = _same(pc.client(40001, (pc.NODE, 30081), tcp_flags="A"))
REMOTE_REPLY = _same(pc.REMOTE_REPLY)
LOCAL_REPLY = _same(
    Frame(pc.MAC["eth0"], pc.MAC[pc.CLIENT], pc.LOCAL, (pc.CLIENT, 40000), tcp_flags="A", ttl=63)
)
NEW, FWD, REPLY = Counter.NP_NEW_FLOW, Counter.NP_FWD, Counter.NP_REPLY


def _measurements() -> list[Measurement]:
    found = []
    for program, ok, drop, fwd in (
        (Program.TC_INGRESS, pc.OK, pc.SHOT, pc.REDIRECT),
        (Program.XDP, pc.PASS, pc.DROP, pc.XREDIRECT),
    ):
        on = partial(Measurement, program=program)
        found += [
            on("not a service port (pass)", ok, None, NO_SERVICE, repeatable=True),
            on("no backend (drop)", drop, Counter.NP_NO_BACKEND, NO_BACKEND, repeatable=True),
            on("new flow, local backend (DNAT)", ok, NEW, _new_flows((pc.NODE, 30080))),
            on("new flow, remote backend (SNAT, fwd)", fwd, NEW, _new_flows((pc.NODE, 30081))),
            on("known flow, local backend", ok, FWD, LOCAL_ACK, after=(pc.LOCAL_NEW,)),
            on("known flow, remote backend (fwd)", fwd, FWD, REMOTE_ACK, after=(pc.REMOTE_NEW,)),
            on("reply, SNATed flow (fwd)", fwd, REPLY, REMOTE_REPLY, (pc.REMOTE_NEW,), "eth1"),
        ]
    egress = partial(Measurement, program=Program.TC_EGRESS)
    found.append(egress("reply, local backend", pc.OK, REPLY, LOCAL_REPLY, (pc.LOCAL_NEW,)))
    return found


def test_cost_per_packet(
    datapath: Datapath, record_property: Callable[[str, object], None]
) -> None:
    """What one packet costs each program on each main path, measured by the kernel.

    With `repeat`, BPF_PROG_TEST_RUN runs the program again on the frame the previous
    run left: a translated frame is no longer the frame being measured (the second run of
    a DNATed SYN sees the backend's address: "not a service"), and a forwarded one loses
    a TTL per run. So every path is timed as RUNS single runs on fresh copies (the median
    includes the timer's own cost, about the difference between the two figures of the
    paths that leave the frame unchanged, which are also timed with REPEAT in one call).
    Tiny maps, hot caches: best-case figures, and this machine is shared: the figures are
    reported, not asserted. What is asserted is that they measure what they say: every run
    took the path named (its verdict, its counter moved once per run and no other did)
    and the kernel timed every run.
    """
    timed = [measure(datapath, m) for m in _measurements()]
    datapath.forget_flows()
    for t in timed:
        m = t.measurement
        assert len(t.single) == RUNS, m.name
        assert {r.verdict for r in t.single} == {m.verdict}, (m.name, t.single[0].verdict)
        assert t.moved == t.expected_moves(), (m.name, t.moved)
        assert all(r.duration_ns > 0 for r in t.single), (m.name, [r.duration_ns for r in t.single])
        if m.repeatable:
            assert t.repeated is not None and t.repeated.repeat == REPEAT, m.name
            assert t.repeated.verdict == m.verdict and t.repeated.duration_ns > 0, m.name
        else:
            assert t.repeated is None, m.name
    rows = [t.figures() for t in timed]
    record_property("cost_per_packet", json.dumps(rows))
    for row in rows:
        repeat = f"  repeat {row['repeat_mean_ns']:>4} ns" if "repeat_mean_ns" in row else ""
        print(f"{row['program']:<14} {row['path']:<48} {row['single_median_ns']:>6} ns{repeat}")
