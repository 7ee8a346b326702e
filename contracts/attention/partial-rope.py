"""Executable half of attention/partial-rope: float64 reference by explicit pairs, inputs, error mutations."""

from __future__ import annotations

import torch


def make_inputs(axes, params, dtype, device, generator):
    tokens, heads, head_dim = axes["T"], axes["H"], axes["D"]
    x = torch.randn(tokens, heads, head_dim, generator=generator, dtype=torch.float64)
    if dtype == torch.float32:
        high = 8192  # float32 cases: angles formed in float32 stay within the float32 bound
    else:
        high = 262144  # max_position_embeddings
    positions = torch.randint(0, high, (tokens,), generator=generator, dtype=torch.int64)
    return {"x": x.to(dtype).to(device), "positions": positions.to(device)}


def reference(x, positions, rotary_dim, theta):
    x64 = x.double()
    out = x64.clone()
    half = rotary_dim // 2
    for i in range(half):
        inverse_frequency = float(theta) ** (-(2.0 * i) / rotary_dim)
        angle = positions.double() * inverse_frequency  # [T]
        cos, sin = torch.cos(angle)[:, None], torch.sin(angle)[:, None]
        a, b = x64[:, :, i], x64[:, :, i + half]
        out[:, :, i] = a * cos - b * sin
        out[:, :, i + half] = b * cos + a * sin
    return {"out": out}


def unchanged(inputs, params):
    return inputs, params


def positions_short(inputs, params):
    inputs["positions"] = inputs["positions"][:-1].clone()
    return inputs, params


def positions_float(inputs, params):
    inputs["positions"] = inputs["positions"].double()
    return inputs, params


def x_flat(inputs, params):
    inputs["x"] = inputs["x"].flatten(1).clone()
    return inputs, params
