"""Executable half of moe/token-unpermute: float64 reference, inputs, error mutations."""

from __future__ import annotations

import torch


def make_inputs(axes, params, dtype, device, generator):
    tokens, hidden, top_k = axes["T"], axes["H"], axes["top_k"]
    expert_out = torch.randn(tokens * top_k, hidden, generator=generator)
    source_rows = torch.randperm(tokens * top_k, generator=generator).to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=generator, dtype=torch.float64), dim=1)
    return {
        "expert_out": expert_out.to(dtype).to(device),
        "source_rows": source_rows.to(device),
        "topk_weights": weights.float().to(device),
    }


def reference(expert_out, source_rows, topk_weights):
    tokens, top_k = topk_weights.shape
    out = torch.zeros(tokens, expert_out.shape[1], dtype=torch.float64)
    for row, flat in enumerate(source_rows.tolist()):
        token, slot = divmod(flat, top_k)
        out[token] += float(topk_weights[token, slot]) * expert_out[row].double()
    return {"out": out}


def expert_out_short(inputs, params):
    inputs["expert_out"] = inputs["expert_out"][:-1].clone()
    return inputs, params


def source_rows_int64(inputs, params):
    inputs["source_rows"] = inputs["source_rows"].long()
    return inputs, params


def source_rows_short(inputs, params):
    inputs["source_rows"] = inputs["source_rows"][:-1].clone()
    return inputs, params


def weights_bf16(inputs, params):
    inputs["topk_weights"] = inputs["topk_weights"].to(torch.bfloat16)
    return inputs, params
