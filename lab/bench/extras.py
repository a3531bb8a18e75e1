"""The bench's optional Python packages (pyproject's `bench` extra): the agent never needs
them, so they are imported only where a table or plot is drawn, with an error that names
the extra when they are missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from ebpflb.errors import ConfigError

EXTRA = "bench"
INSTALL = (
    "pip install 'ebpflb[bench]' (from a checkout: pip install -e '.[bench]'; make setup does)"
)


def require(module: str, purpose: str) -> ModuleType:
    """Import `module` (e.g. "rich.table") or raise ConfigError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = module.partition(".")[0]
        raise ConfigError(
            f"{purpose} needs the Python package {package!r}, part of ebpflb's {EXTRA!r}"
            f" extra: {INSTALL}"
        ) from exc
