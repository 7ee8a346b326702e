"""Executable half of quantization/nvfp4-quantize (stdlib, torch, numpy only).

The reference does not use the formula-then-round shortcut an engine uses: it enumerates the
E4M3 and E2M1 grids and picks the nearest point by explicit search, with the tie rule written
out (the point whose mantissa bit is 0). Scale arithmetic is float32 in the order the contract
states, in numpy.
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK = 16
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # index = code of the magnitude


def _e4m3_grid() -> tuple[np.ndarray, np.ndarray]:
    """All finite non-negative E4M3 values and their mantissa bits (exponent bias 7, subnormals at exponent 0)."""
    values, mantissas = [], []
    for exponent in range(16):
        for mantissa in range(8):
            if exponent == 15 and mantissa == 7:
                continue  # NaN in e4m3fn
            if exponent == 0:
                values.append(mantissa / 8 * 2.0**-6)
            else:
                values.append((1 + mantissa / 8) * 2.0 ** (exponent - 7))
            mantissas.append(mantissa)
    return np.array(values), np.array(mantissas)


E4M3_GRID, E4M3_MANTISSA = _e4m3_grid()


CHUNK = 1 << 18  # elements per search step, to bound memory on real shapes


def _chunked(function, flat: np.ndarray) -> np.ndarray:
    return np.concatenate([function(flat[start : start + CHUNK]) for start in range(0, flat.size, CHUNK)]) if flat.size else flat


def nearest_e4m3(values: np.ndarray) -> np.ndarray:
    """Round non-negative values (<= 448) to E4M3 by nearest-point search; ties to the even mantissa."""
    return _chunked(_nearest_e4m3, values.reshape(-1).astype(np.float64)).reshape(values.shape)


def _nearest_e4m3(flat: np.ndarray) -> np.ndarray:
    distance = np.abs(flat[:, None] - E4M3_GRID[None, :])  # [n, 127]
    best = distance.min(axis=1, keepdims=True)
    candidates = distance == best
    # among the (at most two) nearest points prefer an even mantissa
    preference = candidates * (2 - (E4M3_MANTISSA[None, :] % 2))
    return E4M3_GRID[preference.argmax(axis=1)]


def nearest_e2m1_codes(values: np.ndarray) -> np.ndarray:
    """float32 values -> E2M1 codes: clamp |v| to 6, nearest grid point, ties to the even code, sign bit when v < 0."""
    return _chunked(_nearest_e2m1_codes, values.reshape(-1).astype(np.float64)).reshape(values.shape)


def _nearest_e2m1_codes(flat: np.ndarray) -> np.ndarray:
    magnitude = np.minimum(np.abs(flat), 6.0)
    distance = np.abs(magnitude[:, None] - E2M1_GRID[None, :])  # [n, 8]
    best = distance.min(axis=1, keepdims=True)
    candidates = distance == best
    preference = candidates * (2 - (np.arange(8)[None, :] % 2))
    codes = preference.argmax(axis=1) + 8 * (flat < 0)
    return codes.astype(np.uint8)


def reference_quantize(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """float32 [N, K] -> (codes uint8 [N, K], block scales as float64 values [N, K/16], scale_2 float32)."""
    rows, columns = weight.shape
    amax = np.float32(np.abs(weight).max())
    scale_2 = np.float32(amax / np.float32(2688.0))
    blocks = weight.reshape(rows, columns // BLOCK, BLOCK)
    block_amax = np.abs(blocks).max(axis=-1).astype(np.float32)
    scale = (block_amax / (np.float32(6.0) * scale_2)).astype(np.float32)
    scale = np.where(scale == 0, np.float32(1.0), scale)
    scale = np.clip(scale, np.float32(2.0**-9), np.float32(448.0))
    scale_e4m3 = nearest_e4m3(scale)
    divisor = (scale_e4m3.astype(np.float32) * scale_2).astype(np.float32)
    scaled = (blocks / divisor[..., None]).astype(np.float32)
    return nearest_e2m1_codes(scaled).reshape(rows, columns), scale_e4m3, scale_2


def reference(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    codes, scale, scale_2 = reference_quantize(weight.float().cpu().numpy())
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return {
        "weight_packed": torch.from_numpy(packed.astype(np.uint8)),
        "weight_scale": torch.from_numpy(scale).to(torch.float8_e4m3fn),  # exact: values are E4M3 points
        "weight_scale_2": torch.tensor(float(scale_2), dtype=torch.float32),
    }


ROW_PATTERNS = ("random", "ties", "tiny-blocks", "zero-blocks", "dynamic-range")
TIE_POINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_BLOCK_SCALES = (0.5, 1.0, 1.5, 2.0, 3.0, 0.015625, 0.125, 104.0, 448.0)  # E4M3 points


def _pattern_rows(pattern: str, rows: int, columns: int, scale_2: float, generator: torch.Generator) -> torch.Tensor:
    """`rows` rows of one pattern, magnitudes below 2.5 / 2.625 of the planted amax (2688 * scale_2)."""
    limit = 2.5 / 2.625 * 2688.0 * scale_2
    values = torch.randn(rows, columns, generator=generator).clamp(-2.5, 2.5) * (limit / 2.5)
    blocks = values.view(rows, columns // BLOCK, BLOCK)  # [r, B, 16]
    count = blocks.shape[1]
    if pattern == "ties":
        scales = torch.tensor(_TIE_BLOCK_SCALES)[torch.randint(len(_TIE_BLOCK_SCALES), (rows, count, 1), generator=generator)]
        picks = torch.tensor(TIE_POINTS)[torch.randint(len(TIE_POINTS), (rows, count, BLOCK), generator=generator)]
        signs = torch.where(torch.rand(rows, count, BLOCK, generator=generator) < 0.5, -1.0, 1.0)
        blocks.copy_(signs * picks * scales * scale_2)
        amax_at = torch.randint(BLOCK, (rows, count, 1), generator=generator)
        blocks.scatter_(2, amax_at, 6.0 * scales * scale_2)  # the block amax: scale exactly an E4M3 point
    elif pattern == "tiny-blocks":  # block amax 1e-1 .. 1e-8 of the limit: subnormal scales and the 2^-9 clamp
        factors = 10.0 ** -torch.randint(1, 9, (rows, count, 1), generator=generator).float()
        blocks.mul_(torch.where(torch.rand(rows, count, 1, generator=generator) < 0.7, factors, torch.ones_like(factors)))
    elif pattern == "zero-blocks":
        blocks.mul_(torch.rand(rows, count, 1, generator=generator) >= 0.3)
        values[torch.rand(rows, columns, generator=generator) < 0.1] = 0.0
    elif pattern == "dynamic-range":
        values.mul_(10.0 ** (-6 * torch.rand(rows, 1, generator=generator)))
        values.mul_(10.0 ** (-2 * torch.rand(rows, columns, generator=generator)))
    return values


def make_inputs(axes: dict, params: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random weight whose row r follows ROW_PATTERNS[r % 5]; element [0, 0] holds the tensor amax.

    Odd seeds plant amax = 2.625 * 2^j, so weight_scale_2 = 2^(j-10) exactly and the "ties" rows put
    every scaled element exactly on an E2M1 midpoint (or on 0.5 / 6); even seeds plant an arbitrary
    amax, so weight_scale_2 is a rounded float32 and those rows only come near the midpoints.
    """
    rows, columns = axes["N"], axes["K"]
    exponent = int(torch.randint(-8, 9, (1,), generator=generator))
    amax = 2.625 * 2.0**exponent
    if generator.initial_seed() % 2 == 0:
        amax *= 1.0 + 0.9 * float(torch.rand(1, generator=generator))
    scale_2 = amax / 2688.0
    weight = torch.empty(rows, columns)
    for index, pattern in enumerate(ROW_PATTERNS):
        selected = torch.arange(index, rows, len(ROW_PATTERNS))
        if selected.numel():
            weight[selected] = _pattern_rows(pattern, selected.numel(), columns, scale_2, generator)
    weight[0, 0] = -amax if exponent % 2 else amax
    return {"weight": weight.to(dtype).to(device)}


def k_not_multiple_of_16(inputs: dict, params: dict) -> tuple[dict, dict]:
    return {"weight": inputs["weight"][:, :-8].contiguous()}, params


def all_zero_weight(inputs: dict, params: dict) -> tuple[dict, dict]:
    return {"weight": torch.zeros_like(inputs["weight"])}, params


def nan_in_weight(inputs: dict, params: dict) -> tuple[dict, dict]:
    weight = inputs["weight"].clone()
    weight[0, 3] = float("nan")
    return {"weight": weight}, params


def scales_within_range(inputs: dict, outputs: dict, params: dict) -> None:
    """Every block scale is a finite E4M3 value in [2^-9, 448]; the tensor scale is amax / 2688 > 0."""
    scale = outputs["weight_scale"].float()
    assert bool(torch.isfinite(scale).all()), "weight_scale holds NaN"
    assert float(scale.min()) >= 2.0**-9 and float(scale.max()) <= 448.0, "weight_scale outside [2^-9, 448]"
    assert float(outputs["weight_scale_2"]) > 0, "weight_scale_2 must be positive"
