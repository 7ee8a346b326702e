"""Executable half of norms-and-activations/rmsnorm: float64 reference, inputs, error mutations."""

from __future__ import annotations

import torch


def make_inputs(axes, params, dtype, device, generator):
    tokens, width = axes["T"], axes["D"]
    row_scale = torch.rand(tokens, 1, generator=generator, dtype=torch.float64) * 4 + 0.25  # rows of unequal size
    x = torch.randn(tokens, width, generator=generator, dtype=torch.float64) * row_scale + 0.1
    weight = torch.randn(width, generator=generator, dtype=torch.float64) * 0.5  # zero-centred: scale is 1 + weight
    return {"x": x.to(dtype).to(device), "weight": weight.to(dtype).to(device)}


def reference(x, weight, eps):
    x64 = x.double()
    inverse_rms = 1.0 / torch.sqrt((x64 * x64).mean(dim=-1, keepdim=True) + eps)
    return {"out": x64 * inverse_rms * (1.0 + weight.double())}


def weight_wrong_length(inputs, params):
    inputs["weight"] = inputs["weight"][:-1].clone()
    return inputs, params


def weight_two_dims(inputs, params):
    inputs["weight"] = inputs["weight"].reshape(1, -1).clone()
    return inputs, params


def integer_x(inputs, params):
    inputs["x"] = (inputs["x"] * 10).to(torch.int32)
    return inputs, params


def eps_negative(inputs, params):
    params["eps"] = -1e-6
    return inputs, params
