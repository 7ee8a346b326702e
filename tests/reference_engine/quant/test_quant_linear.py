"""W4A16 and W4A4 linears: equal to the dequantised products, sliced over N, checked inputs."""

from __future__ import annotations

import pytest
import torch

from reference_engine.quant import linear
from reference_engine.quant.linear import quantize_dequantize_activations, w4a4_linear, w4a16_linear
from reference_engine.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4


def _weight(rows: int, columns: int, seed: int):
    return quantize_nvfp4(torch.randn(rows, columns, generator=torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w4a16_equals_matmul_with_dequantised_weight(dtype: torch.dtype) -> None:
    packed, scale, scale_2 = _weight(96, 128, 0)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(1)).to(dtype)
    out = torch.full((5, 96), float("nan"), dtype=dtype)
    w4a16_linear(x, packed, scale, scale_2, out)
    expected = x.double() @ dequantize_nvfp4(packed, scale, scale_2, torch.float64).t()
    relative = float((out.double() - expected).norm() / expected.norm())
    assert relative < (1e-6 if dtype == torch.float32 else 4e-3)


def test_slices_over_output_rows_cover_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    packed, scale, scale_2 = _weight(100, 64, 2)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3))
    whole = w4a16_linear(x, packed, scale, scale_2, torch.empty(3, 100))
    monkeypatch.setattr(linear, "_ROWS_PER_SLICE", 16)
    sliced = w4a16_linear(x, packed, scale, scale_2, torch.full((3, 100), float("nan")))
    assert torch.equal(whole, sliced)


def test_w4a4_quantises_activations_with_the_input_scale() -> None:
    packed, scale, scale_2 = _weight(48, 64, 4)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    input_scale = x.abs().max() / 2688
    out = w4a4_linear(x, packed, scale, scale_2, input_scale, torch.full((4, 48), float("nan")))
    x_packed, x_scale, x_scale_2 = quantize_nvfp4(x)  # same per-tensor scale as input_scale here
    assert float(x_scale_2) == float(input_scale)
    x_seen = dequantize_nvfp4(x_packed, x_scale, x_scale_2, torch.float32)
    assert torch.equal(quantize_dequantize_activations(x, input_scale), x_seen)
    expected = x_seen.double() @ dequantize_nvfp4(packed, scale, scale_2, torch.float64).t()
    assert float((out.double() - expected).norm() / expected.norm()) < 1e-6
    # and it differs from W4A16 by the activation quantisation error
    w4a16 = w4a16_linear(x, packed, scale, scale_2, torch.empty(4, 48))
    assert float((out - w4a16).norm() / w4a16.norm()) > 1e-2


def test_w4a4_clamps_activations_above_the_calibrated_range() -> None:
    x = torch.tensor([[100.0] + [1.0] * 15])
    seen = quantize_dequantize_activations(x, torch.tensor(1.0 / 2688))  # calibrated amax 1
    assert float(seen[0, 0]) == 6 * 448 / 2688  # block scale clamped to 448, element to 6
    assert not bool(torch.isnan(seen).any())


def test_inputs_are_checked() -> None:
    packed, scale, scale_2 = _weight(16, 64, 6)
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="features"):
        w4a16_linear(x[:, :48], packed, scale, scale_2, torch.empty(2, 16))
    with pytest.raises(ValueError, match="shape"):
        w4a16_linear(x, packed, scale, scale_2, torch.empty(2, 15))
    with pytest.raises(ValueError, match="dtype"):
        w4a16_linear(x, packed, scale, scale_2, torch.empty(2, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="positive"):
        w4a4_linear(x, packed, scale, scale_2, torch.tensor(0.0), torch.empty(2, 16))
