"""Which kernel tests CI runs in the guests (`make test-kernels-ci`, .ci/run).

Under software emulation the whole kernel suite does not fit in CI's 90 minutes: in CI's run
of it, both guests at once were killed at 75 minutes about 56% of the way through (20
SIGKILL cycles of test_crash alone took over 30 minutes per guest), and CI's run of the
previous selection (every kernel-feature file on both lines, with the host's `make test`
beside the guests) was killed at 80 minutes with 5.10 at 88% and 6.1 at 98%. So CI's guests
run the files that test what differs between kernels (hooks, helpers, map kinds, program
loading, the packet paths in tc and XDP), and where a file runs the same tests once per
datapath mode or address family, each line runs one of them: NodePort's [tc] cases on 5.10,
its [xdp-native] ones on 6.1 (whose packet tables also run the XDP program). The files
whose kernel-side subject those already check on every line, and the files that test the
agent's own behaviour, run in CI on the host's kernel only (`make test`); `make
test-kernels` runs every test on every line.

Every file in tests/kernel is placed (tests/unit/lab/kernels/test_kernel_matrix.py checks), so a
new file cannot silently stay out of the guests: it has to be placed with its reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from lab.kernels.plan import KERNEL_TESTS

LINES = ("5.10", "6.1")
_EVERY = frozenset(LINES)

KERNEL_FEATURE = "tests what differs between kernels: CI runs it on every line"
SPLIT = (
    "tests what differs between kernels, the same tests once per datapath mode or address"
    " family: CI runs each test on one line at least, each variant on one line (make"
    " test-kernels runs all of them on every line)"
)
ONE_LINE = (
    "tests a kernel feature that another file already checks on every line, or one only this"
    " line has: CI runs it on this line only (make test-kernels runs it on every line)"
)
COVERED = (
    "its kernel-side subject (the hooks, map kinds and helpers it uses) is checked on every"
    " line by the files above: CI runs it on the host's kernel (make test), make test-kernels"
    " on every line"
)
AGENT_BEHAVIOUR = (
    "tests the agent's own behaviour on programs and maps the kernel-feature files check on "
    "every line: CI runs it on the host's kernel (make test), make test-kernels on every line"
)
HOST_ONLY = "left out on every line (plan.EXCLUDED says why): runs in the host's make test"
E2E_ROWS = (
    "upstream e2e rows whose outcome depends on the kernel: CI runs those tests on the lines"
    " named; the whole suite runs on the host (make test) and on every line with make"
    " test-kernels-e2e (docs/e2e.md's 5.10 and 6.1 columns)"
)


@dataclass(frozen=True, slots=True)
class Placement:
    """One kernel test file, the kernel lines CI runs it on, and what it leaves out there."""

    file: str  # area/test_x.py, under tests/kernel
    kernel_lines: frozenset[str]
    why: str
    # (line, test-id fragment): tests CI's guest of that line leaves out of this file, e.g.
    # ("6.1", "[tc") for the cases the 5.10 guest runs. Matched as pytest -k does.
    left_out: tuple[tuple[str, str], ...] = ()
    # (line, test-id fragment): on that line only the tests matching it (pytest -k).
    only: tuple[tuple[str, str], ...] = ()

    @property
    def path(self) -> str:
        return f"{KERNEL_TESTS}/{self.file}"

    @property
    def module(self) -> str:
        return PurePosixPath(self.file).name


def _every(file: str) -> Placement:
    return Placement(file, _EVERY, KERNEL_FEATURE)


def _split(file: str, per_line: Mapping[str, tuple[str, ...]]) -> Placement:
    left_out = tuple(
        (line, fragment) for line, fragments in per_line.items() for fragment in fragments
    )
    return Placement(file, _EVERY, SPLIT, left_out)


def _on(line: str, file: str, *left_out: str) -> Placement:
    return Placement(file, frozenset({line}), ONE_LINE, tuple((line, f) for f in left_out))


def _covered(file: str) -> Placement:
    return Placement(file, frozenset(), COVERED)


def _host(file: str) -> Placement:
    return Placement(file, frozenset(), AGENT_BEHAVIOUR)


def _e2e(file: str, only: Mapping[str, str | None]) -> Placement:
    """An e2e file on the lines named: the tests matching the fragment there (None: all)."""
    return Placement(
        file,
        frozenset(only),
        E2E_ROWS,
        only=tuple((line, f) for line, f in only.items() if f is not None),
    )


# Datapath modes: 5.10 runs NodePort's tc cases, 6.1 its native-XDP ones (6.1's packet
# tables also run the XDP program through BPF_PROG_TEST_RUN, which 5.10 lacks), and the
# interface clean-up test runs on 5.10 only: each line compiles one datapath variant.
_MODES = {
    "5.10": ("[xdp-native",),
    "6.1": ("[tc", "test_cleanup_removes_tc_filters_and_xdp"),
}
# socket-LB: IPv4 on 5.10, IPv6 on 6.1; the agent-behaviour tests in the file (manifest
# edits, restart, bad input, maps dump) on 6.1, the faster guest.
_SOCKET_LB = {
    "5.10": (
        "[ipv6",
        "test_manifest_edit",
        "test_restart_keeps_traffic",
        "test_bad_input_is_named",
        "test_maps_dump",
    ),
    "6.1": ("[ipv4",),
}

# CI's run of the previous split (every kernel-feature file on both lines, NodePort and the
# real networks in XDP on 5.10 and tc on 6.1) took 62 minutes on 6.1, 38 of them in cold
# compiles of one more program variant per file (the overlay's 5.5, the clean-up test's
# 4.5), and 5.10 past its 70-minute limit: so each line compiles the fewest variants.
PLACEMENTS: Sequence[Placement] = (
    _every("datapath/test_layout.py"),
    _every("datapath/test_probes.py"),
    _every("datapath/test_batch_ops.py"),
    _every("datapath/test_maglev.py"),
    _every("nodeport/test_packets.py"),
    _split("socketlb/test_socket_lb.py", _SOCKET_LB),
    _split("nodeport/test_nodeport.py", _MODES),
    # ICMP, MTU, fragments and real servers, in both modes, on the line that also runs the
    # XDP program's packet table.
    _on("6.1", "nodeport/test_real_networks.py"),
    # The regression it guards is the tc path's (bpf_fib_lookup's tot_len for GSO skbs, 5.12+;
    # XDP runs before GRO): 6.1 has it.
    _on("6.1", "nodeport/test_bulk.py", "[xdp"),
    # Map-full errors: the kernel answers the same on both lines (E2BIG, ENOSPC).
    _covered("datapath/test_capacity.py"),
    # The per-packet ClusterIP path is bpf/nodeport.c's tc programs built for pods'
    # interfaces (EBPFLB_POD_PATH): a variant of its own for each verifier, so its packet
    # table runs on every line (one more cold compile each, ~100 s on 5.10); its traffic
    # tests use the hooks and helpers test_nodeport runs on each line.
    _every("podpath/test_pod_packets.py"),
    _covered("podpath/test_pod_path.py"),
    _covered("podpath/test_pod_path_two_nodes.py"),
    # bpf_get_netns_cookie() in sock_addr programs is 5.7+ (both lines have it, and
    # test_socket_lb's affinity cases use it there); the agent's own cookie
    # (SO_NETNS_COOKIE) is 5.14+: 5.10 shows hostns-only refused at start (its tests check
    # the refusal there), 6.1 behaves as the host's kernel.
    _on("5.10", "socketlb/test_socket_lb_scope.py"),
    # The tc path's SNAT and FIB lookup through a VXLAN device: test_nodeport's on each line.
    _covered("nodeport/test_overlay.py"),
    # bpf_skb_pull_data (4.9+) is in the NodePort programs every line loads; the frames it
    # is for come from trafgen's TX_RING, which behaves alike on every kernel.
    _covered("nodeport/test_paged_headers.py"),
    _covered("datapath/test_progcache.py"),
    _covered("datapath/test_restart_adopt.py"),
    _covered("datapath/test_grow.py"),
    _covered("socketlb/test_socket_lb6.py"),
    _covered("semantics/test_policy.py"),
    _covered("semantics/test_affinity.py"),
    _covered("semantics/test_udp.py"),
    _host("datapath/test_headers.py"),
    _host("agent/test_bad_input.py"),
    _host("bench/test_bulk.py"),
    _host("bench/test_compare.py"),
    _host("bench/test_loadgen.py"),
    _host("bench/test_pps.py"),
    _host("bench/test_rules.py"),
    _host("agent/test_crash.py"),
    _host("agent/test_explain.py"),
    _host("agent/test_kubernetes_e2e.py"),
    _host("agent/test_metrics.py"),
    _host("agent/test_migrate.py"),
    _host("nodeport/test_node_addresses.py"),
    _host("agent/test_observe.py"),
    _host("agent/test_one_agent.py"),
    _host("agent/test_pin_layout.py"),
    _host("agent/test_prometheus.py"),
    _host("semantics/test_topology.py"),
    _host("agent/test_zero_loss.py"),
    Placement("agent/test_package.py", frozenset(), HOST_ONLY),
    # The upstream e2e ports (issue 24, docs/e2e.md): Service semantics through the API on
    # the socket-LB and NodePort programs the files above check on every line.
    _host("e2e/test_service_conformance.py"),
    # A pod served by socket-LB gets EPERM for a Service without endpoints where the kernel
    # lacks bpf_set_retval (5.18), and the per-packet cluster runs --socket-lb=all with its
    # pods outside the agents' cgroups where it lacks SO_NETNS_COOKIE (5.14): 5.10 has
    # neither, 6.1 both, as the host.
    _e2e("e2e/test_service.py", {"5.10": "test_rejected_when_no_endpoints_exist"}),
    _host("e2e/test_service_unready.py"),
    _host("e2e/test_service_external.py"),
    _host("e2e/test_networking.py"),
    _host("e2e/test_kube_proxy.py"),
    _host("e2e/test_conntrack.py"),
    _host("e2e/test_service_more.py"),
    # nf_conntrack loads on demand in a fresh guest, after the agents started: they set its
    # CLOSE_WAIT timeout at their next full resync (on the host it was loaded before).
    _e2e("e2e/test_close_wait.py", {"5.10": None, "6.1": None}),
    _host("e2e/test_conntrack_invalid.py"),
    _host("e2e/test_service_apiserver.py"),
    _host("e2e/test_hostnetwork_endpoints.py"),
)


def files_on(line: str, placements: Sequence[Placement] = PLACEMENTS) -> tuple[str, ...]:
    """The test files CI gives `line`'s guest."""
    return tuple(p.path for p in placements if line in p.kernel_lines)


def keyword_on(line: str, placements: Sequence[Placement] = PLACEMENTS) -> str | None:
    """The pytest -k expression that leaves out what `line`'s guest does not run."""
    terms = [
        f"not ({p.module} and {fragment})"
        for p in placements
        if line in p.kernel_lines
        for left_line, fragment in p.left_out
        if left_line == line
    ] + [
        f"(not {p.module} or {fragment})"
        for p in placements
        if line in p.kernel_lines
        for only_line, fragment in p.only
        if only_line == line
    ]
    return " and ".join(terms) or None


def selection_on(line: str, placements: Sequence[Placement] = PLACEMENTS) -> tuple[str, ...]:
    """The pytest arguments CI gives `line`'s guest: its files and its -k expression."""
    keyword = keyword_on(line, placements)
    return files_on(line, placements) + (("-k", keyword) if keyword else ())


def unplaced(test_files: Iterable[str], placements: Sequence[Placement] = PLACEMENTS) -> list[str]:
    """Kernel test files (names) no placement covers."""
    placed = {p.file for p in placements}
    return sorted(f for f in test_files if f not in placed)
