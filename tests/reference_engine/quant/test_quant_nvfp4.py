"""NVFP4 quantize / dequantize: bit-identical to an independent implementation, round trips, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from independent_nvfp4 import quantize as independent_quantize
from independent_nvfp4 import random_weight_with_ties

from reference_engine.quant.nvfp4 import (
    dequantize_nvfp4,
    dequantize_nvfp4_into,
    global_scale_from_scale_2,
    quantize_nvfp4,
    quantize_nvfp4_into,
    scale_2_from_global_scale,
)


def _assert_matches_independent(weight: torch.Tensor) -> None:
    packed, scale, scale_2 = quantize_nvfp4(weight)
    expected_packed, expected_scale, expected_scale_2 = independent_quantize(weight.float().numpy())
    assert float(scale_2) == float(expected_scale_2)
    np.testing.assert_array_equal(scale.float().numpy(), expected_scale)
    mismatched = int((packed.numpy() != expected_packed).sum())
    assert mismatched == 0, f"{mismatched} packed bytes differ"


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bit_identical_on_planted_ties(seed: int, dtype: torch.dtype) -> None:
    weight = torch.from_numpy(random_weight_with_ties(24, 128, seed)).to(dtype)
    _assert_matches_independent(weight)
    # the planted ties really are ties: some scaled elements sit exactly on every midpoint
    packed, scale, scale_2 = quantize_nvfp4(weight)
    scaled = weight.float().view(24, 8, 16) / (scale.float() * scale_2).unsqueeze(-1)
    for midpoint in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
        assert bool((scaled.abs() == midpoint).any()), midpoint


@pytest.mark.parametrize("seed", range(4))
def test_bit_identical_on_random_data_with_rounded_tensor_scale(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(32, 256, generator=generator) * 10.0 ** (torch.rand(32, 1, generator=generator) * 6 - 3)
    weight[torch.rand(32, 256, generator=generator) < 0.02] = 0.0
    _assert_matches_independent(weight)
    _assert_matches_independent(weight.to(torch.bfloat16))


def test_tiny_scale_rule() -> None:
    weight = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    weight[1, 16:32] *= 1e-9  # block scale far below 2^-9 -> clamped to 2^-9
    weight[2, 32:48] = 0.0  # all-zero block -> scale 1
    _, scale, _ = quantize_nvfp4(weight)
    assert float(scale[1, 1]) == 2.0**-9
    assert float(scale[2, 2]) == 1.0
    assert float(scale.float().max()) == 448.0


def test_round_trip_error_is_bounded_by_half_a_step() -> None:
    weight = torch.randn(64, 512, generator=torch.Generator().manual_seed(6))
    packed, scale, scale_2 = quantize_nvfp4(weight)
    restored = dequantize_nvfp4(packed, scale, scale_2, torch.float32)
    step = (scale.float() * scale_2).repeat_interleave(16, dim=1)  # per element: largest E2M1 gap is 2 steps
    assert bool(((restored - weight).abs() <= step + 1e-12).all())
    assert float((restored - weight).norm() / weight.norm()) < 0.12


def test_destination_passing_forms_write_every_output() -> None:
    weight = torch.randn(8, 64, generator=torch.Generator().manual_seed(7))
    packed = torch.full((8, 32), 0xA5, dtype=torch.uint8)
    scale = torch.full((8, 4), float("nan")).to(torch.float8_e4m3fn)
    scale_2 = torch.full((), float("nan"))
    quantize_nvfp4_into(weight, packed, scale, scale_2)
    expected = quantize_nvfp4(weight)
    assert torch.equal(packed, expected[0]) and torch.equal(scale.view(torch.uint8), expected[1].view(torch.uint8))
    out = torch.full((8, 64), float("nan"), dtype=torch.bfloat16)
    dequantize_nvfp4_into(packed, scale, scale_2, out)
    assert torch.equal(out, dequantize_nvfp4(*expected, torch.bfloat16))


def test_convention_conversions() -> None:
    scale_2 = torch.tensor(3.0e-4)
    global_scale = global_scale_from_scale_2(scale_2)
    assert global_scale.shape == (1,) and global_scale.dtype == torch.float32
    assert float(global_scale) == pytest.approx(1 / 3.0e-4, rel=1e-7)
    assert float(scale_2_from_global_scale(global_scale)) == pytest.approx(3.0e-4, rel=1e-7)


@pytest.mark.parametrize(
    "weight,match",
    [
        (torch.randn(4, 40), "multiple of the NVFP4 block size"),
        (torch.zeros(4, 32), "all zeros"),
        (torch.tensor([[float("nan")] * 16]), "NaN"),
        (torch.ones(4, 32, dtype=torch.int32), "floating"),
    ],
)
def test_bad_weights_raise(weight: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        quantize_nvfp4(weight)


def test_dequantize_checks_layout() -> None:
    packed, scale, scale_2 = quantize_nvfp4(torch.randn(4, 64))
    with pytest.raises(ValueError, match="blocks per row"):
        dequantize_nvfp4(packed, scale[:, :3], scale_2)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        dequantize_nvfp4(packed, scale.float(), scale_2)
