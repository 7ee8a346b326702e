"""NVFP4 quantize / dequantize in the ModelOpt multiplier convention, and conversions to the
compressed-tensors divisor convention.

Layout: `weight [N, K]` -> `weight_packed [N, K/2]` uint8 (element 2j in the low nibble),
`weight_scale [N, K/16]` float8_e4m3fn, `weight_scale_2` float32 scalar; dequant
`W = e2m1 * weight_scale * weight_scale_2`.

Arithmetic (all in float32, in this order, so that results are bit-exact):
    amax           = max |w|                                  (w cast to float32)
    weight_scale_2 = amax / 2688                              (2688 = 6 * 448)
    s              = block_amax / (6 * weight_scale_2)        (6 * weight_scale_2 rounded first)
    s              = 1 where s == 0; clamp(s, 2^-9, 448)      (tiny-scale rule of ModelOpt)
    weight_scale   = float8_e4m3fn(s)                         (round to nearest even)
    element        = e2m1(w / (float(weight_scale) * weight_scale_2))   (product rounded first)

The tiny-scale rule follows NVIDIA ModelOpt's `NVFP4QTensor.get_weights_scaling_factor`
(modelopt/torch/quantization/qtensor/nvfp4_tensor.py): a zero block scale becomes 1, and scales
below 2^-9 (the smallest E4M3 subnormal) are raised to 2^-9 so no non-zero block loses its
scale. The upper clamp at 448 only matters for float32 rounding of the block holding the amax
(and for activations above their calibrated amax in W4A4).
"""

from __future__ import annotations

import torch

from reference_engine.ops.registry import satisfies
from reference_engine.quant.e2m1 import decode_e2m1, encode_e2m1, pack_e2m1, unpack_e2m1

BLOCK_SIZE = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
MIN_BLOCK_SCALE = 2.0**-9
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def tensor_scale_from_amax(amax: torch.Tensor | float) -> torch.Tensor:
    """Per-tensor scale in the multiplier convention: `amax / (6 * 448)`, a float32 scalar."""
    amax = torch.as_tensor(amax, dtype=torch.float32)
    return amax / (E2M1_MAX * E4M3_MAX)


def _check_weight(weight: torch.Tensor, name: str = "weight") -> None:
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be a floating tensor (float32, bfloat16, float16), got {weight.dtype}")
    if weight.ndim < 1 or weight.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last axis, got shape {tuple(weight.shape)}")
    if weight.shape[-1] % BLOCK_SIZE != 0:
        raise ValueError(f"{name}: the last axis ({weight.shape[-1]}) must be a multiple of the NVFP4 block size {BLOCK_SIZE}")


