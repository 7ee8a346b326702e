"""The Blackwell 128x4 block-scale layout, three ways, checked against each other (plain torch, CPU).

1. The offset formula of ../SKILL.md, one entry at a time.
2. The same layout as a reshape/permute (what a loader does once per weight).
3. The CuTe-style atom: rows (32, 4) with strides (16, 4), scale columns (4) with stride 1, inside a
   512-byte tile; tiles ordered [row_tile][column_tile].
Then the inverse, the published check values (5, 2) -> 82 and (5, 5) -> 593, and two
known-wrong layouts (tiles column-major; rows not interleaved) that the checks must reject.

Run: python scale_swizzle.py   (exits non-zero if a check fails)
"""

from __future__ import annotations

import torch


def padded(rows: int, columns: int) -> tuple[int, int]:
    return -(-rows // 128) * 128, -(-columns // 4) * 4


def offset(r: int, c: int, columns: int) -> int:
    _, padded_columns = padded(1, columns)
    tile = (r // 128) * (padded_columns // 4) + c // 4
    return tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def swizzle_by_formula(scale: torch.Tensor, wrong: str | None = None) -> torch.Tensor:
    rows, columns = scale.shape
    padded_rows, padded_columns = padded(rows, columns)
    out = torch.zeros(padded_rows * padded_columns, dtype=torch.uint8)
    for r in range(rows):
        for c in range(columns):
            if wrong == "tiles-column-major":
                tile = (c // 4) * (padded_rows // 128) + r // 128
                index = tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
            elif wrong == "rows-not-interleaved":
                index = ((r // 128) * (padded_columns // 4) + c // 4) * 512 + (r % 128) * 4 + c % 4
            else:
                index = offset(r, c, columns)
            out[index] = scale[r, c]
    return out


def swizzle_by_permute(scale: torch.Tensor) -> torch.Tensor:
    rows, columns = scale.shape
    padded_rows, padded_columns = padded(rows, columns)
    full = torch.zeros(padded_rows, padded_columns, dtype=torch.uint8)
    full[:rows, :columns] = scale
    # row = row_tile * 128 + group * 32 + lane; column = column_tile * 4 + j
    tiles = full.view(padded_rows // 128, 4, 32, padded_columns // 4, 4)  # [row_tile, group, lane, column_tile, j]
    return tiles.permute(0, 3, 2, 1, 4).contiguous().view(-1)  # [row_tile, column_tile, lane, group, j]


def swizzle_by_atom(scale: torch.Tensor) -> torch.Tensor:
    rows, columns = scale.shape
    padded_rows, padded_columns = padded(rows, columns)
    out = torch.zeros(padded_rows * padded_columns, dtype=torch.uint8)
    r = torch.arange(rows)[:, None]
    c = torch.arange(columns)[None, :]
    inside = (r % 32) * 16 + ((r // 32) % 4) * 4 + (c % 4) * 1  # atom strides (16, 4) and 1
    tile = (r // 128) * (padded_columns // 4) + (c // 4)
    out[(tile * 512 + inside).reshape(-1)] = scale.reshape(-1)
    return out


def unswizzle(buffer: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    padded_rows, padded_columns = padded(rows, columns)
    tiles = buffer.view(padded_rows // 128, padded_columns // 4, 32, 4, 4)
    return tiles.permute(0, 3, 2, 1, 4).reshape(padded_rows, padded_columns)[:rows, :columns]


def main() -> None:
    assert offset(5, 2, 6) == 82 and offset(5, 5, 6) == 593, (offset(5, 2, 6), offset(5, 5, 6))
    print("check values: (5, 2) -> 82, (5, 5) -> 593 for a 6-column matrix")
    generator = torch.Generator().manual_seed(0)
    for rows, columns in ((6, 6), (130, 9), (256, 128), (1, 1)):
        scale = torch.randint(1, 256, (rows, columns), generator=generator, dtype=torch.int32).to(torch.uint8)
        reference = swizzle_by_formula(scale)
        assert torch.equal(swizzle_by_permute(scale), reference), (rows, columns)
        assert torch.equal(swizzle_by_atom(scale), reference), (rows, columns)
        assert torch.equal(unswizzle(reference, rows, columns), scale)
        padded_rows, padded_columns = padded(rows, columns)
        assert int((reference == 0).sum()) == padded_rows * padded_columns - rows * columns  # padding is zero
        print(f"[{rows}, {columns}] -> {reference.numel()} bytes: formula == permute == atom, inverse ok")
        if rows > 128 and columns > 4:  # two row tiles and two column tiles: every wrong layout shows
            for wrong in ("tiles-column-major", "rows-not-interleaved"):
                assert not torch.equal(swizzle_by_formula(scale, wrong), reference), wrong
                print(f"   known-wrong layout {wrong!r}: rejected")
    bad = swizzle_by_formula(torch.arange(36, dtype=torch.uint8).view(6, 6) + 1, "rows-not-interleaved")
    assert int(bad[82]) != 6 * 5 + 2 + 1, "the check values alone catch the non-interleaved rows"
    print("all checks passed")


if __name__ == "__main__":
    main()
