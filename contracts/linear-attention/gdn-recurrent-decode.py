"""Executable half of linear-attention/gdn-recurrent-decode: float64 one-step reference, inputs, mutations."""

from __future__ import annotations

import torch

L2_EPS = 1e-6


def make_inputs(axes, params, dtype, device, generator):
    batch, k_heads, v_heads, k_dim, v_dim = axes["B"], axes["Hk"], axes["Hv"], axes["Dk"], axes["Dv"]
    query = torch.randn(batch, k_heads, k_dim, generator=generator, dtype=torch.float64) * 1.5
    key = torch.randn(batch, k_heads, k_dim, generator=generator, dtype=torch.float64) * 1.5
    value = torch.randn(batch, v_heads, v_dim, generator=generator, dtype=torch.float64)
    rate = torch.rand(batch, v_heads, generator=generator, dtype=torch.float64) * 0.6 + 0.005
    beta = torch.sigmoid(torch.randn(batch, v_heads, generator=generator, dtype=torch.float64) * 1.5)
    state = torch.randn(batch, v_heads, k_dim, v_dim, generator=generator, dtype=torch.float64) * 0.5
    return {
        "query": query.to(dtype).to(device),
        "key": key.to(dtype).to(device),
        "value": value.to(dtype).to(device),
        "g": (-rate).float().to(device),
        "beta": beta.float().to(device),
        "state": state.float().to(device),
    }


def normalised_heads(x: torch.Tensor, v_heads: int) -> torch.Tensor:
    """[B, Hk, D] -> L2-normalised float64 [B, Hv, D]; key head i serves value heads i*G .. i*G+G-1."""
    x = x.double()
    x = x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)
    return x.repeat_interleave(v_heads // x.shape[1], dim=1)


def reference(query, key, value, g, beta, state):
    v_heads = value.shape[1]
    q = normalised_heads(query, v_heads) * query.shape[-1] ** -0.5  # [B, Hv, Dk]
    k = normalised_heads(key, v_heads)
    s = state.double() * torch.exp(g.double())[:, :, None, None]  # decay first
    predicted = (k[:, :, None, :] @ s)[:, :, 0]  # S^T k: [B, Hv, Dv]
    delta = beta.double()[:, :, None] * (value.double() - predicted)
    s = s + k[:, :, :, None] * delta[:, :, None, :]
    out = (q[:, :, None, :] @ s)[:, :, 0]
    return {"out": out, "state_out": s}


def three_value_heads(inputs, params):
    for name in ("value", "g", "beta", "state"):
        inputs[name] = inputs[name][:, :3].clone()
    return inputs, params


def state_fewer_sequences(inputs, params):
    inputs["state"] = inputs["state"][:-1].clone()
    return inputs, params


def state_bf16(inputs, params):
    inputs["state"] = inputs["state"].to(torch.bfloat16)
    return inputs, params


def value_extra_sequence(inputs, params):
    inputs["value"] = torch.cat([inputs["value"], inputs["value"][:1]])
    return inputs, params


def beta_per_key_head(inputs, params):
    inputs["beta"] = inputs["beta"][:, : inputs["query"].shape[1]].clone()
    return inputs, params
