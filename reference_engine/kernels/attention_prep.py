"""Decode-step preparation of gated attention in one launch, Triton: q/k RMSNorm, partial RoPE, K/V cache write.

Grid (T, Hq + Hkv). Program (t, h) for h < Hq reads query head h from the `q_proj` output (the first D
of its 2D columns; the gate half stays where it is for the attention epilogue), applies the
zero-centred RMSNorm `x * rsqrt(mean(x^2) + eps) * (1 + q_norm)` and the half-split rotary embedding of
the first `rotary_dim` dims, and writes `query_out[t, h]`. Program (t, Hq + j) does the same to key head j
with `k_norm` and writes it, with value head j unchanged, into the paged caches at `slot_mapping[t]`.
All arithmetic is float32 and each output is rounded once (the torch composition rounds after the norm
and again after the rotation; the two agree to bf16 rounding). Rotation angles `position * inv_freq` are
formed and reduced modulo 2 pi in float64, so large positions keep their accuracy, then cos/sin run in
float32. Padding rows of a CUDA-graph bucket all write the runner's scratch slot (races there are harmless).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_engine.kernels import pdl
from reference_engine.kernels.launch import (
    finish,
    next_power_of_2,
    require_launchable,
    staging_buffer,
)
from reference_engine.ops.registry import satisfies
from reference_engine.ops.static_attention import check_attention_decode_prep

_INV_FREQ: dict[tuple[str, int, float], torch.Tensor] = {}


def inverse_frequencies(device: torch.device, rotary_dim: int, theta: float) -> torch.Tensor:
    """1 / theta^(2i / rotary_dim), float64 [rotary_dim / 2], made once per device (before any graph capture)."""
    key = (str(device), rotary_dim, float(theta))
    if key not in _INV_FREQ:
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
        _INV_FREQ[key] = (1.0 / (theta**exponents)).to(device)
    return _INV_FREQ[key]


@triton.jit
def _attention_prep_kernel(
    q_gate_ptr, key_ptr, value_ptr, q_norm_ptr, k_norm_ptr, positions_ptr, inv_freq_ptr,
    k_cache_ptr, v_cache_ptr, slots_ptr, query_out_ptr,
    stride_qg, stride_k, stride_v, eps,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, ROTARY: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = 0,
):
    pdl.pdl_wait(PDL)
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < D
    HALF: tl.constexpr = ROTARY // 2
    partner = tl.where(dims < HALF, dims + HALF, dims - HALF)  # rotation pairs (i, i + R/2)
    partner = tl.where(dims < ROTARY, partner, dims)
    is_query = head < HQ
    if is_query:
        source = q_gate_ptr + token * stride_qg + head * (2 * D)
        norm_ptr = q_norm_ptr
    else:
        source = key_ptr + token * stride_k + (head - HQ) * D
        norm_ptr = k_norm_ptr
    x = tl.load(source + dims, mask=dim_ok, other=0.0).to(tl.float32)
    x_partner = tl.load(source + partner, mask=dim_ok, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    normed = x * inv_rms * (1.0 + tl.load(norm_ptr + dims, mask=dim_ok, other=0.0).to(tl.float32))
    normed_partner = x_partner * inv_rms * (1.0 + tl.load(norm_ptr + partner, mask=dim_ok, other=0.0).to(tl.float32))
    position = tl.load(positions_ptr + token).to(tl.float64)
    frequency = tl.load(inv_freq_ptr + (dims % HALF), mask=dims < ROTARY, other=0.0)  # float64
    angle = position * frequency
    two_pi = tl.full((), 6.283185307179586, tl.float64)  # a float64 constant (a bare literal would be float32)
    angle = (angle - two_pi * tl.floor(angle / two_pi)).to(tl.float32)
    cos, sin = tl.cos(angle), tl.sin(angle)
    rotated = tl.where(dims < HALF, normed * cos - normed_partner * sin, normed * cos + normed_partner * sin)
    result = tl.where(dims < ROTARY, rotated, normed)
    pdl.pdl_release(PDL)
    if is_query:
        tl.store(query_out_ptr + (token * HQ + head) * D + dims, result.to(query_out_ptr.dtype.element_ty), mask=dim_ok)
    else:
        kv_head = head - HQ
        row = (tl.load(slots_ptr + token) * HKV + kv_head) * D  # [num_blocks * block_size, Hkv, D] flat
        tl.store(k_cache_ptr + row + dims, result.to(k_cache_ptr.dtype.element_ty), mask=dim_ok)
        value = tl.load(value_ptr + token * stride_v + kv_head * D + dims, mask=dim_ok, other=0.0)
        tl.store(v_cache_ptr + row + dims, value.to(v_cache_ptr.dtype.element_ty), mask=dim_ok)


@satisfies("attention/decode-prep", major=1, devices=("cuda",), backend="triton")
def attention_decode_prep(
    q_gate: torch.Tensor,  # [T, Hq * 2D] (rows may be strided: a view of a stacked projection)
    key: torch.Tensor,  # [T, Hkv * D]
    value: torch.Tensor,  # [T, Hkv * D]
    q_norm: torch.Tensor,  # [D]
    k_norm: torch.Tensor,  # [D]
    positions: torch.Tensor,  # [T] int64
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], written at slot_mapping
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64, every entry a valid slot
    query_out: torch.Tensor,  # [T, Hq, D]
    eps: float,
    rotary_dim: int,
    theta: float,
) -> torch.Tensor:
    """The signature of `ops.static_attention.attention_decode_prep`, in one launch."""
    tokens, heads, head_dim = check_attention_decode_prep(
        q_gate, key, value, q_norm, k_norm, positions, k_cache, v_cache, slot_mapping, query_out, eps, rotary_dim
    )
    require_launchable(q_gate, key, value, q_norm, k_norm, positions, k_cache, v_cache, slot_mapping, query_out)
    if tokens == 0:
        return query_out
    kv_heads = k_cache.shape[2]
    buffer = staging_buffer(query_out)
    target = buffer if buffer.is_contiguous() else torch.empty(buffer.shape, dtype=buffer.dtype, device=buffer.device)
    k_target = staging_buffer(k_cache)
    v_target = staging_buffer(v_cache)
    if k_target is not k_cache:  # interpreter: round through float32 copies of the caches
        k_target.copy_(k_cache)
        v_target.copy_(v_cache)
    _attention_prep_kernel[(tokens, heads + kv_heads)](
        q_gate, key, value, q_norm, k_norm, positions, inverse_frequencies(q_gate.device, rotary_dim, theta),
        k_target, v_target, slot_mapping, target,
        q_gate.stride(0), key.stride(0), value.stride(0), float(eps),
        HQ=heads, HKV=kv_heads, D=head_dim, ROTARY=rotary_dim, BLOCK_D=next_power_of_2(head_dim), **pdl.launch_args(),
    )
    if target is not buffer:
        buffer.copy_(target)
    finish(buffer, query_out)
    finish(k_target, k_cache)
    finish(v_target, v_cache)
    return query_out

