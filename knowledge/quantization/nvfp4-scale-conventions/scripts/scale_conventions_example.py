"""The worked example of ../SKILL.md and the two scale conventions side by side (plain torch, CPU).

1. Quantises one 16-element block step by step in the ModelOpt multiplier convention and prints
   every intermediate (float32 arithmetic in the contract's order).
2. Converts to the compressed-tensors divisor convention and back; shows that dequantised values
   agree and that 1 / (1 / s) is not always s in float32.
3. Quantises random weights with both conventions' arithmetic and counts how many block-scale
   bytes and codes differ (they differ only through float32 rounding of the scale products).
4. Shows the three tiny-scale rules (ModelOpt 2^-9 and 0 -> 1, torchao 2^-6, compressed-tensors
   0 -> 0.125) on a block whose scale falls below 2^-6.

Run: python scale_conventions_example.py   (exits non-zero if a check fails)
"""

from __future__ import annotations

import torch

F32 = torch.float32
GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
ROUND_UP_ON_TIE = torch.tensor([False, True, False, True, False, True, False])


def e2m1(scaled: torch.Tensor) -> torch.Tensor:
    """Values already divided by their scales -> nearest E2M1 value (ties to even), saturating at 6."""
    magnitude = scaled.abs().clamp(max=6.0)
    index = (magnitude[..., None] > MIDPOINTS).sum(-1) + ((magnitude[..., None] == MIDPOINTS) & ROUND_UP_ON_TIE).sum(-1)
    return torch.where(scaled < 0, -GRID[index], GRID[index])


def e4m3(values: torch.Tensor) -> torch.Tensor:
    return values.to(torch.float8_e4m3fn).to(F32)


def modelopt(weight: torch.Tensor, tiny: str = "modelopt"):
    """Multiplier convention: returns (values as stored e2m1, block scales, weight_scale_2)."""
    blocks = weight.to(F32).reshape(weight.shape[0], -1, 16)
    scale_2 = blocks.abs().max() / torch.tensor(2688.0)
    s = blocks.abs().amax(-1) / (torch.tensor(6.0) * scale_2)
    if tiny == "modelopt":
        s = torch.where(s == 0, torch.ones_like(s), s).clamp(2.0**-9, 448.0)
    elif tiny == "torchao":
        s = s.clamp(2.0**-6, 448.0)
    elif tiny == "compressed-tensors":
        s = s.clamp(max=448.0)
    scale = e4m3(s)
    if tiny == "compressed-tensors":
        scale = torch.where(scale == 0, torch.full_like(scale, 0.125), scale)
    elements = e2m1(blocks / (scale * scale_2)[..., None])
    return elements, scale, scale_2


def compressed_tensors(weight: torch.Tensor):
    """Divisor convention: returns (e2m1 values, block scales, weight_global_scale)."""
    blocks = weight.to(F32).reshape(weight.shape[0], -1, 16)
    global_scale = torch.tensor(2688.0) / blocks.abs().max()
    scale = e4m3((global_scale * (blocks.abs().amax(-1) / 6.0)).clamp(max=448.0))
    scale = torch.where(scale == 0, torch.full_like(scale, 0.125), scale)
    elements = e2m1(blocks / (scale / global_scale)[..., None])
    return elements, scale, global_scale


