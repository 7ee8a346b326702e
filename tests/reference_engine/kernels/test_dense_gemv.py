"""Triton dense GEMV (`kernels/dense_gemv.py`, the OpSet's `dense_linear`) against torch: interpreter and CUDA."""

from __future__ import annotations

import pytest
import torch
from kernel_interpreter import assert_script_ok, interpreter_run

from reference_engine.ops.dense_linear import dense_linear

SCRIPT = """
import torch
from reference_engine.kernels import dense_gemv

g = torch.Generator().manual_seed(2)
# N = 5: a partial row block; K = 100: a masked K step; K = 2048 at bf16: the real in_proj_b/a shape; T = 5: the torch path.
for tokens, rows, cols, dtype, bound in ((1, 5, 100, torch.float32, 1e-6), (3, 64, 2048, torch.bfloat16, 8e-3), (4, 7, 3000, torch.float32, 1e-6), (5, 6, 64, torch.float32, 1e-6)):
    x = torch.randn(tokens, cols, generator=g).to(dtype)
    weight = (torch.randn(rows, cols, generator=g) * cols**-0.5).to(dtype)
    expected = (x.double() @ weight.double().t())
    out = torch.full((tokens, rows), float("nan"), dtype=dtype)
    dense_gemv.dense_linear(x, weight, out)
    assert torch.isfinite(out).all(), (tokens, rows, cols)
    error = float((out.double() - expected).norm() / expected.norm())
    assert error < bound, (tokens, rows, cols, dtype, error)
    wrong = torch.full((tokens, rows), float("nan"), dtype=dtype)  # known-wrong: the weight rows shifted by one
    dense_gemv.dense_linear(x, weight.roll(1, 0).contiguous(), wrong)
    assert float((wrong.double() - expected).norm() / expected.norm()) > 0.3, (tokens, rows, cols)
strided = torch.full((2, 10), float("nan"))  # out with a row stride of 10 for 5 columns: written in place
view = strided[:, :5]
x, weight = torch.randn(2, 64, generator=g), torch.randn(5, 64, generator=g)
dense_gemv.dense_linear(x, weight, view)
assert torch.allclose(view, x @ weight.t(), rtol=1e-5, atol=1e-4), (view, x @ weight.t())
assert torch.isnan(strided[:, 5:]).all()
print("ok")
"""


def test_matches_torch_under_the_interpreter():
    assert_script_ok(interpreter_run({}, SCRIPT))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda x, w, o: (x[:, :-1], w, o), "same K"),
        (lambda x, w, o: (x, w, o[:, :-1]), "out must be"),
        (lambda x, w, o: (x, w.double(), o), "share a dtype"),
    ],
)
def test_bad_arguments_raise_value_error(change, message):
    x, weight, out = torch.randn(2, 8), torch.randn(3, 8), torch.empty(2, 3)
    with pytest.raises(ValueError, match=message):
        dense_linear(*change(x, weight, out))


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 4])
def test_matches_torch_on_cuda_at_the_real_shape(tokens):
    from reference_engine.kernels.dense_gemv import dense_linear as triton_dense_linear

    generator = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, 2048, generator=generator, device="cuda").bfloat16()
    weight = (torch.randn(64, 2048, generator=generator, device="cuda") * 2048**-0.5).bfloat16()
    out = torch.full((tokens, 64), float("nan"), device="cuda", dtype=torch.bfloat16)
    triton_dense_linear(x, weight, out)
    expected = x.double() @ weight.double().t()
    assert float((out.double() - expected).norm() / expected.norm()) < 5e-3
