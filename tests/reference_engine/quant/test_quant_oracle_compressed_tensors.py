"""Our NVFP4 quantizer against compressed-tensors (an independent published implementation).

compressed-tensors computes global_scale = 2688 / amax and block scales global_scale * amax_b / 6,
maps zero scales to the E4M3 epsilon (0.125) and has no 2^-9 clamp. So the comparison is
bit-exact (1) for the E2M1 element rounding and packing on any values, and (2) for the whole
pipeline where the conventions agree: a power-of-two tensor scale (so both orders of float32
arithmetic give the same numbers) and blocks whose scale is neither zero nor below 2^-9.
"""

from __future__ import annotations

import pytest
import torch

from reference_engine.quant.e2m1 import encode_e2m1, pack_e2m1
from reference_engine.quant.nvfp4 import quantize_nvfp4

ct = pytest.importorskip("compressed_tensors", reason="compressed-tensors is not installed (pip install compressed-tensors)")
from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8  # noqa: E402
from compressed_tensors.quantization import preset_name_to_scheme  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import quantize  # noqa: E402
from compressed_tensors.quantization.utils.fp4_utils import cast_to_fp4  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam  # noqa: E402


def test_element_rounding_and_packing_bit_identical() -> None:
    generator = torch.Generator().manual_seed(11)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 6.0, 7.5])
    values = torch.cat([torch.randn(4000, generator=generator) * 3, ties, -ties, torch.tensor([1e-3, -1e-3, 100.0, -100.0])])
    values = values[: values.numel() // 2 * 2].reshape(1, -1)
    ours = pack_e2m1(encode_e2m1(values))
    theirs = pack_fp4_to_uint8(cast_to_fp4(values.clone()))
    assert torch.equal(ours, theirs), f"{int((ours != theirs).sum())} bytes differ"


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_full_pipeline_bit_identical_where_conventions_agree(seed: int, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(seed)
    rows, columns = 32, 256
    weight = torch.randn(rows, columns, generator=generator).clamp(-2.5, 2.5)
    weight *= 10.0 ** (-3 * torch.rand(rows, 1, generator=generator)) * 2.0 ** (seed - 1)
    weight[0, 0] = 2.625 * 2.0 ** (seed - 1)  # amax: a power-of-two tensor scale
    weight = weight.to(dtype)
    packed, scale, scale_2 = quantize_nvfp4(weight)

    args = preset_name_to_scheme("NVFP4", ["Linear"]).weights
    global_scale = generate_gparam(weight.float().min(), weight.float().max())
    assert float(global_scale) * float(scale_2) == 1.0
    blocks = weight.view(rows, columns // 16, 16)
    their_scale, zero_point = calculate_qparams(blocks.amin(-1), blocks.amax(-1), args, global_scale=global_scale)
    their_values = quantize(weight, their_scale, zero_point, args, global_scale=global_scale)
    their_codes = pack_fp4_to_uint8(their_values.float())

    unclamped = blocks.float().abs().amax(-1) / (6 * scale_2)
    comparable = unclamped >= 2.0**-9  # our 2^-9 clamp (and the zero rule) do not act here
    assert bool(comparable.float().mean() > 0.5)
    assert torch.equal(scale.float()[comparable], their_scale.float()[comparable])
    comparable_bytes = comparable.repeat_interleave(8, dim=1)
    mismatched = int((packed != their_codes)[comparable_bytes].sum())
    assert mismatched == 0, f"{mismatched} packed bytes differ"
