"""The deploy tests load programs into the kernel like the kernel tests: the same
machine-wide session lock and the same check that nothing is left behind."""

from tests.kernel.conftest import _nothing_left_behind, _one_session_per_machine

__all__ = ["_nothing_left_behind", "_one_session_per_machine"]
