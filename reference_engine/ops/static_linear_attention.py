"""Gated DeltaNet recurrent decode without `repeat_interleave` (whose integer form may read the device
to size its output): key heads are broadcast to value heads with expand + reshape, so the step is
capturable in a CUDA graph. Same function as `ops.linear_attention.gdn_recurrent_decode`.
"""

from __future__ import annotations

import torch

from reference_engine.ops.linear_attention import L2_EPS, _check_out, _check_qkv
from reference_engine.ops.registry import satisfies


def _expand_heads(x: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    """[B, Hk, D] -> [B, Hv, D] with key head i serving value heads i*G .. i*G + G - 1 (G = Hv / Hk)."""
    batch, num_k_heads, dim = x.shape
    group = num_v_heads // num_k_heads
    return x[:, :, None, :].expand(batch, num_k_heads, group, dim).reshape(batch, num_v_heads, dim)


@satisfies("linear-attention/gdn-recurrent-decode", major=1)
def gdn_recurrent_decode(
    query: torch.Tensor,  # [B, Hk, Dk]
    key: torch.Tensor,  # [B, Hk, Dk]
    value: torch.Tensor,  # [B, Hv, Dv]
    g: torch.Tensor,  # [B, Hv] float32
    beta: torch.Tensor,  # [B, Hv] float32
    state: torch.Tensor,  # [B, Hv, Dk, Dv] float32
    out: torch.Tensor,  # [B, Hv, Dv]
    state_out: torch.Tensor,  # [B, Hv, Dk, Dv] float32
) -> None:
    """One token per sequence: S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; out = S^T q."""
    batch, _, k_dim, num_v_heads, v_dim = _check_qkv(query, key, value, g, beta)
    _check_out(state, (batch, num_v_heads, k_dim, v_dim), torch.float32, "state")
    _check_out(state_out, (batch, num_v_heads, k_dim, v_dim), torch.float32, "state_out")
    _check_out(out, (batch, num_v_heads, v_dim), value.dtype, "out")
    q, k = query.float(), key.float()
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + L2_EPS) * (k_dim**-0.5)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + L2_EPS)
    q, k = _expand_heads(q, num_v_heads), _expand_heads(k, num_v_heads)  # [B, Hv, Dk]
    decayed = state * torch.exp(g)[:, :, None, None]  # [B, Hv, Dk, Dv]
    predicted = torch.einsum("bhkv,bhk->bhv", decayed, k)  # [B, Hv, Dv]
    delta = beta[:, :, None] * (value.float() - predicted)
    new_state = decayed + k[:, :, :, None] * delta[:, :, None, :]
    result = torch.einsum("bhkv,bhk->bhv", new_state, q)
    state_out.copy_(new_state)
    out.copy_(result)
