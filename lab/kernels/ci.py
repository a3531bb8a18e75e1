"""Which kernel test files CI runs in the guests (`make test-kernels-ci`, .ci/run).

Under software emulation the whole kernel suite does not fit in CI's 90 minutes: in CI's run
of it, both guests at once were killed at 75 minutes about 56% of the way through (20
SIGKILL cycles of test_crash alone took over 30 minutes per guest). So CI's guests run the
files that test what differs between kernels (hooks, helpers, map kinds, program loading and
pinning, the packet paths in tc and XDP, map-full errors, the semantics' datapath paths), on
every line; the files that test the agent's own behaviour (its process life, HTTP endpoints,
the API source, the CLI, the bench), on programs and maps those files already check on each
line, run in CI on the host's kernel only (`make test`), and on 5.10 and 6.1 with
`make test-kernels`, which runs every file on every line.

Every file in tests/kernel is placed (tests/unit/lab/kernels/test_kernel_matrix.py checks), so a new
file cannot silently stay out of the guests: it has to be placed with its reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lab.kernels.plan import KERNEL_TESTS

LINES = ("5.10", "6.1")
_EVERY = frozenset(LINES)

KERNEL_FEATURE = "tests what differs between kernels: CI runs it on every line"
AGENT_BEHAVIOUR = (
    "tests the agent's own behaviour on programs and maps the kernel-feature files check on "
    "every line: CI runs it on the host's kernel (make test), make test-kernels on every line"
)
HOST_ONLY = "left out on every line (plan.EXCLUDED says why): runs in the host's make test"
ONE_LINE = (
    "tests a kernel feature that another file already checks on every line, or one only this"
    " line has: CI runs it on this line only (its guest time is spent where it tells most;"
    " make test-kernels runs it on every line)"
)


@dataclass(frozen=True, slots=True)
class Placement:
    """One kernel test file and the kernel lines CI runs it on."""

    file: str  # area/test_x.py, under tests/kernel
    kernel_lines: frozenset[str]
    why: str

    @property
    def path(self) -> str:
        return f"{KERNEL_TESTS}/{self.file}"


def _every(file: str) -> Placement:
    return Placement(file, _EVERY, KERNEL_FEATURE)


def _on(line: str, file: str) -> Placement:
    return Placement(file, frozenset({line}), ONE_LINE)


def _host(file: str) -> Placement:
    return Placement(file, frozenset(), AGENT_BEHAVIOUR)


# CI's 90 minutes hold the host's make test and make test-deploy and both guests (about an
# hour of emulation for the 5.10 selection had every file run on both lines); so each line
# runs every file whose subject differs between kernels (the packet paths, hooks, map
# layouts, MTU and ICMP handling), and the files whose kernel-side subject those already
# cover are split between the lines, the slower 5.10 taking less.
PLACEMENTS: Sequence[Placement] = (
    _every("datapath/test_layout.py"),
    _every("datapath/test_probes.py"),
    _on("5.10", "datapath/test_progcache.py"),
    _on("5.10", "datapath/test_restart_adopt.py"),
    _every("datapath/test_batch_ops.py"),
    _on("6.1", "datapath/test_grow.py"),
    _every("datapath/test_maglev.py"),
    _every("nodeport/test_packets.py"),
    _every("socketlb/test_socket_lb.py"),
    # connect6 and the IPv6 paths of socket-LB: the same hooks as test_socket_lb's.
    _on("6.1", "socketlb/test_socket_lb6.py"),
    _every("nodeport/test_nodeport.py"),
    # The regression it guards is 5.12+ (bpf_fib_lookup's tot_len for skbs): 6.1 has it.
    _on("6.1", "nodeport/test_bulk.py"),
    _every("nodeport/test_real_networks.py"),
    _every("nodeport/test_overlay.py"),
    _on("5.10", "semantics/test_policy.py"),
    _on("6.1", "semantics/test_affinity.py"),
    _on("6.1", "semantics/test_udp.py"),
    _every("datapath/test_capacity.py"),
    _host("datapath/test_headers.py"),
    _host("agent/test_bad_input.py"),
    _host("bench/test_bulk.py"),
    _host("bench/test_compare.py"),
    _host("bench/test_loadgen.py"),
    _host("bench/test_rules.py"),
    _host("agent/test_crash.py"),
    _host("agent/test_explain.py"),
    _host("agent/test_kubernetes_e2e.py"),
    _host("agent/test_metrics.py"),
    _host("agent/test_migrate.py"),
    _host("nodeport/test_node_addresses.py"),
    _host("agent/test_observe.py"),
    _host("agent/test_one_agent.py"),
    _host("agent/test_prometheus.py"),
    _host("semantics/test_topology.py"),
    _host("agent/test_zero_loss.py"),
    Placement("agent/test_package.py", frozenset(), HOST_ONLY),
)


def files_on(line: str, placements: Sequence[Placement] = PLACEMENTS) -> tuple[str, ...]:
    """The pytest selection CI gives `line`'s guest."""
    return tuple(p.path for p in placements if line in p.kernel_lines)


def unplaced(
    test_files: Iterable[str], placements: Sequence[Placement] = PLACEMENTS
) -> list[str]:
    """Kernel test files (names) no placement covers."""
    placed = {p.file for p in placements}
    return sorted(f for f in test_files if f not in placed)
