"""Executable half of attention/gqa-prefill: float64 reference by explicit per-sequence causal masking."""

from __future__ import annotations

import torch


def random_lengths(total, count, generator):
    """`count` lengths >= 1 summing to `total`, unequal, one of them 1 when there are at least 3."""
    cuts = torch.randperm(total - 1, generator=generator)[: count - 1] + 1
    bounds = [0] + sorted(int(c) for c in cuts) + [total]
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    if count >= 3 and 1 not in lengths:
        lengths[1] += lengths[0] - 1
        lengths[0] = 1
    return lengths


def make_inputs(axes, params, dtype, device, generator):
    tokens, seqs, query_heads, kv_heads, head_dim = axes["T"], axes["B"], axes["HQ"], axes["HKV"], axes["D"]
    lengths = random_lengths(tokens, seqs, generator)
    cu_seqlens = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0).to(torch.int32)

    def rand(*shape, spread=1.0):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * spread).to(dtype).to(device)

    return {
        "query": rand(tokens, query_heads, head_dim, spread=3.0),  # peaked softmax: masking mistakes show
        "key": rand(tokens, kv_heads, head_dim),
        "value": rand(tokens, kv_heads, head_dim),
        "cu_seqlens": cu_seqlens.to(device),
    }


def reference(query, key, value, cu_seqlens, scale):
    q, k, v = query.double(), key.double(), value.double()
    tokens, query_heads, head_dim = q.shape
    group = query_heads // k.shape[1]
    out = torch.empty(tokens, query_heads, head_dim, dtype=torch.float64)
    bounds = [int(b) for b in cu_seqlens]
    for start, end in zip(bounds, bounds[1:]):
        for head in range(query_heads):
            kv_head = head // group
            for i in range(start, end):
                keys = k[start : i + 1, kv_head, :]  # only this sequence, only positions <= i
                scores = keys @ q[i, head, :] * scale
                weights = torch.exp(scores - scores.max())
                out[i, head, :] = (weights / weights.sum()) @ v[start : i + 1, kv_head, :]
    return {"out": out}


def cu_seqlens_short_total(inputs, params):
    inputs["cu_seqlens"] = inputs["cu_seqlens"].clone()
    inputs["cu_seqlens"][-1] -= 1
    return inputs, params


def cu_seqlens_decreasing(inputs, params):
    bounds = inputs["cu_seqlens"].clone()
    bounds[1], bounds[2] = bounds[2].clone(), bounds[1].clone()  # lengths >= 1, so now bounds[1] > bounds[2]
    inputs["cu_seqlens"] = bounds
    return inputs, params


def cu_seqlens_offset(inputs, params):
    bounds = inputs["cu_seqlens"].clone()
    bounds[0] = 1
    inputs["cu_seqlens"] = bounds
    return inputs, params


def key_two_heads(inputs, params):
    inputs["key"] = torch.cat([inputs["key"], inputs["key"]], dim=1)
    inputs["value"] = torch.cat([inputs["value"], inputs["value"]], dim=1)
    return inputs, params


def value_other_dtype(inputs, params):
    inputs["value"] = inputs["value"].to(torch.float16)
    return inputs, params


def key_narrow(inputs, params):
    inputs["key"] = inputs["key"][..., :-1].clone()
    inputs["value"] = inputs["value"][..., :-1].clone()
    return inputs, params
