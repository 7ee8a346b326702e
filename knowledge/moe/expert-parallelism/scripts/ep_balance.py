"""Expert-parallel planning numbers for E = 256, k = 8 under uniform routing (CPU, seconds).

For N GPUs holding E / N consecutive experts each, prints:
- GPUs one token must reach: N * (1 - C(E - E/N, k) / C(E, k)), checked by simulation;
- at decode (T tokens per step), the distinct experts the busiest GPU must read versus the
  mean: the step waits for the busiest GPU, so this ratio is the EP load-imbalance cost;
- at prefill, the (token, expert) copies the busiest GPU receives versus the mean T * k / N.
Exits non-zero when the simulated GPUs-per-token disagrees with the formula by more than 1%.
"""

from __future__ import annotations

import sys
from math import comb

import torch

EXPERTS, TOP_K = 256, 8


def gpus_per_token(num_gpus: int) -> float:
    local = EXPERTS // num_gpus
    return num_gpus * (1.0 - comb(EXPERTS - local, TOP_K) / comb(EXPERTS, TOP_K))


def route(tokens: int, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(tokens, EXPERTS, generator=generator).argsort(dim=1)[:, :TOP_K]  # [T, k]


def main() -> int:
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for num_gpus in (2, 4, 8):
        local = EXPERTS // num_gpus
        ids = route(20000, generator)
        simulated = (ids // local).sort(dim=1).values.diff(dim=1).ne(0).sum(dim=1).add(1).float().mean().item()
        formula = gpus_per_token(num_gpus)
        worst = max(worst, abs(simulated - formula) / formula)
        print(f"N={num_gpus}: {local} experts per GPU; a token reaches {formula:.2f} GPUs (simulated {simulated:.2f})")
        for tokens in (1, 8, 64):
            max_experts, mean_experts = 0.0, 0.0
            trials = 400
            for _ in range(trials):
                distinct = torch.unique(route(tokens, generator))  # experts read this step
                per_gpu = torch.bincount(distinct // local, minlength=num_gpus).float()
                max_experts += per_gpu.max().item() / trials
                mean_experts += per_gpu.mean().item() / trials
            print(f"    decode T={tokens:>3}: busiest GPU reads {max_experts:5.2f} experts, mean {mean_experts:5.2f} "
                  f"(imbalance {max_experts / mean_experts:.2f})")
        for tokens in (1024, 8192):
            trials, busiest = 20, 0.0
            for _ in range(trials):
                copies = torch.bincount(route(tokens, generator).flatten() // local, minlength=num_gpus).float()
                busiest += copies.max().item() / trials
            mean = tokens * TOP_K / num_gpus
            print(f"    prefill T={tokens}: busiest GPU receives {busiest:.0f} copies, mean {mean:.0f} (imbalance {busiest / mean:.3f})")
    print(f"largest relative gap, GPUs per token: {worst:.3%}")
    if worst > 0.01:
        print("FAIL: formula and simulation disagree")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
