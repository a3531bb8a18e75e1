"""The pod-interface programs packet by packet: every case of pod_packet_cases.py run
through BPF_PROG_TEST_RUN on the real programs (the pod variant of bpf/nodeport.c next to
the node's), with the NodePort table's node, services and runner
(tests/kernel/nodeport/packet_runner.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kernel.nodeport.packet_cases import Case
from tests.kernel.nodeport.packet_runner import Datapath, open_datapath, run_case
from tests.kernel.podpath.pod_packet_cases import POD_CASES

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def datapath() -> Iterator[Datapath]:
    with open_datapath(pods=True, cases=POD_CASES) as dp:
        yield dp


@pytest.mark.parametrize("case", POD_CASES, ids=str)
def test_pod_packet(datapath: Datapath, case: Case) -> None:
    problems = run_case(datapath, case)
    assert not problems, f"{case.id}:\n  " + "\n  ".join(problems)
