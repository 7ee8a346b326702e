"""Executable half of moe/token-permute: plain reference, inputs, error mutations."""

from __future__ import annotations

import torch


def make_inputs(axes, params, dtype, device, generator):
    tokens, hidden, experts, top_k = axes["T"], axes["H"], axes["E"], axes["top_k"]
    ids = torch.rand(tokens, experts, generator=generator).argsort(dim=1)[:, :top_k].to(torch.int32)
    x = torch.randn(tokens, hidden, generator=generator)
    return {"x": x.to(dtype).to(device), "topk_ids": ids.to(device)}


def reference(x, topk_ids, num_experts):
    top_k = topk_ids.shape[1]
    experts_of_copy = topk_ids.flatten().tolist()  # copy f = t * top_k + j
    source_rows, offsets = [], [0]
    for expert in range(num_experts):
        source_rows += [f for f, e in enumerate(experts_of_copy) if e == expert]
        offsets.append(len(source_rows))
    rows = torch.tensor(source_rows, dtype=torch.int64)
    return {
        "permuted_x": x[rows // top_k].clone(),
        "expert_offsets": torch.tensor(offsets, dtype=torch.int32),
        "source_rows": rows.to(torch.int32),
    }


def id_equal_to_e(inputs, params):
    ids = inputs["topk_ids"].clone()
    ids[-1, -1] = params["num_experts"]
    inputs["topk_ids"] = ids
    return inputs, params


def id_negative(inputs, params):
    ids = inputs["topk_ids"].clone()
    ids[0, 0] = -1
    inputs["topk_ids"] = ids
    return inputs, params


def ids_int64(inputs, params):
    inputs["topk_ids"] = inputs["topk_ids"].long()
    return inputs, params


def ids_fewer_tokens(inputs, params):
    inputs["topk_ids"] = inputs["topk_ids"][:-1].clone()
    return inputs, params
