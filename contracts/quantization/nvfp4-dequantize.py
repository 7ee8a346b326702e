"""Executable half of quantization/nvfp4-dequantize (stdlib, torch, numpy only).

The reference decodes every field from its bits (E2M1: sign, 2-bit exponent with bias 1, 1-bit
mantissa; E4M3: 4-bit exponent with bias 7, 3-bit mantissa, subnormals at exponent 0) in float64,
without torch's float8 conversion.
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK = 16


def e2m1_value(codes: np.ndarray) -> np.ndarray:
    """uint8 codes 0..15 -> float64: exponent 0 is subnormal (0 or 0.5), else 2^(e-1) * (1 + m/2)."""
    sign = np.where(codes & 0x8, -1.0, 1.0)
    exponent = (codes >> 1) & 0x3
    mantissa = codes & 0x1
    magnitude = np.where(exponent == 0, mantissa * 0.5, 2.0 ** (exponent.astype(np.float64) - 1) * (1 + mantissa / 2))
    return sign * magnitude


def e4m3_value(raw: np.ndarray) -> np.ndarray:
    """uint8 bit patterns of float8_e4m3fn -> float64 (0x7F / 0xFF are NaN)."""
    sign = np.where(raw & 0x80, -1.0, 1.0)
    exponent = ((raw >> 3) & 0xF).astype(np.float64)
    mantissa = (raw & 0x7).astype(np.float64)
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return np.where((raw & 0x7F) == 0x7F, np.nan, sign * magnitude)


def reference_dequantize(weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor) -> np.ndarray:
    packed = weight_packed.cpu().numpy()
    rows = packed.shape[0]
    codes = np.empty((rows, packed.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    scale = e4m3_value(weight_scale.cpu().view(torch.uint8).numpy())  # [N, K/16]
    values = e2m1_value(codes).reshape(rows, -1, BLOCK) * scale[..., None] * float(weight_scale_2)
    return values.reshape(rows, -1)


def reference(weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"out": torch.from_numpy(reference_dequantize(weight_packed, weight_scale, weight_scale_2))}


def random_nvfp4(rows: int, columns: int, generator: torch.Generator, scale_bytes: tuple[int, int] = (1, 0x7F)) -> dict[str, torch.Tensor]:
    """Random packed codes (all 16, -0 included), positive E4M3 scales with bytes in [lo, hi), a tensor scale near 2^-10."""
    packed = torch.randint(0, 256, (rows, columns // 2), generator=generator, dtype=torch.int32).to(torch.uint8)
    scale = torch.randint(scale_bytes[0], scale_bytes[1], (rows, columns // BLOCK), generator=generator, dtype=torch.int32)
    scale_2 = (0.5 + 1.5 * torch.rand((), generator=generator)) * 2.0**-10
    return {
        "weight_packed": packed,
        "weight_scale": scale.to(torch.uint8).view(torch.float8_e4m3fn),
        "weight_scale_2": scale_2.to(torch.float32),
    }


def make_inputs(axes: dict, params: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    inputs = random_nvfp4(axes["N"], axes["K"], generator)  # every finite positive scale byte, subnormals included
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def scale_blocks_mismatch(inputs: dict, params: dict) -> tuple[dict, dict]:
    return {**inputs, "weight_scale": inputs["weight_scale"][:, :-1].contiguous()}, params


def scale_not_fp8(inputs: dict, params: dict) -> tuple[dict, dict]:
    return {**inputs, "weight_scale": inputs["weight_scale"].float()}, params


def packed_not_uint8(inputs: dict, params: dict) -> tuple[dict, dict]:
    return {**inputs, "weight_packed": inputs["weight_packed"].to(torch.int32)}, params
