"""Our NVFP4 quantizer and scale swizzle against torchao (torchao.prototype.mx_formats), an
independent published implementation.

torchao scales elements by multiplying with (1 / tensor_scale) / block_scale rather than
dividing, and clamps block scales at 2^-6 (the smallest normal E4M3) instead of 2^-9. The
comparison is bit-exact where the conventions agree: a power-of-two tensor scale, and blocks whose
E4M3 scale is a power of two (so the reciprocal is exact) and at least 2^-6.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from independent_nvfp4 import random_weight_with_ties

from reference_engine.quant.nvfp4 import quantize_nvfp4
from reference_engine.quant.swizzle import swizzle_scales

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    mx_formats = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor", reason="torchao is not installed (pip install torchao)")
    mx_utils = pytest.importorskip("torchao.prototype.mx_formats.utils")


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_bit_identical_where_conventions_agree(seed: int, dtype: torch.dtype) -> None:
    weight = torch.from_numpy(random_weight_with_ties(40, 256, seed)).to(dtype)
    packed, scale, scale_2 = quantize_nvfp4(weight)
    their_scale, their_packed = mx_formats.nvfp4_quantize(weight.contiguous(), 16, per_tensor_scale=scale_2.clone())
    scale_values = scale.float()
    mantissa, _ = torch.frexp(scale_values)
    nonzero = weight.float().view(40, 16, 16).abs().amax(-1) > 0  # our zero-block rule (scale 1) is ours alone
    comparable = (mantissa == 0.5) & (scale_values >= 2.0**-6) & nonzero  # power of two, not below torchao's clamp
    assert int(comparable.sum()) > 100
    assert torch.equal(their_scale.float()[comparable], scale_values[comparable])
    comparable_bytes = comparable.repeat_interleave(8, dim=1)
    mismatched = int((their_packed.view(torch.uint8) != packed)[comparable_bytes].sum())
    assert mismatched == 0, f"{mismatched} packed bytes differ"


@pytest.mark.parametrize("rows,columns", [(1, 1), (6, 6), (130, 9), (256, 128)])
def test_swizzle_matches_to_blocked(rows: int, columns: int) -> None:
    generator = torch.Generator().manual_seed(rows + columns)
    scale = torch.randint(1, 0x7F, (rows, columns), generator=generator, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    theirs = mx_utils.to_blocked(scale)
    assert torch.equal(swizzle_scales(scale).view(torch.uint8), theirs.reshape(-1).view(torch.uint8))
