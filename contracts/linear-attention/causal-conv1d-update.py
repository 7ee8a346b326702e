"""Executable half of linear-attention/causal-conv1d-update: float64 reference, inputs, error mutations."""

from __future__ import annotations

import torch


def make_inputs(axes, params, dtype, device, generator):
    batch, channels, kernel = axes["B"], axes["C"], axes["K"]
    x = torch.randn(batch, channels, generator=generator, dtype=torch.float64)
    weight = torch.randn(channels, kernel, generator=generator, dtype=torch.float64) * 0.6
    state = torch.randn(batch, channels, kernel - 1, generator=generator, dtype=torch.float64)
    return {name: value.to(dtype).to(device) for name, value in (("x", x), ("weight", weight), ("conv_state", state))}


def reference(x, weight, conv_state):
    window = torch.cat([conv_state.double(), x.double()[:, :, None]], dim=2)  # [B, C, K], oldest first
    pre = (window * weight.double()[None]).sum(dim=2)
    return {"out": pre * torch.sigmoid(pre), "conv_state_out": window[:, :, 1:].to(conv_state.dtype)}


def state_fewer_sequences(inputs, params):
    inputs["conv_state"] = inputs["conv_state"][:-1].clone()
    return inputs, params


def state_too_wide(inputs, params):
    state = inputs["conv_state"]
    inputs["conv_state"] = torch.cat([state, state[:, :, :1]], dim=2)
    return inputs, params


def weight_other_dtype(inputs, params):
    inputs["weight"] = inputs["weight"].to(torch.float16)
    return inputs, params


def x_with_time_axis(inputs, params):
    inputs["x"] = inputs["x"][:, :, None].clone()
    return inputs, params
