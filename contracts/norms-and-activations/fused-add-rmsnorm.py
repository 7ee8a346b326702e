"""Executable half of norms-and-activations/fused-add-rmsnorm: float64 reference, inputs, error mutations."""

from __future__ import annotations

import torch


def make_inputs(axes, params, dtype, device, generator):
    tokens, width = axes["T"], axes["D"]
    x = torch.randn(tokens, width, generator=generator, dtype=torch.float64)
    residual = torch.randn(tokens, width, generator=generator, dtype=torch.float64) * 3 + 0.5
    weight = torch.randn(width, generator=generator, dtype=torch.float64) * 0.5
    return {name: value.to(dtype).to(device) for name, value in (("x", x), ("residual", residual), ("weight", weight))}


def reference(x, residual, weight, eps):
    total = x.double() + residual.double()
    # transformers adds in the model dtype: the norm sees the sum rounded once to the input dtype
    seen = total.to(x.dtype).double()
    out = seen / torch.sqrt((seen * seen).mean(dim=-1, keepdim=True) + eps) * (1.0 + weight.double())
    return {"out": out, "residual_out": total}


def residual_short(inputs, params):
    inputs["residual"] = inputs["residual"][:-1].clone()
    return inputs, params


def residual_other_dtype(inputs, params):
    inputs["residual"] = inputs["residual"].to(torch.float16)
    return inputs, params


def weight_wrong_length(inputs, params):
    inputs["weight"] = inputs["weight"][1:].clone()
    return inputs, params
