"""Total-variation test of a stochastic sampler, with known-wrong samplers that it must catch.

Plain torch on the CPU. `filtered_distribution` is the exact target (float64) under the
conventions of ../SKILL.md (temperature, top-k with ties to the lower id, top-p over the
renormalised top-k set keeping the crossing token). `sample` is a correct sampler (one sort,
masks, exponential race with one generator per draw). Run: python tv_distance_check.py
"""

from __future__ import annotations

import math

import torch


def filtered_distribution(logits, temperature, top_k, top_p):
    """logits [V] -> probabilities [V] float64 of the filtered, renormalised distribution."""
    z = logits.to(torch.float64) / temperature
    vocab = z.shape[0]
    order = sorted(range(vocab), key=lambda i: (-z[i].item(), i))  # descending, ties: lower id first
    order = torch.tensor(order)
    keep = order[: top_k] if 0 < top_k < vocab else order
    probs = torch.softmax(z[keep], dim=0)
    cumulative = probs.cumsum(0)
    count = int((cumulative < top_p).sum().item()) + 1  # the crossing token is kept
    keep = keep[: min(count, keep.numel())]
    out = torch.zeros(vocab, dtype=torch.float64)
    out[keep] = torch.softmax(z[keep], dim=0)
    assert torch.isclose(out.sum(), torch.tensor(1.0, dtype=torch.float64))
    return out


def allowed_and_probs(logits, temperature, top_k, top_p, wrong=None):
    """The filtered distribution as a sampler computes it (float32 filtering), in sorted order."""
    z = logits.to(torch.float32) / (1.0 if wrong == "ignore-temperature" else temperature)
    vocab = z.shape[0]
    values, order = torch.sort(z, descending=True, stable=True)  # stable: ties keep lower id first
    allowed = torch.ones(vocab, dtype=torch.bool)
    if 0 < top_k < vocab and wrong != "top-p-first":
        allowed[top_k:] = False
    probs = torch.softmax(values.masked_fill(~allowed, -math.inf), dim=0)
    cumulative = probs.cumsum(0)
    if wrong == "drop-crossing-token":
        allowed &= cumulative < top_p
        allowed[0] = True
    else:
        allowed &= (cumulative - probs) < top_p  # mass strictly before the token is below top_p
    if wrong == "top-p-first" and 0 < top_k < vocab:
        allowed[top_k:] = False
    kept = torch.softmax(values.to(torch.float64).masked_fill(~allowed, -math.inf), dim=0)
    return kept, order


def sample(logits, temperature, top_k, top_p, seeds, wrong=None):
    """One draw per seed: exponential race with float64 noise from a per-seed generator."""
    kept, order = allowed_and_probs(logits, temperature, top_k, top_p, wrong)
    tokens = []
    for seed in seeds:
        noise = torch.empty(kept.shape[0], dtype=torch.float64)
        noise.exponential_(generator=torch.Generator().manual_seed(seed))
        tokens.append(int(order[int((kept / noise).argmax())]))
    return tokens


def tv_check(logits, temperature, top_k, top_p, draws, wrong=None):
    target = filtered_distribution(logits, temperature, top_k, top_p)
    counts = torch.zeros_like(target)
    for token in sample(logits, temperature, top_k, top_p, range(draws), wrong):
        counts[token] += 1
    empirical = counts / draws
    support = int((target > 0).sum())
    outside = float(empirical[target == 0].sum())
    tv = 0.5 * float((empirical - target).abs().sum())
    bound = 0.5 * math.sqrt(support / draws) + math.sqrt(math.log(2 / 1e-6) / (2 * draws))
    return tv, bound, outside


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, generator=generator) * 0.7
    logits[10] = logits[3]  # an exact tie
    params = dict(temperature=0.7, top_k=12, top_p=0.6)
    draws = 20000
    tv, bound, outside = tv_check(logits, draws=draws, **params)
    print(f"correct sampler: TV {tv:.4f} <= bound {bound:.4f}, mass outside the allowed set {outside}")
    assert tv <= bound and outside == 0.0
    for wrong in ("top-p-first", "drop-crossing-token", "ignore-temperature"):
        tv, bound, outside = tv_check(logits, draws=draws, wrong=wrong, **params)
        caught = tv > bound or outside > 0
        print(f"{wrong}: TV {tv:.4f} (bound {bound:.4f}), outside mass {outside:.4f} -> caught: {caught}")
        assert caught, wrong
    print("ok")


if __name__ == "__main__":
    main()
