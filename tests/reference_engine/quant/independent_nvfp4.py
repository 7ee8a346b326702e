"""An NVFP4 quantizer written for the tests, independent of the engine and of the contract reference.

Algorithm: rounding by exponent and mantissa arithmetic (numpy frexp / rint, which rounds half
to even), not by tables, bucketing or grid search. Arithmetic order and the tiny-scale rule follow
the contract text (ModelOpt): float32 throughout, s = 1 where 0, s clamped to [2^-9, 448].
"""

from __future__ import annotations

import numpy as np

E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def round_to_e4m3(values: np.ndarray) -> np.ndarray:
    """Non-negative float32 values <= 448 -> nearest E4M3 value (float64), ties to the even mantissa."""
    v = values.astype(np.float64)
    _, exponent = np.frexp(v)  # v = f * 2^exponent with f in [0.5, 1)
    unbiased = np.maximum(exponent - 1, -6)  # below 2^-6 the step stays 2^-9 (subnormals)
    step = np.ldexp(1.0, unbiased - 3)  # three mantissa bits
    return np.rint(v / step) * step


def round_to_e2m1(values: np.ndarray) -> np.ndarray:
    """float32 values -> nearest E2M1 value (float64, sign kept; -0 for small negatives)."""
    v = values.astype(np.float64)
    magnitude = np.minimum(np.abs(v), 6.0)
    step = np.where(magnitude < 2.0, 0.5, np.where(magnitude < 4.0, 1.0, 2.0))
    rounded = np.rint(magnitude / step) * step
    return np.where(v < 0, -rounded, rounded)


def e2m1_codes(rounded: np.ndarray) -> np.ndarray:
    index = np.searchsorted(E2M1_MAGNITUDES, np.abs(rounded))
    return (index + 8 * np.signbit(rounded)).astype(np.uint8)


def quantize(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """float32 [N, K] -> (packed uint8 [N, K/2], block scales float64 [N, K/16], scale_2 float32)."""
    weight = weight.astype(np.float32)
    rows, columns = weight.shape
    scale_2 = np.float32(np.float32(np.abs(weight).max()) / np.float32(2688.0))
    blocks = weight.reshape(rows, columns // 16, 16)
    scale = np.abs(blocks).max(axis=-1) / (np.float32(6.0) * scale_2)
    scale = np.clip(np.where(scale == 0, np.float32(1.0), scale), np.float32(2.0**-9), np.float32(448.0)).astype(np.float32)
    scale = round_to_e4m3(scale)
    divisor = (scale.astype(np.float32) * scale_2).astype(np.float32)
    codes = e2m1_codes(round_to_e2m1((blocks / divisor[..., None]).astype(np.float32))).reshape(rows, columns)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), scale, scale_2


def random_weight_with_ties(rows: int, columns: int, seed: int) -> np.ndarray:
    """Random float32 weight; tensor scale 2^-10 exactly, and every other block planted on E2M1 midpoints."""
    rng = np.random.default_rng(seed)
    weight = np.clip(rng.standard_normal((rows, columns)), -2.5, 2.5).astype(np.float32)
    weight[0, 0] = 2.625  # amax -> scale_2 = 2^-10
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    block_scales = np.array([0.25, 0.5, 1.0, 1.5, 3.0, 2.0**-6, 2.0**-8, 88.0, 448.0])
    blocks = weight.reshape(rows, columns // 16, 16)
    for row in range(rows):
        for block in range(1 - row % 2, columns // 16, 2):
            s = rng.choice(block_scales)
            values = rng.choice(ties, 16) * rng.choice([-1.0, 1.0], 16) * s * 2.0**-10
            values[rng.integers(16)] = 6.0 * s * 2.0**-10
            blocks[row, block] = values
    # tiny blocks (scales below 2^-9 and subnormal) and an all-zero block
    blocks[-1, 0] *= 1e-7
    blocks[-1, -1] *= 3e-4
    blocks[rows // 2, 0] = 0.0
    return weight