def quantize_with_tensor_scale(values: torch.Tensor, scale_2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize `values [..., K]` with a given per-tensor multiplier `scale_2` -> (packed [..., K/2], block scales [..., K/16])."""
    work = values.float().reshape(*values.shape[:-1], values.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)  # [..., K/16, 16]
    scale_2 = torch.as_tensor(scale_2, dtype=torch.float32, device=values.device)
    block_amax = work.abs().amax(dim=-1)  # [..., K/16]
    block_scale = block_amax / (E2M1_MAX * scale_2)
    block_scale = torch.where(block_scale == 0, torch.ones_like(block_scale), block_scale)
    block_scale = block_scale.clamp(min=MIN_BLOCK_SCALE, max=E4M3_MAX).to(torch.float8_e4m3fn)
    divisor = block_scale.float() * scale_2  # [..., K/16]
    codes = encode_e2m1(work / divisor.unsqueeze(-1)).reshape(values.shape)  # [..., K]
    return pack_e2m1(codes), block_scale


def quantize_nvfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`weight [N, K]` (any leading dims) -> (weight_packed uint8 [N, K/2], weight_scale fp8 [N, K/16], weight_scale_2 float32 [])."""
    _check_weight(weight)
    if not bool(torch.isfinite(weight).all()):
        raise ValueError("weight holds NaN or Inf; NVFP4 has no code for them")
    amax = weight.float().abs().amax()
    if float(amax) == 0.0:
        raise ValueError("weight is all zeros: its per-tensor scale amax / 2688 would be 0 (keep such a tensor unquantized)")
    scale_2 = tensor_scale_from_amax(amax)
    if float(scale_2) == 0.0:
        raise ValueError(f"weight amax {float(amax):.3e} is so small that amax / 2688 underflows float32")
    packed, block_scale = quantize_with_tensor_scale(weight, scale_2)
    return packed, block_scale, scale_2


def _check_quantized(weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor) -> None:
    if weight_packed.dtype != torch.uint8:
        raise ValueError(f"weight_packed must be uint8, got {weight_packed.dtype}")
    if weight_scale.dtype != torch.float8_e4m3fn:
        raise ValueError(f"weight_scale must be float8_e4m3fn, got {weight_scale.dtype}")
    if weight_packed.ndim < 1 or weight_scale.shape[:-1] != weight_packed.shape[:-1]:
        raise ValueError(f"weight_scale {tuple(weight_scale.shape)} does not match weight_packed {tuple(weight_packed.shape)} in its leading dims")
    if weight_scale.shape[-1] * BLOCK_SIZE != weight_packed.shape[-1] * 2:
        raise ValueError(
            f"weight_scale has {weight_scale.shape[-1]} blocks per row but weight_packed holds "
            f"{weight_packed.shape[-1] * 2} elements per row (expected {weight_packed.shape[-1] * 2 // BLOCK_SIZE} blocks)"
        )
    if torch.as_tensor(weight_scale_2).numel() != 1:
        raise ValueError(f"weight_scale_2 must be one value, got shape {tuple(torch.as_tensor(weight_scale_2).shape)}")


def dequantize_nvfp4(
    weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Packed NVFP4 -> `W = e2m1 * weight_scale * weight_scale_2` [N, K] in `dtype` (products in float32)."""
    _check_quantized(weight_packed, weight_scale, weight_scale_2)
    values = decode_e2m1(unpack_e2m1(weight_packed))  # [N, K] float32
    values = values.reshape(*values.shape[:-1], weight_scale.shape[-1], BLOCK_SIZE)  # [N, K/16, 16]
    scale_2 = torch.as_tensor(weight_scale_2, dtype=torch.float32, device=weight_packed.device).reshape(())
    block = weight_scale.float() * scale_2  # [N, K/16]
    return (values * block.unsqueeze(-1)).reshape(*weight_packed.shape[:-1], -1).to(dtype)


# Conventions: ModelOpt multiplies, compressed-tensors divides by the reciprocal.
def global_scale_from_scale_2(scale_2: torch.Tensor) -> torch.Tensor:
    """ModelOpt `weight_scale_2` / `input_scale` -> compressed-tensors `*_global_scale` (float32 [1])."""
    return (1.0 / torch.as_tensor(scale_2, dtype=torch.float32)).reshape(1)


def scale_2_from_global_scale(global_scale: torch.Tensor) -> torch.Tensor:
    """compressed-tensors `weight_global_scale` / `input_global_scale` -> ModelOpt multiplier (float32 scalar)."""
    return (1.0 / torch.as_tensor(global_scale, dtype=torch.float32)).reshape(())


@satisfies("quantization/nvfp4-quantize", major=1)
def quantize_nvfp4_into(weight: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor) -> None:
    """Destination-passing form of `quantize_nvfp4` (outputs preallocated by the caller)."""
    packed, scale, scale_2 = quantize_nvfp4(weight)
    for name, out, value in (("weight_packed", weight_packed, packed), ("weight_scale", weight_scale, scale), ("weight_scale_2", weight_scale_2, scale_2)):
        if out.shape != value.shape or out.dtype != value.dtype:
            raise ValueError(f"{name} must be {value.dtype} {tuple(value.shape)}, got {out.dtype} {tuple(out.shape)}")
        out.copy_(value)


@satisfies("quantization/nvfp4-dequantize", major=1)
def dequantize_nvfp4_into(weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor, out: torch.Tensor) -> None:
    """Destination-passing form of `dequantize_nvfp4`: writes into `out [N, K]` in its dtype."""
    expected = (*weight_packed.shape[:-1], weight_packed.shape[-1] * 2)
    if tuple(out.shape) != expected:
        raise ValueError(f"out must have shape {expected}, got {tuple(out.shape)}")
    out.copy_(dequantize_nvfp4(weight_packed, weight_scale, weight_scale_2, out.dtype))
