"""Executable half of quantization/w4a16-linear (stdlib, torch, numpy only).

Reference: decode the weight from its bits in float64 (E2M1 and E4M3 by their fields), multiply
in float64, one slice of output rows at a time so the LM head fits in memory.
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK = 16
ROWS_PER_SLICE = 8192


def e2m1_value(codes: np.ndarray) -> np.ndarray:
    sign = np.where(codes & 0x8, -1.0, 1.0)
    exponent = ((codes >> 1) & 0x3).astype(np.float64)
    mantissa = (codes & 0x1).astype(np.float64)
    return sign * np.where(exponent == 0, mantissa * 0.5, 2.0 ** (exponent - 1) * (1 + mantissa / 2))


def e4m3_value(raw: np.ndarray) -> np.ndarray:
    sign = np.where(raw & 0x80, -1.0, 1.0)
    exponent = ((raw >> 3) & 0xF).astype(np.float64)
    mantissa = (raw & 0x7).astype(np.float64)
    return sign * np.where(exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))


def weight_rows(weight_packed: np.ndarray, scale_bytes: np.ndarray, scale_2: float) -> np.ndarray:
    """float64 W for a slice of rows: e2m1 * scale * scale_2, element 2j from the low nibble."""
    rows = weight_packed.shape[0]
    codes = np.empty((rows, weight_packed.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = weight_packed & 0x0F
    codes[:, 1::2] = weight_packed >> 4
    values = e2m1_value(codes).reshape(rows, -1, BLOCK) * e4m3_value(scale_bytes)[..., None] * scale_2
    return values.reshape(rows, -1)


def linear_float64(x: np.ndarray, weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor) -> np.ndarray:
    packed = weight_packed.cpu().numpy()
    scale_bytes = weight_scale.cpu().view(torch.uint8).numpy()
    out = np.empty((x.shape[0], packed.shape[0]))
    for start in range(0, packed.shape[0], ROWS_PER_SLICE):
        stop = start + ROWS_PER_SLICE
        out[:, start:stop] = x @ weight_rows(packed[start:stop], scale_bytes[start:stop], float(weight_scale_2)).T
    return out


def reference(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"out": torch.from_numpy(linear_float64(x.double().cpu().numpy(), weight_packed, weight_scale, weight_scale_2))}


def random_weight(rows: int, columns: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random codes (all 16), E4M3 scales between 0.125 and 24 (bytes 0x28..0x5F), a tensor scale near 2^-10."""
    packed = torch.randint(0, 256, (rows, columns // 2), generator=generator, dtype=torch.int32).to(torch.uint8)
    scale = torch.randint(0x28, 0x60, (rows, columns // BLOCK), generator=generator, dtype=torch.int32).to(torch.uint8)
    scale_2 = ((0.5 + 1.5 * torch.rand((), generator=generator)) * 2.0**-10).to(torch.float32)
    return {"weight_packed": packed, "weight_scale": scale.view(torch.float8_e4m3fn), "weight_scale_2": scale_2}


def make_inputs(axes: dict, params: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    x = torch.randn(axes["M"], axes["K"], generator=generator).to(dtype)
    inputs = {"x": x, **random_weight(axes["N"], axes["K"], generator)}
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def wrong_in_features(inputs: dict, params: dict) -> tuple[dict, dict]:
    return {**inputs, "x": inputs["x"][:, :-16].contiguous()}, params


def scale_not_fp8(inputs: dict, params: dict) -> tuple[dict, dict]:
    return {**inputs, "weight_scale": inputs["weight_scale"].float()}, params
