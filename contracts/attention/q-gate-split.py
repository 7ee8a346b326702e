"""Executable half of attention/q-gate-split: reference by explicit per-head column ranges."""

from __future__ import annotations

import torch


def make_inputs(axes, params, dtype, device, generator):
    tokens, heads, head_dim = axes["T"], axes["H"], axes["D"]
    q_proj_out = torch.randn(tokens, heads * 2 * head_dim, generator=generator, dtype=torch.float64)
    return {"q_proj_out": q_proj_out.to(dtype).to(device)}


def reference(q_proj_out, head_dim):
    tokens, width = q_proj_out.shape
    heads = width // (2 * head_dim)
    query = torch.empty(tokens, heads, head_dim, dtype=q_proj_out.dtype)
    gate = torch.empty(tokens, heads * head_dim, dtype=q_proj_out.dtype)
    for head in range(heads):
        first = head * 2 * head_dim
        query[:, head, :] = q_proj_out[:, first : first + head_dim]
        gate[:, head * head_dim : (head + 1) * head_dim] = q_proj_out[:, first + head_dim : first + 2 * head_dim]
    return {"query": query, "gate": gate}


def narrow_input(inputs, params):
    inputs["q_proj_out"] = inputs["q_proj_out"][:, :-2].clone()
    return inputs, params


def other_dtype(inputs, params):
    inputs["q_proj_out"] = inputs["q_proj_out"].to(torch.float16 if inputs["q_proj_out"].dtype != torch.float16 else torch.float32)
    return inputs, params


def unchanged(inputs, params):
    return inputs, params
