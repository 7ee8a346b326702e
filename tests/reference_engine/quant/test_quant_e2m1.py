"""E2M1 encoding, decoding and packing (reference_engine.quant.e2m1)."""

from __future__ import annotations

import pytest
import torch

from reference_engine.quant.e2m1 import decode_e2m1, encode_e2m1, pack_e2m1, unpack_e2m1

# value -> expected decoded value under round-to-nearest, ties to the even code
TIES = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}


@pytest.mark.parametrize("value,expected", sorted(TIES.items()))
def test_ties_go_to_the_even_code(value: float, expected: float) -> None:
    for sign in (1.0, -1.0):
        decoded = decode_e2m1(encode_e2m1(torch.tensor([sign * value])))
        assert float(decoded[0]) == sign * expected


def test_grid_points_are_fixed_points_and_codes_follow_the_layout() -> None:
    magnitudes = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    codes = encode_e2m1(torch.tensor(magnitudes + [-m for m in magnitudes[1:]]))
    assert codes.tolist() == list(range(8)) + list(range(9, 16))
    assert decode_e2m1(torch.arange(16, dtype=torch.uint8)).tolist() == magnitudes + [-m for m in magnitudes]


def test_clamps_to_six_and_signed_zero_rule() -> None:
    codes = encode_e2m1(torch.tensor([7.0, 1e9, -1e9, -0.1, -0.0, 0.0, 0.1]))
    # small negatives keep the sign bit (code 8, -0); an input of -0.0 is not "< 0" so it is code 0
    assert codes.tolist() == [7, 7, 15, 8, 0, 0, 0]
    assert decode_e2m1(codes[3:4]).item() == 0.0


def test_near_ties_round_to_the_nearer_neighbour() -> None:
    generator = torch.Generator().manual_seed(0)
    midpoints = torch.tensor(sorted(TIES))
    nudged = midpoints * (1 + 1e-6 * (1 + torch.rand(7, generator=generator)))
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    above = decode_e2m1(encode_e2m1(nudged))
    below = decode_e2m1(encode_e2m1(midpoints * (1 - 1e-6 * (1 + torch.rand(7, generator=generator)))))
    upper = grid[torch.searchsorted(grid, midpoints)]
    lower = grid[torch.searchsorted(grid, midpoints) - 1]
    assert torch.equal(above, upper) and torch.equal(below, lower)


def test_pack_puts_the_even_element_in_the_low_nibble() -> None:
    codes = torch.tensor([[1, 2, 15, 8]], dtype=torch.uint8)
    assert pack_e2m1(codes).tolist() == [[0x21, 0x8F]]


def test_pack_unpack_round_trip() -> None:
    generator = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (3, 5, 32), generator=generator).to(torch.uint8)
    assert torch.equal(unpack_e2m1(pack_e2m1(codes)), codes)


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="even number"):
        pack_e2m1(torch.zeros(2, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        unpack_e2m1(torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="uint8"):
        decode_e2m1(torch.zeros(2, dtype=torch.int64))
