"""`ops.host_values.host_list`: inside `one_forward()` one device read per tensor, fresh lists; outside, plain reads."""

from __future__ import annotations

import torch

from reference_engine.ops import host_values


def test_inside_a_forward_each_tensor_is_read_once():
    offsets = torch.tensor([0, 3, 7, 7, 12], dtype=torch.int32)
    with host_values.one_forward():
        assert host_values.host_list(offsets) == [0, 3, 7, 7, 12]
        offsets[1] = 4  # batch metadata never changes within a forward; if it did, the first read is served
        assert host_values.host_list(offsets) == [0, 3, 7, 7, 12]
        other = torch.tensor([1, 2])
        assert host_values.host_list(other) == [1, 2]
    assert host_values.host_list(offsets) == [0, 4, 7, 7, 12]  # outside: a plain read
    with host_values.one_forward():  # a new forward reads again
        assert host_values.host_list(offsets) == [0, 4, 7, 7, 12]


def test_callers_get_their_own_list_and_tables_stay_nested():
    lengths = torch.tensor([4, 1, 9])
    with host_values.one_forward():
        first = host_values.host_list(lengths)
        first.append(99)
        first[0] = -1
        assert host_values.host_list(lengths) == [4, 1, 9]
        tables = torch.arange(6, dtype=torch.int32).view(2, 3)
        assert host_values.host_list(tables) == [[0, 1, 2], [3, 4, 5]]


def test_inference_tensors_work_and_scopes_nest():
    with torch.inference_mode():
        offsets = torch.tensor([0, 2, 5], dtype=torch.int32)
        with host_values.one_forward():
            assert host_values.host_list(offsets) == [0, 2, 5]
            with host_values.one_forward():
                assert host_values.host_list(offsets) == [0, 2, 5]
            assert host_values.host_list(offsets) == [0, 2, 5]
