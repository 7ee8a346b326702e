"""Distinct experts per decode step and the weight bytes they cost (CPU, a few seconds).

Under uniform routing each token picks a uniformly random set of k of the E experts, so an
expert is missed by one token with probability 1 - k/E and by T tokens with (1 - k/E)^T:
expected distinct experts = E * (1 - (1 - k/E)^T). This script checks that formula against a
simulation, then prints the bytes one MoE layer reads for the expert weights in bf16 and NVFP4
and the floors at the bandwidths in toolbox/data/hardware.yaml. Exits non-zero if the
simulation disagrees with the formula by more than 1%.
"""

from __future__ import annotations

import sys

import torch

EXPERTS, TOP_K, HIDDEN, INTERMEDIATE = 256, 8, 2048, 512
BANDWIDTHS = {"H200 measured 4.27 TB/s": 4.27e12, "B200 datasheet 8 TB/s": 8.0e12}


def expected_distinct(tokens: int, experts: int = EXPERTS, top_k: int = TOP_K) -> float:
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def simulated_distinct(tokens: int, trials: int, generator: torch.Generator) -> float:
    total = 0
    for _ in range(trials):
        ids = torch.rand(tokens, EXPERTS, generator=generator).argsort(dim=1)[:, :TOP_K]  # [T, k], distinct per row
        total += int(torch.unique(ids).numel())
    return total / trials


def expert_bytes(precision: str) -> int:
    """gate_up [2I, H] plus down [H, I] of one expert."""
    if precision == "bf16":
        return 2 * (2 * INTERMEDIATE * HIDDEN + HIDDEN * INTERMEDIATE)
    matrices = ((2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE))
    # E2M1 codes (half a byte), one float8 scale per 16, two float32 scalars per matrix
    return sum(n * k // 2 + n * k // 16 + 8 for n, k in matrices)


def main() -> int:
    generator = torch.Generator().manual_seed(0)
    print(f"bytes per expert: bf16 {expert_bytes('bf16'):,}, nvfp4 {expert_bytes('nvfp4'):,}")
    header = f"{'T':>4} {'min(E,T*k)':>10} {'expected':>9} {'simulated':>9}"
    print(header + "".join(f" | {p} MB" + "".join(f"  us@{name.split()[0]}" for name in BANDWIDTHS) for p in ("bf16", "nvfp4")))
    worst = 0.0
    for tokens in (1, 2, 4, 8, 16, 32, 64, 128):
        expected = expected_distinct(tokens)
        simulated = simulated_distinct(tokens, trials=400, generator=generator)
        worst = max(worst, abs(simulated - expected) / expected)
        row = f"{tokens:>4} {min(EXPERTS, tokens * TOP_K):>10} {expected:>9.2f} {simulated:>9.2f}"
        for precision in ("bf16", "nvfp4"):
            layer_bytes = expected * expert_bytes(precision)
            row += f" | {layer_bytes / 1e6:8.1f}" + "".join(f" {layer_bytes / bw * 1e6:7.1f}" for bw in BANDWIDTHS.values())
        print(row)
    print(f"largest relative gap between simulation and formula: {worst:.3%}")
    if worst > 0.01:
        print("FAIL: formula and simulation disagree")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
