"""Shared fixtures. Kernel tests (marked `kernel`) need root; without it they skip, except
under .ci/run (EBPFLB_REQUIRE_KERNEL=1), where a skip would hide a broken install and they
fail instead."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/kernel/" in str(item.fspath):
            item.add_marker(pytest.mark.kernel)


@pytest.fixture(autouse=True)
def _kernel_access(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("kernel") is None or os.geteuid() == 0:
        return
    message = "kernel tests load BPF programs and need root"
    if os.environ.get("EBPFLB_REQUIRE_KERNEL") == "1":
        pytest.fail(message + " (EBPFLB_REQUIRE_KERNEL=1 forbids skipping)")
    pytest.skip(message)
