"""Which kernel test files CI runs on which kernel line (`make test-kernels-ci`, .ci/run).

Under software emulation the whole kernel suite does not fit twice in CI's 90 minutes: in
CI's run of it, both guests at once were killed at 75 minutes about 56% of the way through.
So CI splits the files by what they test:

- what differs between kernels (hooks, helpers, map kinds, program loading and pinning, the
  packet paths, map-full errors) runs on every line;
- the agent's own behaviour (its process life, HTTP endpoints, the API source, the CLI),
  which runs the same programs and maps the files above already check on each line, runs on
  one line, the files alternating so that both guests take about as long.

Every file in tests/kernel is placed (tests/unit/test_kernel_matrix.py checks), so a new
file cannot silently stay out of CI. `make test-kernels` still runs every file on every line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ebpflb.testing.kernels.plan import KERNEL_TESTS

LINES = ("5.10", "6.1")
_EVERY = frozenset(LINES)

KERNEL_FEATURE = "tests what differs between kernels: runs on every line"
AGENT_BEHAVIOUR = (
    "tests the agent's own behaviour on programs and maps the kernel-feature files check on "
    "every line: runs on one line in CI"
)
HOST_ONLY = "left out on every line (plan.EXCLUDED says why): runs in the host's make test"


@dataclass(frozen=True, slots=True)
class Placement:
    """One kernel test file and the kernel lines CI runs it on."""

    file: str  # test_x.py, in tests/kernel
    kernel_lines: frozenset[str]
    why: str

    @property
    def path(self) -> str:
        return f"{KERNEL_TESTS}/{self.file}"


def _every(file: str) -> Placement:
    return Placement(file, _EVERY, KERNEL_FEATURE)


def _one(file: str, line: str) -> Placement:
    return Placement(file, frozenset({line}), AGENT_BEHAVIOUR)


# Minutes are per file under emulation with both guests at once (the measuring run is named
# in the README's kernel section); the agent-behaviour files are balanced on them.
PLACEMENTS: Sequence[Placement] = (
    _every("test_layout.py"),
    _every("test_probes.py"),
    _every("test_progcache.py"),
    _every("test_restart_adopt.py"),
    _every("test_batch_ops.py"),
    _every("test_grow.py"),
    _every("test_maglev_datapath.py"),
    _every("test_packets.py"),
    _every("test_socket_lb.py"),
    _every("test_socket_lb6.py"),
    _every("test_nodeport.py"),
    _every("test_semantics_policy.py"),
    _every("test_semantics_affinity.py"),
    _every("test_semantics_udp.py"),
    _every("test_capacity.py"),
    _one("test_bad_input.py", "5.10"),
    _one("test_bench_compare.py", "6.1"),  # its kernel-memory figure needs 5.18 (plan.py)
    _one("test_bench_loadgen.py", "5.10"),
    _one("test_bench_rules.py", "5.10"),
    _one("test_crash.py", "6.1"),
    _one("test_explain.py", "5.10"),
    _one("test_kubernetes_e2e.py", "6.1"),
    _one("test_metrics.py", "6.1"),
    _one("test_migrate.py", "5.10"),
    _one("test_node_addresses.py", "6.1"),
    _one("test_observe.py", "5.10"),
    _one("test_one_agent.py", "6.1"),
    _one("test_semantics_topology.py", "5.10"),
    _one("test_zero_loss.py", "5.10"),
    Placement("test_package.py", frozenset(), HOST_ONLY),
)


def files_on(line: str, placements: Sequence[Placement] = PLACEMENTS) -> tuple[str, ...]:
    """The pytest selection CI gives `line`'s guest."""
    return tuple(p.path for p in placements if line in p.kernel_lines)


def unplaced(test_files: Iterable[str], placements: Sequence[Placement] = PLACEMENTS) -> list[str]:
    """Kernel test files (names) no placement covers."""
    placed = {p.file for p in placements}
    return sorted(f for f in test_files if f not in placed)
