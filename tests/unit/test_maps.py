from __future__ import annotations

import numpy as np
import pytest

from ebpflb.datapath.maps import FakeSlotPool, slot_pairs


def u32(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.uint32)


def test_a_table_is_written_in_whole_pairs_with_padding() -> None:
    keys, values = slot_pairs(4, u32(7, 8, 9), None)
    assert keys.tolist() == [2, 3] and values.tolist() == [7, 8, 9, 0]


def test_a_delta_writes_the_pairs_holding_changed_slots() -> None:
    keys, values = slot_pairs(4, u32(1, 2, 3, 4, 5), np.array([3, 2, 4]))
    assert keys.tolist() == [3, 4] and values.tolist() == [3, 4, 5, 0]


def test_tables_start_on_pairs() -> None:
    with pytest.raises(ValueError, match="not even"):
        slot_pairs(3, u32(1), None)


def test_fake_pool_round_trip() -> None:
    pool = FakeSlotPool("p", 16)
    pool.write(2, u32(5, 6, 7))
    pool.write(8, u32(9, 9, 9))
    pool.write(2, u32(5, 1, 7), np.array([1]))
    assert pool.read(2, 3).tolist() == [5, 1, 7]
    assert pool.read(8, 3).tolist() == [9, 9, 9]
    assert pool.array.tolist()[:12] == [0, 0, 5, 1, 7, 0, 0, 0, 9, 9, 9, 0]
