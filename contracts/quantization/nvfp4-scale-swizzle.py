"""Executable half of quantization/nvfp4-scale-swizzle (stdlib, torch, numpy only).

The reference places every entry by the offset formula, one index computation per entry, in
numpy (no reshapes or permutes).
"""

from __future__ import annotations

import numpy as np
import torch


def padded(rows: int, columns: int) -> tuple[int, int]:
    return -(-rows // 128) * 128, -(-columns // 4) * 4


def offsets(rows: int, columns: int) -> np.ndarray:
    """Byte offset of every (r, c) of a [rows, columns] scale matrix in the swizzled buffer."""
    _, padded_columns = padded(rows, columns)
    r = np.arange(rows)[:, None]
    c = np.arange(columns)[None, :]
    tile = (r // 128) * (padded_columns // 4) + c // 4
    return tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def reference(scale: torch.Tensor) -> dict[str, torch.Tensor]:
    rows, columns = scale.shape
    padded_rows, padded_columns = padded(rows, columns)
    swizzled = np.zeros(padded_rows * padded_columns, dtype=np.uint8)  # padding is zero
    swizzled[offsets(rows, columns)] = scale.cpu().numpy()
    return {"swizzled": torch.from_numpy(swizzled)}


def make_inputs(axes: dict, params: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    scale = torch.randint(1, 256, (axes["M"], axes["S"]), generator=generator, dtype=torch.int32)  # never 0, so padding shows
    return {"scale": scale.to(torch.uint8).to(device)}


def check_values(inputs: dict, outputs: dict, params: dict) -> None:
    """The published check values: (5, 2) -> byte 82 and (5, 5) -> byte 593 (where the matrix has them)."""
    scale, swizzled = inputs["scale"].cpu(), outputs["swizzled"].cpu()
    if scale.shape[0] > 5 and scale.shape[1] > 5:
        assert int(swizzled[82]) == int(scale[5, 2]), "scale (5, 2) is not at byte 82"
        assert int(swizzled[593]) == int(scale[5, 5]), "scale (5, 5) is not at byte 593"


def three_dimensional(inputs: dict, params: dict) -> tuple[dict, dict]:
    return {"scale": inputs["scale"][None]}, params


def two_byte_dtype(inputs: dict, params: dict) -> tuple[dict, dict]:
    return {"scale": inputs["scale"].to(torch.int16)}, params
