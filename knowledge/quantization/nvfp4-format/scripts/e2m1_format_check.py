"""Self-contained checks of the NVFP4 element format (plain torch, CPU, a few seconds).

Decodes all 16 E2M1 codes from their bit fields, derives the rounding-tie table by explicit
nearest-point search with ties to the even mantissa, checks the nibble order of packing with a
known byte, prints the storage cost of NVFP4 vs MXFP4 vs BF16 for Qwen3.6-35B-A3B linears, and
measures the relative quantisation error of NVFP4 (block 16, E4M3 scale, FP32 tensor scale)
against MXFP4 (block 32, power-of-two E8M0 scale) on Gaussian weights.

Run: python e2m1_format_check.py          (exits non-zero if a check fails)
"""

from __future__ import annotations

import torch

MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def decode(code: int) -> float:
    """E2M1 code (0..15) -> value: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0."""
    sign = -1.0 if code & 0b1000 else 1.0
    exponent, mantissa = (code >> 1) & 0b11, code & 1
    if exponent == 0:
        return sign * 0.5 * mantissa  # subnormal: 0 or 0.5
    return sign * 2.0 ** (exponent - 1) * (1.0 + 0.5 * mantissa)


def nearest_even(value: float) -> float:
    """Round |value| to the E2M1 grid by explicit search; ties to the point whose mantissa bit is 0."""
    magnitude = min(abs(value), 6.0)
    distances = [abs(magnitude - m) for m in MAGNITUDES]
    best = min(distances)
    candidates = [code for code, d in enumerate(distances) if d == best]
    code = min(candidates, key=lambda c: (c & 1, c))  # even mantissa first
    return MAGNITUDES[code]


def quantize_blocks(weight: torch.Tensor, block: int, power_of_two_scale: bool) -> torch.Tensor:
    """Fake-quantise [N, K] along K: NVFP4 (E4M3 block scale x FP32 tensor scale) or MXFP4 (E8M0)."""
    rows = weight.shape[0]
    blocks = weight.reshape(rows, -1, block)  # [N, K/block, block]
    amax = blocks.abs().amax(-1, keepdim=True)  # [N, K/block, 1]
    if power_of_two_scale:  # OCP MX: shared exponent floor(log2(amax)) - emax(E2M1) = ... - 2
        scale = torch.exp2(torch.floor(torch.log2(amax)) - 2)
    else:
        tensor_scale = weight.abs().max() / (6 * 448)
        block_scale = (amax / (6 * tensor_scale)).clamp(2.0**-9, 448).to(torch.float8_e4m3fn).float()
        scale = block_scale * tensor_scale
    scaled = (blocks / scale).clamp(-6, 6)
    grid = torch.tensor(MAGNITUDES)
    midpoints = (grid[1:] + grid[:-1]) / 2
    index = torch.bucketize(scaled.abs(), midpoints)  # ties go down here ...
    on_tie = (scaled.abs()[..., None] == midpoints).any(-1)
    up = on_tie & (index % 2 == 1)  # ... so move up where the upper neighbour is even
    index = index + up.long()
    return (grid[index] * scaled.sign() * scale).reshape(weight.shape)


def main() -> None:
    torch.manual_seed(0)
    values = [decode(c) for c in range(16)]
    assert values[:8] == list(MAGNITUDES) and values[8:] == [-m for m in MAGNITUDES], values
    assert str(values[8]) == "-0.0", "code 8 is negative zero"
    print("codes 0..7:", values[:8], " code 8:", values[8])

    ties = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}
    for midpoint, expected in ties.items():
        assert nearest_even(midpoint) == expected, (midpoint, nearest_even(midpoint))
    assert nearest_even(7.9) == 6.0 and nearest_even(1e9) == 6.0, "saturates at 6"
    print("tie table:", ties)

    codes = torch.tensor([[3, 12]], dtype=torch.uint8)  # elements [1.5, -2.0]
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    assert int(packed) == 0xC3, hex(int(packed))
    print("pack [1.5, -2.0] -> byte 0x%02X (element 0 in the low nibble)" % int(packed))

    print("\nbytes per weight: NVFP4 %.4f (+4 B per tensor), MXFP4 %.4f, BF16 2" % (0.5 + 1 / 16, 0.5 + 1 / 32))
    for name, (n, k) in {"q_proj": (8192, 2048), "expert gate_up": (1024, 2048), "expert down": (2048, 512)}.items():
        nvfp4 = n * k // 2 + n * k // 16 + 4
        print(f"  {name:15s} [{n}, {k}]: NVFP4 {nvfp4 / 1e6:7.3f} MB, BF16 {2 * n * k / 1e6:7.3f} MB, ratio {2 * n * k / nvfp4:.2f}")

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(1024, 2048, generator=generator)
    for label, block, pow2 in (("NVFP4", 16, False), ("MXFP4", 32, True)):
        error = float((quantize_blocks(weight, block, pow2) - weight).norm() / weight.norm())
        print(f"relative Frobenius error, Gaussian weight [1024, 2048], {label}: {error:.4f}")
    nv = float((quantize_blocks(weight, 16, False) - weight).norm() / weight.norm())
    mx = float((quantize_blocks(weight, 32, True) - weight).norm() / weight.norm())
    assert 0.08 < nv < 0.11 and mx > nv, (nv, mx)
    heavy = torch.distributions.StudentT(3.0).sample((1024, 2048))  # heavy tails: outlier blocks
    nv_heavy = float((quantize_blocks(heavy, 16, False) - heavy).norm() / heavy.norm())
    print(f"relative Frobenius error, Student-t(3) weight, NVFP4: {nv_heavy:.4f}")
    print(f"bf16 rounding alone, Gaussian weight: {float((weight.bfloat16().float() - weight).norm() / weight.norm()):.4f}")
    assert 0.07 < nv_heavy < 0.11, nv_heavy
    print("all checks passed")


if __name__ == "__main__":
    main()
