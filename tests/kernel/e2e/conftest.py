"""The upstream e2e ports' fixtures: one cluster and pair of agents for the package, and a
per-test view that deletes the test's Services when it ends. Every test names the upstream
test it ports with `@pytest.mark.upstream("<upstream name>")`: docs/e2e.md's table is
generated from the run by those names (lab/e2e)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.kernel.e2e.harness import E2E, Shared, shared_cluster


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "upstream(name): the upstream [sig-network] e2e test this test ports"
    )


@pytest.fixture(scope="package")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    with shared_cluster(tmp_path_factory.mktemp("e2e")) as cluster:
        yield cluster


@pytest.fixture
def e2e(
    shared: Shared,
    request: pytest.FixtureRequest,
    record_property: Callable[[str, object], None],
) -> Iterator[E2E]:
    marker = request.node.get_closest_marker("upstream")
    assert marker is not None, "an e2e port names its upstream test (@pytest.mark.upstream)"
    # In the JUnit report too: a reader of the report alone sees which row a case is.
    record_property("upstream", marker.args[0])
    view = E2E(shared)
    try:
        yield view
    finally:
        view.close()
