"""Router tie rule and the top-k softmax identity, on the CPU (a few seconds).

1. On random bf16 router logits (E = 256, k = 8), counts rows where an exact tie straddles the
   top-8 boundary, so that the tie rule decides which expert is chosen.
2. Shows that a stable descending sort follows the lower-index rule of moe/router-topk while
   higher-index tie-breaking picks different experts on those rows.
3. Checks that renormalised top-k of the full float32 softmax equals a softmax over the k
   selected logits (the identity a fused kernel uses).
Exits non-zero if a check fails.
"""

from __future__ import annotations

import sys

import torch


def select_lower_index(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    return torch.sort(logits.float(), dim=-1, descending=True, stable=True).indices[:, :top_k]  # [T, k]


def select_higher_index(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    flipped = logits.float().flip(-1)  # reversed index order, so a stable sort prefers the higher index
    order = torch.sort(flipped, dim=-1, descending=True, stable=True).indices[:, :top_k]
    return logits.shape[-1] - 1 - order


def reference_ids(row: list[float], top_k: int) -> list[int]:
    return sorted(range(len(row)), key=lambda e: (-row[e], e))[:top_k]


def main() -> int:
    generator = torch.Generator().manual_seed(0)
    tokens, experts, top_k = 4096, 256, 8
    hidden = torch.randn(tokens, 2048, generator=generator).to(torch.bfloat16)
    gate = (torch.randn(experts, 2048, generator=generator) * 2048**-0.5).to(torch.bfloat16)
    logits = hidden @ gate.T  # [T, E] bf16, as a bf16 router GEMM produces
    values = logits.float()
    kth = values.sort(dim=-1, descending=True).values[:, top_k - 1 : top_k + 1]  # [T, 2]
    boundary_ties = int((kth[:, 0] == kth[:, 1]).sum())
    lower = select_lower_index(logits, top_k)
    higher = select_higher_index(logits, top_k)
    differ = int((lower.sort(-1).values != higher.sort(-1).values).any(-1).sum())
    print(f"{boundary_ties} of {tokens} bf16 rows have a tie at the top-{top_k} boundary; "
          f"reversed tie-breaking selects a different expert set on {differ} rows")
    rows = values.tolist()
    mismatches = sum(lower[t].tolist() != reference_ids(rows[t], top_k) for t in range(tokens))
    if mismatches:
        print(f"FAIL: stable sort disagrees with the lower-index rule on {mismatches} rows")
        return 1
    probs = torch.softmax(values, dim=-1)
    chosen = probs.gather(1, lower)
    renormalised = chosen / chosen.sum(-1, keepdim=True)  # [T, k]
    local = torch.softmax(values.gather(1, lower), dim=-1)  # softmax over the k logits only
    error = float((renormalised - local).abs().max())
    print(f"max |renormalised full softmax - softmax over top-k logits| = {error:.2e}")
    if error > 1e-6:
        print("FAIL: the identity does not hold to float32 rounding")
        return 1
    bf16_weights = renormalised.to(torch.bfloat16).float()
    rel = float((bf16_weights - renormalised).norm() / renormalised.norm())
    print(f"rounding the weights to bf16 costs relative Frobenius {rel:.1e} (moe/router-topk allows 1e-5)")
    if rel <= 1e-5:
        print("FAIL: expected bf16 rounding to exceed the contract bound")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
