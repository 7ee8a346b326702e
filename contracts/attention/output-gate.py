"""Executable half of attention/output-gate: float64 reference, inputs, error mutations."""

from __future__ import annotations

import torch


def make_inputs(axes, params, dtype, device, generator):
    width = axes["H"] * axes["D"]
    attn = torch.randn(axes["T"], width, generator=generator, dtype=torch.float64)
    gate = torch.randn(axes["T"], width, generator=generator, dtype=torch.float64) * 3
    return {"attn": attn.to(dtype).to(device), "gate": gate.to(dtype).to(device)}


def reference(attn, gate):
    return {"out": attn.double() / (1.0 + torch.exp(-gate.double()))}


def gate_short(inputs, params):
    inputs["gate"] = inputs["gate"][:-1].clone()
    return inputs, params


def gate_other_dtype(inputs, params):
    inputs["gate"] = inputs["gate"].to(torch.float16)
    return inputs, params
