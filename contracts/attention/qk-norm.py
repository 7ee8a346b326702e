"""Executable half of attention/qk-norm: float64 per-head reference, inputs, error mutations."""

from __future__ import annotations

import torch


def make_inputs(axes, params, dtype, device, generator):
    tokens, heads, head_dim = axes["T"], axes["H"], axes["D"]
    head_scale = torch.rand(tokens, heads, 1, generator=generator, dtype=torch.float64) * 4 + 0.25  # heads of unequal size
    x = torch.randn(tokens, heads, head_dim, generator=generator, dtype=torch.float64) * head_scale
    weight = torch.randn(head_dim, generator=generator, dtype=torch.float64) * 0.5
    return {"x": x.to(dtype).to(device), "weight": weight.to(dtype).to(device)}


def reference(x, weight, eps):
    x64 = x.double()
    out = torch.empty_like(x64)
    for head in range(x64.shape[1]):
        rows = x64[:, head, :]  # [T, D]
        out[:, head, :] = rows / torch.sqrt((rows * rows).mean(dim=-1, keepdim=True) + eps) * (1.0 + weight.double())
    return {"out": out}


def weight_full_width(inputs, params):
    inputs["weight"] = inputs["weight"].repeat(inputs["x"].shape[1])
    return inputs, params


def integer_x(inputs, params):
    inputs["x"] = (inputs["x"] * 8).to(torch.int16)
    return inputs, params
