"""Executable half of moe/shared-expert: float64 reference, inputs, error mutations."""

from __future__ import annotations

import torch


def make_inputs(axes, params, dtype, device, generator):
    tokens, hidden, inter = axes["T"], axes["H"], axes["I"]

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * scale).to(dtype).to(device)

    return {
        "x": randn(tokens, hidden),
        "gate_proj": randn(inter, hidden, scale=1.5 * hidden**-0.5),
        "up_proj": randn(inter, hidden, scale=1.5 * hidden**-0.5),
        "down_proj": randn(hidden, inter, scale=inter**-0.5),
        "gate_weight": randn(1, hidden, scale=2 * hidden**-0.5),
    }


def reference(x, gate_proj, up_proj, down_proj, gate_weight):
    x64 = x.double()
    gate = x64 @ gate_proj.double().T
    up = x64 @ up_proj.double().T
    hidden = (gate * torch.sigmoid(gate) * up) @ down_proj.double().T
    scale = torch.sigmoid(x64 @ gate_weight.double().T)  # [T, 1]
    return {"out": scale * hidden}


def x_narrow(inputs, params):
    inputs["x"] = inputs["x"][:, :-1].clone()
    return inputs, params


def gate_weight_flat(inputs, params):
    inputs["gate_weight"] = inputs["gate_weight"][0].clone()
    return inputs, params


def down_proj_transposed(inputs, params):
    inputs["down_proj"] = inputs["down_proj"].T.contiguous()
    return inputs, params


def up_proj_other_dtype(inputs, params):
    inputs["up_proj"] = inputs["up_proj"].to(torch.float16)
    return inputs, params
