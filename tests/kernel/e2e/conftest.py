"""The upstream e2e ports' fixtures: one cluster and pair of agents for the package, and a
per-test view that deletes the test's Services when it ends. Every test names the upstream
test it ports with `@pytest.mark.upstream("<upstream name>")`: docs/e2e.md's table is
generated from the run by those names (lab/e2e).

A test marked `@pytest.mark.pod_clients` (its clients are pods) runs on both datapaths:
parametrized with `path` = "socket-lb" (the package's cluster) and "per-packet" (a second
cluster, built only when such a test first needs it, with --pod-interfaces and
--socket-lb=hostns-only: its socket hooks skip the pod clients). The path is in the test's
id, so the JUnit report
and the table tell the two results apart."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kernel.e2e.harness import E2E, PATHS, PER_PACKET, SOCKET_LB, Shared, shared_cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each case's upstream name in the JUnit report (property `upstream`), set before it
    runs: a case whose set-up fails still names its row (lab/e2e/table.py reads it)."""
    for item in items:
        marker = item.get_closest_marker("upstream")
        if marker is not None and "/e2e/" in str(item.fspath):
            item.user_properties.append(("upstream", marker.args[0]))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("pod_clients") is not None:
        metafunc.parametrize("path", PATHS, indirect=True)


@pytest.fixture
def path(request: pytest.FixtureRequest) -> str:
    """The datapath serving this test's pod clients (socket-LB unless parametrized)."""
    return str(getattr(request, "param", SOCKET_LB))


@pytest.fixture(scope="package")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    with shared_cluster(tmp_path_factory.mktemp("e2e")) as cluster:
        yield cluster


@pytest.fixture(scope="package")
def shared_per_packet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    with shared_cluster(tmp_path_factory.mktemp("e2e-pp"), path=PER_PACKET) as cluster:
        yield cluster


@pytest.fixture
def e2e(path: str, request: pytest.FixtureRequest) -> Iterator[E2E]:
    marker = request.node.get_closest_marker("upstream")
    assert marker is not None, "an e2e port names its upstream test (@pytest.mark.upstream)"
    # Looked up by name: the per-packet cluster is built only if a test runs on it.
    fixture = "shared_per_packet" if path == PER_PACKET else "shared"
    view = E2E(request.getfixturevalue(fixture))
    try:
        yield view
    finally:
        view.close()