def main() -> None:
    torch.manual_seed(0)
    print("1. worked example (one block of a tensor whose amax is 5.376)")
    block = torch.tensor([0.9, 0.5, -0.21, 0.13, 0.0, -0.9, 0.06, 0.3, -0.45, 0.72, 0.2, -0.05, 0.36, -0.63, 0.1, 0.27])
    weight = torch.cat([block, torch.tensor([5.376] + [0.0] * 15)])[None]  # [1, 32]: block 1 holds the tensor amax
    elements, scale, scale_2 = modelopt(weight)
    print(f"   weight_scale_2 = 5.376 / 2688 = {scale_2.item():.9g}")
    raw = (torch.tensor(0.9) / (torch.tensor(6.0) * scale_2)).item()
    print(f"   block 0: amax 0.9 -> s = 0.9 / (6 * weight_scale_2) = {raw:.6g} -> E4M3 {scale[0, 0].item():g}")
    print(f"   block 1: amax 5.376 -> s = {5.376 / (6 * scale_2.item()):.6g} -> E4M3 {scale[0, 1].item():g}")
    divisor = scale[0, 0] * scale_2
    print(f"   divisor = {scale[0, 0].item():g} * weight_scale_2 = {divisor.item():.6g}")
    for x, q in zip(block[:4].tolist(), elements[0, 0, :4].tolist()):
        print(f"   {x:6.3f} / divisor = {x / divisor.item():7.4f} -> e2m1 {q:5.1f} -> dequant {q * divisor.item():.5f}")
    assert scale[0, 0].item() == 72.0 and scale[0, 1].item() == 448.0
    assert elements[0, 0, :4].tolist() == [6.0, 3.0, -1.5, 1.0]

    print("\n2. convention conversion")
    ct_elements, ct_scale, global_scale = compressed_tensors(weight)
    print(f"   weight_global_scale = 2688 / 5.376 = {global_scale.item():.9g};  1 / weight_scale_2 = {(1 / scale_2).item():.9g}")
    same = torch.equal(ct_scale, scale) and torch.equal(ct_elements, elements)
    print(f"   same scale bytes and codes for this tensor: {same}")
    dequant_mo = elements * (scale * scale_2)[..., None]
    dequant_ct = ct_elements * (ct_scale / global_scale)[..., None]
    print(f"   max |dequant difference| = {(dequant_mo - dequant_ct).abs().max().item():.3g}")
    samples = torch.rand(100000) * 10.0 ** torch.randint(-6, 2, (100000,)).float()
    round_trip = (1.0 / (1.0 / samples)) != samples
    print(f"   float32 1/(1/s) != s for {round_trip.float().mean().item() * 100:.1f}% of random s")

    print("\n3. both conventions on random weights [512, 2048]")
    weight = torch.randn(512, 2048) * torch.exp(torch.randn(512, 128, 1)).expand(512, 128, 16).reshape(512, 2048)
    mo, ct = modelopt(weight), compressed_tensors(weight)
    scale_diff = (mo[1] != ct[1]).float().mean().item()
    code_diff = (mo[0] != ct[0]).float().mean().item()
    print(f"   block scales differing: {scale_diff * 100:.3f}%, elements differing: {code_diff * 100:.4f}%")
    assert scale_diff < 0.01 and code_diff < 0.01

    print("\n4. tiny-scale rules: blocks whose amax is 1e-5 and 1e-6 of the tensor amax")
    weight = torch.randn(2, 32)
    weight[:, 0] = 4.0  # the tensor amax sits in block 1 of each row
    weight[0, 16:] *= 1e-5 * 4.0 / weight[0, 16:].abs().max()
    weight[1, 16:] *= 1e-6 * 4.0 / weight[1, 16:].abs().max()
    weight = weight[:, [*range(16, 32), *range(16)]]  # tiny block first
    kept = {}
    for rule in ("modelopt", "torchao", "compressed-tensors"):
        elements, scale, scale_2 = modelopt(weight, rule)
        for row, ratio in ((0, "1e-5"), (1, "1e-6")):
            tiny = weight[row, :16]
            approx = elements[row, 0] * scale[row, 0] * scale_2
            error = ((approx - tiny).norm() / tiny.norm()).item()
            kept[rule, row] = int((elements[row, 0] != 0).sum())
            print(f"   {rule:18s} {ratio}: block scale {scale[row, 0].item():.6g}, non-zero codes {kept[rule, row]:2d}/16, relative error {error:.2f}")
    assert kept["modelopt", 0] > kept["torchao", 0] and kept["modelopt", 1] > kept["compressed-tensors", 1]
    print("all checks passed")


if __name__ == "__main__":
    main()
