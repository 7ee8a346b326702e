"""Executable half of moe/routed-experts: float64 reference, inputs, error mutations."""

from __future__ import annotations

import torch


def random_routing(tokens: int, experts: int, top_k: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct expert ids per token and positive weights summing to 1 (float32)."""
    ids = torch.rand(tokens, experts, generator=generator).argsort(dim=1)[:, :top_k].to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=generator, dtype=torch.float64), dim=1)
    return weights.float(), ids


def make_inputs(axes, params, dtype, device, generator):
    tokens, hidden, inter, experts, top_k = axes["T"], axes["H"], axes["I"], axes["E"], axes["top_k"]
    weights, ids = random_routing(tokens, experts, top_k, generator)
    x = torch.randn(tokens, hidden, generator=generator, dtype=torch.float64)
    # float32 draws: the weights are the bulk of the data and are rounded to `dtype` anyway.
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=generator) * (1.5 * hidden**-0.5)
    down = torch.randn(experts, hidden, inter, generator=generator) * inter**-0.5
    return {
        "x": x.to(dtype).to(device),
        "topk_weights": weights.to(device),
        "topk_ids": ids.to(device),
        "gate_up_proj": gate_up.to(dtype).to(device),
        "down_proj": down.to(dtype).to(device),
    }


def reference(x, topk_weights, topk_ids, gate_up_proj, down_proj):
    inter = down_proj.shape[2]
    x64 = x.double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for expert in sorted(set(topk_ids.flatten().tolist())):
        token_index, slot = (topk_ids == expert).nonzero(as_tuple=True)
        w = gate_up_proj[expert].double()
        gate = x64[token_index] @ w[:inter].T
        up = x64[token_index] @ w[inter:].T
        y = (gate * torch.sigmoid(gate) * up) @ down_proj[expert].double().T  # [n, H]
        out.index_add_(0, token_index, topk_weights[token_index, slot].double()[:, None] * y)
    return {"out": out}


def id_equal_to_e(inputs, params):
    ids = inputs["topk_ids"].clone()
    ids[-1, -1] = inputs["gate_up_proj"].shape[0]
    inputs["topk_ids"] = ids
    return inputs, params


def ids_int64(inputs, params):
    inputs["topk_ids"] = inputs["topk_ids"].long()
    return inputs, params


def weights_one_slot(inputs, params):
    inputs["topk_weights"] = inputs["topk_weights"][:, :1].clone()
    return inputs, params


def gate_up_short(inputs, params):
    inputs["gate_up_proj"] = inputs["gate_up_proj"][:, :-2].clone()
    return inputs, params


def down_other_dtype(inputs, params):
    inputs["down_proj"] = inputs["down_proj"].to(torch.float16)
    return inputs, params
