"""Fused Gated DeltaNet recurrent decode step (contract linear-attention/gdn-recurrent-decode), Triton.

Grid (B, Hv, cdiv(Dv, BLOCK_V)): the program for (sequence b, value head h, columns c) loads the
raw query and key of key head h // (Hv / Hk), L2-normalises both in float32
(x * rsqrt(sum(x^2) + 1e-6)) and scales the query by Dk^-0.5, then loads its [Dk, BLOCK_V] slice
of the float32 state and, in registers:
    S <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  out = S^T q
and writes the slice back and its BLOCK_V outputs. Each program reads and writes only its own
slice, so `state_out` may be `state` (in-place update of the sequence's slot). The step moves the
whole state twice (2 MiB per sequence per layer at the real shape): memory-bound.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_engine.kernels.launch import (
    cdiv,
    finish,
    next_power_of_2,
    require_launchable,
    staging_buffer,
)
from reference_engine.ops.linear_attention import _check_out, _check_qkv
from reference_engine.ops.registry import satisfies

L2_EPS = 1e-6


@triton.jit
def _gdn_decode_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, out_ptr, state_out_ptr, q_scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, EPS: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    cols = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)  # value columns [BV]
    dims = tl.arange(0, BLOCK_K)  # key dims [BK]
    k_ok = dims < DK
    v_ok = cols < DV
    key_head = head // (HV // HK)
    qk_offset = (seq * HK + key_head) * DK + dims
    q = tl.load(q_ptr + qk_offset, mask=k_ok, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + qk_offset, mask=k_ok, other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + EPS) * q_scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + EPS)
    vh = seq * HV + head  # flat (sequence, value head)
    v = tl.load(v_ptr + vh * DV + cols, mask=v_ok, other=0.0).to(tl.float32)  # [BV]
    decay = tl.exp(tl.load(g_ptr + vh))
    beta = tl.load(beta_ptr + vh)
    offsets = vh * DK * DV + dims[:, None] * DV + cols[None, :]  # [BK, BV]
    mask = k_ok[:, None] & v_ok[None, :]
    s = tl.load(state_ptr + offsets, mask=mask, other=0.0) * decay
    delta = beta * (v - tl.sum(s * k[:, None], axis=0))  # [BV]
    s = s + k[:, None] * delta[None, :]
    o = tl.sum(s * q[:, None], axis=0)  # [BV]
    tl.store(state_out_ptr + offsets, s, mask=mask)
    tl.store(out_ptr + vh * DV + cols, o.to(out_ptr.dtype.element_ty), mask=v_ok)


@satisfies("linear-attention/gdn-recurrent-decode", major=1, devices=("cuda",), backend="triton")
def gdn_recurrent_decode(
    query: torch.Tensor,  # [B, Hk, Dk]
    key: torch.Tensor,  # [B, Hk, Dk]
    value: torch.Tensor,  # [B, Hv, Dv]
    g: torch.Tensor,  # [B, Hv] float32
    beta: torch.Tensor,  # [B, Hv] float32
    state: torch.Tensor,  # [B, Hv, Dk, Dv] float32
    out: torch.Tensor,  # [B, Hv, Dv]
    state_out: torch.Tensor,  # [B, Hv, Dk, Dv] float32 (may be `state`)
) -> None:
    """One token per sequence: S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; out = S^T q."""
    batch, num_k_heads, k_dim, num_v_heads, v_dim = _check_qkv(query, key, value, g, beta)
    _check_out(state, (batch, num_v_heads, k_dim, v_dim), torch.float32, "state")
    _check_out(state_out, (batch, num_v_heads, k_dim, v_dim), torch.float32, "state_out")
    _check_out(out, (batch, num_v_heads, v_dim), value.dtype, "out")
    require_launchable(query, key, value, g, beta, state, out, state_out)
    if batch == 0:
        return
    source = state if state.is_contiguous() else state.contiguous()
    target = state_out if state_out.is_contiguous() else torch.empty_like(state_out, memory_format=torch.contiguous_format)
    buffer = staging_buffer(out)
    result = buffer if buffer.is_contiguous() else torch.empty(buffer.shape, dtype=buffer.dtype, device=buffer.device)
    block_v = min(32, next_power_of_2(v_dim))
    _gdn_decode_kernel[(batch, num_v_heads, cdiv(v_dim, block_v))](
        query.contiguous(), key.contiguous(), value.contiguous(), g.contiguous(), beta.contiguous(), source, result, target, float(k_dim**-0.5),
        HK=num_k_heads, HV=num_v_heads, DK=k_dim, DV=v_dim, BLOCK_K=next_power_of_2(k_dim), BLOCK_V=block_v, EPS=L2_EPS,
    )
    if target is not state_out:
        state_out.copy_(target)
    if result is not buffer:
        buffer.copy_(result)
    finish(buffer, out)
