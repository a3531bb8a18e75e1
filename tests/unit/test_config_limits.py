"""Config validation: limits that contradict each other are refused at start, with the
fix in the message; limits that only some service could exceed are not."""

from __future__ import annotations

import pytest

from ebpflb.config import Config
from ebpflb.errors import ConfigError


def test_a_largest_table_the_pool_cannot_hold_is_refused_with_both_fixes() -> None:
    with pytest.raises(ConfigError) as caught:
        Config(maglev_max_table_size=1021, slot_pool_size=1000)
    message = str(caught.value)
    assert "maglev-max-table-size 1021 does not fit in slot-pool-size 1000" in message
    assert "raise --slot-pool-size to 1022 or more" in message
    assert "lower --maglev-max-table-size to 509" in message
    Config(maglev_max_table_size=509, slot_pool_size=1000)  # the suggested fix works
    Config(maglev_max_table_size=1021, slot_pool_size=1022)  # ... and so does the other


def test_a_pool_below_the_smallest_table_is_refused() -> None:
    with pytest.raises(ConfigError, match="raise --slot-pool-size to 102 or more"):
        Config(maglev_max_table_size=101, slot_pool_size=100)


@pytest.mark.parametrize("field", ["max_backends", "max_services", "slot_pool_size"])
def test_empty_maps_are_refused(field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace("_", "-")):
        Config(**{field: 0})  # type: ignore[arg-type]


def test_a_seed_longer_than_the_hash_key_is_refused() -> None:
    with pytest.raises(ConfigError, match="at most 64"):
        Config(hash_seed="x" * 65)
    Config(hash_seed="x" * 64)


def test_limits_that_only_one_service_could_exceed_are_accepted() -> None:
    """Each fails (or warns about) only a service that exceeds it, at run time."""
    Config(maglev_max_table_size=101, max_backends=65536)  # 120 backends: that frontend fails
    Config(max_backends=8)  # a 10-backend service fails alone
    Config(max_services=65536, slot_pool_size=1024, maglev_max_table_size=509)


def test_retry_period_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="retry-period"):
        Config(retry_period=0)
