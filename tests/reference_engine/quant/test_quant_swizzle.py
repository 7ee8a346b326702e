"""The 128x4 swizzled scale layout: check values, per-entry formula, padding, inverse."""

from __future__ import annotations

import pytest
import torch

from reference_engine.quant.swizzle import padded_shape, swizzle_scales, swizzle_scales_into, swizzled_offset, unswizzle_scales


def test_published_check_values() -> None:
    assert swizzled_offset(5, 2, columns=8) == 82
    assert swizzled_offset(5, 5, columns=8) == 593


@pytest.mark.parametrize("rows,columns", [(1, 1), (6, 6), (130, 9), (256, 128)])
def test_every_entry_lands_at_its_formula_offset_and_padding_is_zero(rows: int, columns: int) -> None:
    generator = torch.Generator().manual_seed(rows * 1000 + columns)
    scale = torch.randint(1, 256, (rows, columns), generator=generator, dtype=torch.int32).to(torch.uint8)
    swizzled = swizzle_scales(scale)
    padded_rows, padded_columns = padded_shape(rows, columns)
    assert swizzled.shape == (padded_rows * padded_columns,)
    written = torch.zeros_like(swizzled, dtype=torch.bool)
    for row in range(rows):
        for column in range(columns):
            offset = swizzled_offset(row, column, columns)
            assert int(swizzled[offset]) == int(scale[row, column])
            written[offset] = True
    assert int(swizzled[~written].count_nonzero()) == 0


def test_inverse_and_fp8_bytes_are_reinterpreted() -> None:
    generator = torch.Generator().manual_seed(3)
    scale = torch.randint(1, 0x7F, (300, 11), generator=generator, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    swizzled = swizzle_scales(scale)
    assert swizzled.dtype == torch.float8_e4m3fn
    assert torch.equal(unswizzle_scales(swizzled, 300, 11).view(torch.uint8), scale.view(torch.uint8))


def test_destination_passing_form_and_errors() -> None:
    scale = torch.randint(1, 256, (3, 5), dtype=torch.int32).to(torch.uint8)
    out = torch.full((128 * 8,), 0xA5, dtype=torch.uint8)
    swizzle_scales_into(scale, out)
    assert torch.equal(out, swizzle_scales(scale))
    with pytest.raises(ValueError, match="shape"):
        swizzle_scales_into(scale, torch.empty(10, dtype=torch.uint8))
    with pytest.raises(ValueError, match="one-byte"):
        swizzle_scales(scale.to(torch.int16))
    with pytest.raises(ValueError, match="2-D"):
        swizzle_scales(scale[None])
    with pytest.raises(ValueError, match="bytes"):
        unswizzle_scales(out, 300, 5)
