"""Executable half of linear-attention/gdn-gates: float64 reference, inputs, error mutations."""

from __future__ import annotations

import math

import torch


def make_inputs(axes, params, dtype, device, generator):
    tokens, heads = axes["T"], axes["Hv"]
    a = torch.randn(tokens, heads, generator=generator, dtype=torch.float64) * 2
    b = torch.randn(tokens, heads, generator=generator, dtype=torch.float64) * 2
    rate = torch.rand(heads, generator=generator, dtype=torch.float64) * 15.5 + 0.5  # A in [0.5, 16)
    dt_bias = torch.randn(heads, generator=generator, dtype=torch.float64) * 0.5
    return {
        "a": a.to(dtype).to(device),
        "b": b.to(dtype).to(device),
        "A_log": rate.log().float().to(device),
        "dt_bias": dt_bias.float().to(device),
    }


def reference(a, b, A_log, dt_bias):
    shifted = a.double() + dt_bias.double()
    softplus = torch.tensor([[math.log1p(math.exp(v)) for v in row] for row in shifted.tolist()], dtype=torch.float64)
    g = -torch.exp(A_log.double()) * softplus
    beta = 1.0 / (1.0 + torch.exp(-b.double()))
    return {"g": g.reshape(a.shape), "beta": beta}


def b_fewer_tokens(inputs, params):
    inputs["b"] = inputs["b"][:-1].clone()
    return inputs, params


def b_other_dtype(inputs, params):
    inputs["b"] = inputs["b"].to(torch.float16)
    return inputs, params


def a_log_short(inputs, params):
    inputs["A_log"] = inputs["A_log"][:-1].clone()
    return inputs, params


def dt_bias_long(inputs, params):
    inputs["dt_bias"] = torch.cat([inputs["dt_bias"], inputs["dt_bias"][:1]])
    return inputs, params
