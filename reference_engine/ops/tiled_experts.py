"""Tile-major copies of NVFP4 expert weights, for the grouped decode kernels (`kernels/moe_grouped_half`).

The stacks are row-major: expert e's gate/up codes are [2I, H/2] bytes, one row after another. A grouped decode program
reads a tile of rows (say 32) by a few scale blocks per K step, so each step takes a short run from each of 32 rows
that lie a row apart. A tile-major copy stores each tile's words in the order the program's K loop reads them, so one
step reads one contiguous run. The copy holds the same values, so a kernel reading it computes the same bits; it
costs the experts' bytes a second time in memory (the other kernels keep reading the row-major stacks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TiledWeights:
    """One expert stack's codes (int64 words, one 16-code scale block each) and E4M3 scales, flat, in tile-major order
    for the tiles in `tiles`: [expert, row tile, K step, (gate, up), row, block] for gate/up, [expert, row tile,
    K step, row, block] for down (`tile_major`)."""

    gate_up_words: torch.Tensor  # int64, E * 2I * H/16
    gate_up_scale: torch.Tensor  # float8_e4m3fn, the same count
    down_words: torch.Tensor  # int64, E * H * I/16
    down_scale: torch.Tensor  # float8_e4m3fn
    tiles: tuple[int, int, int, int]  # (gate/up rows, gate/up blocks per K step, down rows, down blocks per K step)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.gate_up_words, self.gate_up_scale, self.down_words, self.down_scale))


def tile_major(blocks: torch.Tensor, parts: int, block_n: int, block_b: int) -> torch.Tensor:
    """[E, rows, K] (rows = parts x R; one element per scale block) -> the same elements, flat, in the order
    [E, R / block_n, K / block_b, parts, block_n, block_b], where row r of part q is input row q * R + r."""
    experts, rows, k = blocks.shape
    if rows % (parts * block_n) or k % block_b:
        raise ValueError(f"[{experts}, {rows}, {k}] does not tile into {parts} parts of {block_n}-row tiles by {block_b} blocks")
    raw = blocks.view(torch.uint8) if blocks.dtype == torch.float8_e4m3fn else blocks  # float8 permutes as bytes
    view = raw.reshape(experts, parts, rows // (parts * block_n), block_n, k // block_b, block_b)
    return view.permute(0, 2, 4, 1, 3, 5).contiguous().reshape(-1).view(blocks.dtype)


def tiled_weights(gate_up_packed: torch.Tensor, gate_up_scale: torch.Tensor, down_packed: torch.Tensor, down_scale: torch.Tensor,
                  tiles: tuple[int, int, int, int]) -> TiledWeights:  # fmt: skip
    """Row-major stacks ([E, 2I, H/2] uint8 codes, [E, 2I, H/16] scales, [E, H, I/2], [E, H, I/16]; without E for one
    expert) -> their tile-major copy for `tiles`."""
    if gate_up_packed.dim() == 2:
        gate_up_packed, gate_up_scale, down_packed, down_scale = (t.unsqueeze(0) for t in (gate_up_packed, gate_up_scale, down_packed, down_scale))
    gu_n, gu_b, d_n, d_b = tiles
    return TiledWeights(
        gate_up_words=tile_major(gate_up_packed.contiguous().view(torch.int64), 2, gu_n, gu_b),
        gate_up_scale=tile_major(gate_up_scale.contiguous(), 2, gu_n, gu_b),
        down_words=tile_major(down_packed.contiguous().view(torch.int64), 1, d_n, d_b),
        down_scale=tile_major(down_scale.contiguous(), 1, d_n, d_b),
        tiles=tuple(tiles),
    )
