"""Executable half of quantization/w4a4-linear (stdlib, torch, numpy only).

Reference: quantise the activations with the stated float32 arithmetic and an explicit
nearest-point search on the E4M3 and E2M1 grids (ties to the even mantissa), dequantise both
operands from their bits in float64, multiply in float64.
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK = 16
ROWS_PER_SLICE = 8192
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _e4m3_grid() -> tuple[np.ndarray, np.ndarray]:
    values, mantissas = [], []
    for exponent in range(16):
        for mantissa in range(8):
            if (exponent, mantissa) != (15, 7):
                values.append(mantissa / 8 * 2.0**-6 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7))
                mantissas.append(mantissa)
    return np.array(values), np.array(mantissas)


E4M3_GRID, E4M3_MANTISSA = _e4m3_grid()


def _nearest(values: np.ndarray, grid: np.ndarray, odd: np.ndarray) -> np.ndarray:
    """Index of the nearest grid point; of two equally near points the one with odd == 0."""
    distance = np.abs(values[:, None] - grid[None, :])
    candidates = distance == distance.min(axis=1, keepdims=True)
    return (candidates * (2 - odd[None, :])).argmax(axis=1)


def fake_quantize_activations(x: np.ndarray, input_scale: np.float32) -> np.ndarray:
    """x float32 [M, K] -> what the FP4 GEMM sees, float64: e2m1 * e4m3 block scale * input_scale."""
    rows = x.shape[0]
    blocks = x.reshape(rows, -1, BLOCK)
    block_amax = np.abs(blocks).max(axis=-1).astype(np.float32)
    scale = (block_amax / (np.float32(6.0) * input_scale)).astype(np.float32)
    scale = np.clip(np.where(scale == 0, np.float32(1.0), scale), np.float32(2.0**-9), np.float32(448.0))
    scale = E4M3_GRID[_nearest(scale.reshape(-1).astype(np.float64), E4M3_GRID, E4M3_MANTISSA % 2)].reshape(scale.shape)
    divisor = (scale.astype(np.float32) * input_scale).astype(np.float32)
    scaled = (blocks / divisor[..., None]).astype(np.float32).reshape(-1).astype(np.float64)
    magnitude = E2M1_GRID[_nearest(np.minimum(np.abs(scaled), 6.0), E2M1_GRID, np.arange(8) % 2)]
    values = np.where(scaled < 0, -magnitude, magnitude).reshape(blocks.shape)
    return (values * scale[..., None] * float(input_scale)).reshape(x.shape)


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


def weight_rows(packed: np.ndarray, scale_bytes: np.ndarray, scale_2: float) -> np.ndarray:
    rows = packed.shape[0]
    codes = np.empty((rows, packed.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    return (e2m1_value(codes).reshape(rows, -1, BLOCK) * e4m3_value(scale_bytes)[..., None] * scale_2).reshape(rows, -1)


def reference(x, weight_packed, weight_scale, weight_scale_2, input_scale) -> dict[str, torch.Tensor]:
    activations = fake_quantize_activations(x.float().cpu().numpy(), np.float32(float(input_scale)))
    packed = weight_packed.cpu().numpy()
    scale_bytes = weight_scale.cpu().view(torch.uint8).numpy()
    out = np.empty((x.shape[0], packed.shape[0]))
    for start in range(0, packed.shape[0], ROWS_PER_SLICE):
        stop = start + ROWS_PER_SLICE
        out[:, start:stop] = activations @ weight_rows(packed[start:stop], scale_bytes[start:stop], float(weight_scale_2)).T
    return {"out": torch.from_numpy(out)}


def make_inputs(axes: dict, params: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """input_scale = amax(x) * f / 2688 with f in [0.5, 1.5): f < 1 puts some blocks above the
    calibrated range (block scale clamped to 448, elements to +-6)."""
    rows, columns = axes["M"], axes["K"]
    x = (torch.randn(rows, columns, generator=generator) * torch.exp(torch.randn(rows, columns // BLOCK, 1, generator=generator)).expand(rows, columns // BLOCK, BLOCK).reshape(rows, columns)).to(dtype)
    factor = 0.5 + float(torch.rand((), generator=generator))
    input_scale = torch.tensor(float(x.float().abs().max()) * factor / 2688.0, dtype=torch.float32)
    packed = torch.randint(0, 256, (axes["N"], columns // 2), generator=generator, dtype=torch.int32).to(torch.uint8)
    scale = torch.randint(0x28, 0x60, (axes["N"], columns // BLOCK), generator=generator, dtype=torch.int32).to(torch.uint8)
    scale_2 = ((0.5 + 1.5 * torch.rand((), generator=generator)) * 2.0**-10).to(torch.float32)
    inputs = {"x": x, "weight_packed": packed, "weight_scale": scale.view(torch.float8_e4m3fn), "weight_scale_2": scale_2, "input_scale": input_scale}
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def wrong_in_features(inputs: dict, params: dict) -> tuple[dict, dict]:
    return {**inputs, "x": inputs["x"][:, :-16].contiguous()}, params


def non_positive_input_scale(inputs: dict, params: dict) -> tuple[dict, dict]:
    return {**inputs, "input_scale": torch.zeros_like(inputs["input_scale"])}, params
