"""NVFP4 linears (plain torch; the CPU path and the fallback for the GPU kernels).

* `w4a16_linear`: weights NVFP4, activations in their own dtype (what Hopper runs: the weight is
  dequantised and multiplied in higher precision). `out = x @ W^T`, accumulated in float32, in
  x's dtype.
* `w4a4_linear`: activations are quantised to NVFP4 as well (per 16-element block along K, with
  the given per-tensor `input_scale` in the multiplier convention, same arithmetic and tiny-scale
  rule as the weights, block scales clamped to 448 and elements to +-6), then both operands are
  dequantised and multiplied with float32 accumulation: what an FP4 x FP4 tensor-core GEMM
  computes, up to accumulation order.

The weight is dequantised in slices of output rows so the LM head (248320 x 2048) never needs a
full float32 copy.
"""

from __future__ import annotations

import torch

from reference_engine.ops.registry import satisfies
from reference_engine.quant.e2m1 import decode_e2m1, unpack_e2m1
from reference_engine.quant.nvfp4 import (
    BLOCK_SIZE,
    _check_quantized,
    dequantize_nvfp4,
    quantize_with_tensor_scale,
)

_ROWS_PER_SLICE = 16384
_ACTIVATION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_linear(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor, out: torch.Tensor) -> None:
    if x.dtype not in _ACTIVATION_DTYPES:
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if weight_packed.ndim != 2:
        raise ValueError(f"weight_packed must be [N, K/2], got shape {tuple(weight_packed.shape)}")
    _check_quantized(weight_packed, weight_scale, weight_scale_2)
    in_features = weight_packed.shape[1] * 2
    if x.ndim < 1 or x.shape[-1] != in_features:
        raise ValueError(f"x has {x.shape[-1] if x.ndim else 0} features but the weight expects K = {in_features}")
    expected = (*x.shape[:-1], weight_packed.shape[0])
    if tuple(out.shape) != expected:
        raise ValueError(f"out must have shape {expected}, got {tuple(out.shape)}")
    if out.dtype != x.dtype:
        raise ValueError(f"out must have x's dtype {x.dtype}, got {out.dtype}")


def _matmul_dequantized(x_float: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor, out: torch.Tensor) -> None:
    rows = x_float.reshape(-1, x_float.shape[-1])  # [M, K] float32
    out_rows = out.reshape(-1, out.shape[-1])  # [M, N]
    for start in range(0, weight_packed.shape[0], _ROWS_PER_SLICE):
        stop = min(start + _ROWS_PER_SLICE, weight_packed.shape[0])
        weight = dequantize_nvfp4(weight_packed[start:stop], weight_scale[start:stop], weight_scale_2, torch.float32)  # [n, K]
        out_rows[:, start:stop] = (rows @ weight.t()).to(out.dtype)


@satisfies("quantization/w4a16-linear", major=1)
def w4a16_linear(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`out [M, N] = x [M, K] @ dequant(W)^T`, float32 accumulation, written in x's dtype; returns `out`."""
    _check_linear(x, weight_packed, weight_scale, weight_scale_2, out)
    _matmul_dequantized(x.float(), weight_packed, weight_scale, weight_scale_2, out)
    return out


def _check_row_scales(weight_packed: torch.Tensor, row_scale_2: torch.Tensor) -> None:
    if row_scale_2.dtype != torch.float32 or tuple(row_scale_2.shape) != (weight_packed.shape[0],):
        raise ValueError(
            f"row_scale_2 must be float32 [{weight_packed.shape[0]}] (one tensor scale per output row), "
            f"got {row_scale_2.dtype} {tuple(row_scale_2.shape)}"
        )


def w4a16_linear_rows(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, row_scale_2: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`w4a16_linear` of several NVFP4 linears stacked along N, each row with its own tensor scale.

    `row_scale_2 [N]` float32 holds, for every output row, the `weight_scale_2` of the linear it came
    from, so one call computes what the separate linears compute (same products, same rounding).
    """
    _check_linear(x, weight_packed, weight_scale, torch.ones((), dtype=torch.float32), out)
    _check_row_scales(weight_packed, row_scale_2)
    rows = x.float().reshape(-1, x.shape[-1])  # [M, K]
    out_rows = out.reshape(-1, out.shape[-1])  # [M, N]
    for start in range(0, weight_packed.shape[0], _ROWS_PER_SLICE):
        stop = min(start + _ROWS_PER_SLICE, weight_packed.shape[0])
        values = decode_e2m1(unpack_e2m1(weight_packed[start:stop]))  # [n, K]
        block = weight_scale[start:stop].float() * row_scale_2[start:stop, None]  # [n, K/16]
        weight = (values.reshape(stop - start, -1, BLOCK_SIZE) * block[..., None]).reshape(stop - start, -1)
        out_rows[:, start:stop] = (rows @ weight.t()).to(out.dtype)
    return out


def quantize_dequantize_activations(x: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """What the FP4 GEMM sees of the activations: NVFP4 round trip of `x [..., K]` with `input_scale`, float32."""
    packed, block_scale = quantize_with_tensor_scale(x, input_scale)
    return dequantize_nvfp4(packed, block_scale, input_scale, torch.float32)


@satisfies("quantization/w4a4-linear", major=1)
def w4a4_linear(
    x: torch.Tensor,
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """`out = nvfp4(x; input_scale) @ dequant(W)^T`, float32 accumulation, in x's dtype; returns `out`."""
    _check_linear(x, weight_packed, weight_scale, weight_scale_2, out)
    input_scale = torch.as_tensor(input_scale, dtype=torch.float32, device=x.device)
    if input_scale.numel() != 1:
        raise ValueError(f"input_scale must be one value, got shape {tuple(input_scale.shape)}")
    input_scale = input_scale.reshape(())
    if not bool(input_scale > 0) or not bool(torch.isfinite(input_scale)):
        raise ValueError(f"input_scale must be positive and finite, got {float(input_scale)}")
    if x.shape[-1] % BLOCK_SIZE != 0:
        raise ValueError(f"K ({x.shape[-1]}) must be a multiple of {BLOCK_SIZE}")
    _matmul_dequantized(quantize_dequantize_activations(x, input_scale), weight_packed, weight_scale, weight_scale_2, out)
    return out
