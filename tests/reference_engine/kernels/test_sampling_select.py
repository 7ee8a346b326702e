"""The fused top-k selection sampler (`kernels/sampling_select.py`) draws what the torch selection path draws, on
tie-heavy rows, under the interpreter and on CUDA; ties broken toward the high id (the vocabulary flipped) are caught."""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import assert_script_ok, interpreter_run

INTERPRETED = """
from sampling_select_cases import draws
equal, total = draws("cpu", 1500, 8, 256, 2)
assert equal == total == 16, (equal, total)
equal, total = draws("cpu", 1500, 8, 256, 2, flip=True)
assert equal < total, "ties toward the high id were not caught"
print("ok")
"""


def test_matches_the_torch_selection_path_under_the_interpreter():
    assert_script_ok(interpreter_run({}, INTERPRETED, timeout=600))


@pytest.mark.cuda
def test_matches_the_torch_selection_path_on_cuda():
    from sampling_select_cases import draws

    from reference_engine.kernels import sampling_select

    equal, total = draws("cuda", 248320, 8, 4096, 20)
    assert equal == total == 160
    equal, total = draws("cuda", 248320, 8, 4096, 5, flip=True)
    assert equal < total
    with pytest.raises(ValueError, match="candidates"):
        logits = torch.randn(2, 1000, device="cuda")
        out = torch.empty(2, dtype=torch.int64, device="cuda")
        sampling_select.select_and_draw(logits, torch.ones(2, device="cuda"), torch.full((2,), 500, device="cuda"), torch.ones(2, device="cuda"),
                                        torch.rand(2, device="cuda", dtype=torch.float64), out, 500)  # fmt: skip
