"""Executable half of moe/router-topk: float64 reference, inputs with deliberate ties, error mutations."""

from __future__ import annotations

import torch


def make_inputs(axes, params, dtype, device, generator):
    tokens, experts = axes["T"], axes["E"]
    logits = torch.randn(tokens, experts, generator=generator, dtype=torch.float64) * 2
    # Odd rows: a coarse grid of a few values, so equal logits straddle the top-k boundary.
    coarse = torch.randint(-3, 4, (tokens, experts), generator=generator).double() * 0.5
    logits[1::2] = coarse[1::2]
    return {"router_logits": logits.to(dtype).to(device)}


def reference(router_logits, top_k):
    logits = router_logits.double()
    probs = torch.softmax(logits, dim=-1)
    weights, ids = [], []
    for row_logits, row_probs in zip(logits.tolist(), probs):
        # Decreasing logit; among equal logits the lower index first.
        order = sorted(range(len(row_logits)), key=lambda e: (-row_logits[e], e))[:top_k]
        chosen = row_probs[order]
        weights.append(chosen / chosen.sum())
        ids.append(order)
    return {"topk_weights": torch.stack(weights), "topk_ids": torch.tensor(ids, dtype=torch.int32)}


def top_k_past_e(inputs, params):
    return inputs, {**params, "top_k": inputs["router_logits"].shape[1] + 1}


def top_k_zero(inputs, params):
    return inputs, {**params, "top_k": 0}


def top_k_three(inputs, params):
    return inputs, {**params, "top_k": 3}


def logits_flat(inputs, params):
    inputs["router_logits"] = inputs["router_logits"][0].clone()
    return inputs, params
