"""The Blackwell 128x4 swizzled layout of NVFP4 block scales (what tcgen05 / CUTLASS / cuBLAS
block-scaled GEMMs read), and its inverse.

A scale matrix `[M, S]` (M rows of the operand, S = K/16 blocks per row) is padded with zeros to
`Mp = ceil(M / 128) * 128` rows and `Sp = ceil(S / 4) * 4` columns, then stored as contiguous
512-byte tiles of 128 rows x 4 columns, tiles ordered row-tile major. Inside a tile, entry
(r, c) sits at `(r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)`; the tile starts at
`((r // 128) * (Sp / 4) + c // 4) * 512`. So (5, 2) -> 82 and (5, 5) -> 593.
"""

from __future__ import annotations

import torch

from reference_engine.ops.registry import satisfies

ROW_TILE = 128
COLUMN_TILE = 4
_ONE_BYTE = (torch.uint8, torch.int8, torch.float8_e4m3fn)


def padded_shape(rows: int, columns: int) -> tuple[int, int]:
    """(Mp, Sp): rows rounded up to 128, columns rounded up to 4."""
    return -(-rows // ROW_TILE) * ROW_TILE, -(-columns // COLUMN_TILE) * COLUMN_TILE


def swizzled_offset(row: int, column: int, columns: int) -> int:
    """Byte offset of scale (row, column) in the swizzled buffer of a matrix with `columns` columns."""
    _, padded_columns = padded_shape(1, columns)
    tile = (row // ROW_TILE) * (padded_columns // COLUMN_TILE) + column // COLUMN_TILE
    return tile * 512 + (row % 32) * 16 + ((row % ROW_TILE) // 32) * 4 + column % COLUMN_TILE


def swizzle_scales(scale: torch.Tensor) -> torch.Tensor:
    """`scale [M, S]` (one-byte dtype) -> swizzled 1-D buffer `[Mp * Sp]` of the same dtype, padding zero."""
    if scale.ndim != 2:
        raise ValueError(f"scale must be a 2-D [M, S] matrix, got shape {tuple(scale.shape)}")
    if scale.dtype not in _ONE_BYTE:
        raise ValueError(f"scale must have a one-byte dtype (uint8, float8_e4m3fn), got {scale.dtype}")
    rows, columns = scale.shape
    padded_rows, padded_columns = padded_shape(rows, columns)
    raw = scale.view(torch.uint8)
    padded = torch.zeros(padded_rows, padded_columns, dtype=torch.uint8, device=scale.device)
    padded[:rows, :columns] = raw
    # row = row_tile*128 + row_group*32 + row_in_group; column = column_tile*4 + column_in_tile
    tiles = padded.view(padded_rows // ROW_TILE, 4, 32, padded_columns // COLUMN_TILE, COLUMN_TILE)
    ordered = tiles.permute(0, 3, 2, 1, 4)  # [row_tile, column_tile, row_in_group, row_group, column_in_tile]
    return ordered.contiguous().view(-1).view(scale.dtype)


def unswizzle_scales(swizzled: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """Inverse of `swizzle_scales`: swizzled buffer -> `[rows, columns]` (padding dropped)."""
    padded_rows, padded_columns = padded_shape(rows, columns)
    if swizzled.dtype not in _ONE_BYTE:
        raise ValueError(f"swizzled scales must have a one-byte dtype, got {swizzled.dtype}")
    if swizzled.numel() != padded_rows * padded_columns:
        raise ValueError(f"a [{rows}, {columns}] scale matrix swizzles to {padded_rows * padded_columns} bytes, got {swizzled.numel()}")
    tiles = swizzled.reshape(-1).view(torch.uint8).view(padded_rows // ROW_TILE, padded_columns // COLUMN_TILE, 32, 4, COLUMN_TILE)
    padded = tiles.permute(0, 3, 2, 1, 4).reshape(padded_rows, padded_columns)
    return padded[:rows, :columns].contiguous().view(swizzled.dtype)


@satisfies("quantization/nvfp4-scale-swizzle", major=1)
def swizzle_scales_into(scale: torch.Tensor, swizzled: torch.Tensor) -> None:
    """Destination-passing form: writes the swizzled bytes (padding zero) into `swizzled [Mp * Sp]`."""
    result = swizzle_scales(scale)
    if swizzled.shape != result.shape:
        raise ValueError(f"swizzled must have shape {tuple(result.shape)}, got {tuple(swizzled.shape)}")
    swizzled.view(torch.uint8).copy_(result.view(torch.uint8))
