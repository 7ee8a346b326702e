"""FP4 E2M1 elements: encode (round to nearest, ties to even), decode, and two-per-byte packing.

Code layout: bit 3 is the sign, bits 0-2 index the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
Encoding clamps magnitudes to 6. A tie between two neighbours goes to the one whose mantissa bit
is 0 (the even code): 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.

Signed zero (the ModelOpt rule): the sign bit is set exactly when the input is strictly negative,
so a negative value that rounds to zero becomes code 8 (-0) and an input of -0.0 becomes code 0.
Both decode to zero. NaN inputs have no code; callers reject them before encoding.

Packing: along the last axis element 2j goes to the low nibble and element 2j + 1 to the high
nibble of byte j.
"""

from __future__ import annotations

import torch

E2M1_MAX = 6.0
# Magnitude of codes 0..7; codes 8..15 are the same magnitudes negated.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring magnitudes, and whether a value exactly on the midpoint rounds
# up (the upper neighbour has the even code) or down.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_ROUNDS_UP = (False, True, False, True, False, True, False)

_values_by_device: dict[torch.device, torch.Tensor] = {}


def _code_values(device: torch.device) -> torch.Tensor:
    """The value of each of the 16 codes, float32, on `device`."""
    if device not in _values_by_device:
        values = E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES)
        _values_by_device[device] = torch.tensor(values, dtype=torch.float32, device=device)
    return _values_by_device[device]


def encode_e2m1(values: torch.Tensor) -> torch.Tensor:
    """Float tensor (already divided by its scales) -> uint8 codes 0..15 of the same shape."""
    magnitude = values.float().abs()  # [...]
    # Index of the nearest magnitude = number of midpoints strictly below the value (a value exactly
    # on a midpoint rounds down) ...
    index = torch.zeros(magnitude.shape, dtype=torch.uint8, device=magnitude.device)
    for midpoint, tie_rounds_up in zip(_MIDPOINTS, _TIE_ROUNDS_UP):
        index += magnitude > midpoint
        # ... except on the midpoints whose upper neighbour is the even code.
        if tie_rounds_up:
            index += magnitude == midpoint
    sign = (values < 0).to(torch.uint8) << 3
    return index | sign


def decode_e2m1(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 codes 0..15 -> their float values (exact in any float dtype)."""
    if codes.dtype != torch.uint8:
        raise ValueError(f"E2M1 codes must be uint8, got {codes.dtype}")
    return _code_values(codes.device)[(codes & 0x0F).long()].to(dtype)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., K] -> packed bytes [..., K/2] (element 2j low nibble, 2j + 1 high nibble)."""
    if codes.dtype != torch.uint8:
        raise ValueError(f"E2M1 codes must be uint8, got {codes.dtype}")
    if codes.shape[-1] % 2 != 0:
        raise ValueError(f"packing needs an even number of elements along the last axis, got {codes.shape[-1]}")
    low = codes[..., 0::2] & 0x0F
    high = codes[..., 1::2] & 0x0F
    return low | (high << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Packed bytes [..., K/2] -> uint8 codes [..., K]."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed E2M1 data must be uint8, got {packed.dtype}")
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
