"""Executable half of norms-and-activations/gated-rmsnorm: float64 reference, inputs, error mutations."""

from __future__ import annotations

import torch


def make_inputs(axes, params, dtype, device, generator):
    rows, width = axes["T"], axes["D"]
    row_scale = torch.rand(rows, 1, generator=generator, dtype=torch.float64) * 3 + 0.2
    x = torch.randn(rows, width, generator=generator, dtype=torch.float64) * row_scale
    z = torch.randn(rows, width, generator=generator, dtype=torch.float64) * 2
    weight = 1.0 + 0.5 * torch.randn(width, generator=generator, dtype=torch.float64)  # around ones, as initialised
    return {name: value.to(dtype).to(device) for name, value in (("x", x), ("z", z), ("weight", weight))}


def reference(x, z, weight, eps):
    x64, z64 = x.double(), z.double()
    normalised = x64 / torch.sqrt((x64 * x64).mean(dim=-1, keepdim=True) + eps)
    silu = z64 / (1.0 + torch.exp(-z64))
    return {"out": weight.double() * normalised * silu}


def z_short(inputs, params):
    inputs["z"] = inputs["z"][:-1].clone()
    return inputs, params


def z_other_dtype(inputs, params):
    inputs["z"] = inputs["z"].to(torch.float16 if inputs["x"].dtype != torch.float16 else torch.float32)
    return inputs, params


def weight_wrong_length(inputs, params):
    inputs["weight"] = torch.cat([inputs["weight"], inputs["weight"][:1]])
    return inputs, params
