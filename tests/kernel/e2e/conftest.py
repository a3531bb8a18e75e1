"""The upstream e2e ports' fixtures: one cluster and pair of agents for the package, and a
per-test view that deletes the test's Services when it ends. Every test names the upstream
test it ports with `@pytest.mark.upstream("<upstream name>")`: docs/e2e.md's table is
generated from the run by those names (lab/e2e)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kernel.e2e.harness import E2E, Shared, shared_cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each case's upstream name in the JUnit report (property `upstream`), set before it
    runs: a case whose set-up fails still names its row (lab/e2e/table.py reads it)."""
    for item in items:
        marker = item.get_closest_marker("upstream")
        if marker is not None and "/e2e/" in str(item.fspath):
            item.user_properties.append(("upstream", marker.args[0]))


@pytest.fixture(scope="package")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    with shared_cluster(tmp_path_factory.mktemp("e2e")) as cluster:
        yield cluster


@pytest.fixture
def e2e(
    shared: Shared,
    request: pytest.FixtureRequest,
) -> Iterator[E2E]:
    marker = request.node.get_closest_marker("upstream")
    assert marker is not None, "an e2e port names its upstream test (@pytest.mark.upstream)"
    view = E2E(shared)
    try:
        yield view
    finally:
        view.close()
