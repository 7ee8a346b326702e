"""A fused router kernel in Triton: softmax in float32, top-k with the lower-index tie rule, renormalise.

One program per token loads the row of E logits once, then k times takes the arg-max
(`tl.argmax(..., tie_break_left=True)`: among equal logits the lower index) and masks it out;
the weights are exp(l_j - l_max) / sum over the k selected, which equals the renormalised
full softmax (section 1 of the skill), so no full-row exponentials are needed. Checked against
a float64 reference on rows with deliberate ties at the top-k boundary (the construction of
the moe/router-topk contract), on a GPU or on the CPU under TRITON_INTERPRET=1. A variant
that breaks ties toward the higher index must disagree. Exits non-zero on failure.
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl


@triton.jit
def router_topk_kernel(logits_ptr, weights_ptr, ids_ptr, E: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
                       LOWER_WINS: tl.constexpr):
    token = tl.program_id(0)
    experts = tl.arange(0, E)
    row = tl.load(logits_ptr + token * E + experts).to(tl.float32)  # [E]
    if not LOWER_WINS:  # known-wrong variant: reverse the row so the higher index wins ties
        row = tl.load(logits_ptr + token * E + (E - 1 - experts)).to(tl.float32)
    slots = tl.arange(0, K_PAD)
    chosen_ids = tl.zeros((K_PAD,), dtype=tl.int32)
    chosen_logits = tl.full((K_PAD,), float("-inf"), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.argmax(row, axis=0, tie_break_left=True)
        value = tl.max(row, axis=0)
        chosen_ids = tl.where(slots == j, best, chosen_ids)
        chosen_logits = tl.where(slots == j, value, chosen_logits)
        row = tl.where(experts == best, float("-inf"), row)
    if not LOWER_WINS:
        chosen_ids = E - 1 - chosen_ids
    top = tl.max(chosen_logits, axis=0)
    numerators = tl.exp(chosen_logits - top)  # 0 for the padding slots (-inf)
    weights = numerators / tl.sum(numerators, axis=0)
    mask = slots < TOP_K
    tl.store(weights_ptr + token * TOP_K + slots, weights, mask=mask)
    tl.store(ids_ptr + token * TOP_K + slots, chosen_ids, mask=mask)


def router_topk(router_logits, topk_weights, topk_ids, top_k, lower_wins=True):
    tokens, experts = router_logits.shape
    router_topk_kernel[(tokens,)](router_logits, topk_weights, topk_ids, experts, top_k, triton.next_power_of_2(top_k), lower_wins)


def reference(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    values = logits.double()
    probs = torch.softmax(values, dim=-1)
    ids = [sorted(range(values.shape[1]), key=lambda e: (-float(row[e]), e))[:top_k] for row in values]
    ids = torch.tensor(ids)
    chosen = probs.gather(1, ids)
    return chosen / chosen.sum(-1, keepdim=True), ids.to(torch.int32)


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator().manual_seed(0)
    tokens, experts, top_k = 64, 256, 8
    logits = torch.randn(tokens, experts, generator=generator, dtype=torch.float64) * 2
    coarse = torch.randint(-3, 4, (tokens, experts), generator=generator).double() * 0.5
    logits[1::2] = coarse[1::2]  # odd rows: few distinct values, so ties straddle the top-k boundary
    failures = 0
    for dtype in (torch.float32, torch.bfloat16):
        inputs = logits.to(dtype)
        want_weights, want_ids = reference(inputs, top_k)
        weights = torch.full((tokens, top_k), float("nan"), device=device)
        ids = torch.full((tokens, top_k), -7, dtype=torch.int32, device=device)
        router_topk(inputs.to(device), weights, ids, top_k)
        ids_ok = torch.equal(ids.cpu(), want_ids)
        error = float((weights.double().cpu() - want_weights).norm() / want_weights.norm())
        ok = ids_ok and error <= 1e-5  # the moe/router-topk bounds
        failures += not ok
        print(f"{dtype}: ids {'exact' if ids_ok else 'DIFFER'}, weights relative error {error:.1e} {'ok' if ok else 'FAIL'}")
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=device)
    weights = torch.empty((tokens, top_k), device=device)
    router_topk(logits.float().to(device), weights, ids, top_k, lower_wins=False)
    differing = int((ids.cpu() != reference(logits.float(), top_k)[1]).any(-1).sum())
    caught = differing > 0
    failures += not caught
    print(f"higher-index tie-breaking: {differing} of {tokens} rows differ -> {'caught' if caught else 'NOT caught (FAIL)'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
