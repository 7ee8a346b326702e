"""Gated DeltaNet gates in one launch (contract linear-attention/gdn-gates), Triton.

    g = -exp(A_log) * softplus(a + dt_bias),   beta = sigmoid(b)        (float32, per token and value head)

The torch op `ops.linear_attention.gdn_gates` runs this as seven elementwise launches on a GPU (two casting
copies of the strided a and b views, add, softplus, exp, mul, sigmoid); at 1024 prefill tokens each costs a few
microseconds plus a launch gap, thirty layers deep. Here one program takes BLOCK_T tokens x all heads. a and b
may be strided views (the columns of the stacked in_proj_ba output): any row stride, unit column stride.

`valid_tokens` (optional, a device tensor holding one count V): rows V.. get g = 0 and beta = 0 (a CUDA-graph
prefill's padding rows, which must leave the recurrent state as the prompt left it: decay exp(0) = 1, nothing
written), read on the device so one captured graph serves every prompt length of its bucket.

softplus follows torch (threshold 20: x itself above it); exp and log1p through libdevice on the GPU (the
interpreter has no libdevice), sigmoid as 1 / (1 + exp(-b)) with an IEEE division.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from reference_engine.kernels.launch import (
    cdiv,
    interpreting,
    next_power_of_2,
    require_launchable,
)
from reference_engine.ops.linear_attention import check_gdn_gates
from reference_engine.ops.registry import satisfies

BLOCK_T = 32  # tokens per program
SOFTPLUS_THRESHOLD = tl.constexpr(20.0)  # torch's default: softplus(x) = x above it


@triton.jit
def _exp(x, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        return libdevice.exp(x)
    return tl.exp(x)


@triton.jit
def _gdn_gates_kernel(
    a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, valid_ptr, T, stride_a, stride_b,
    HV: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, HAS_VALID: tl.constexpr, LIBDEVICE: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    heads = tl.arange(0, BLOCK_H)  # [BH]
    row_ok = rows < T
    head_ok = heads < HV
    mask = row_ok[:, None] & head_ok[None, :]
    rows64 = rows.to(tl.int64)
    a = tl.load(a_ptr + rows64[:, None] * stride_a + heads[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows64[:, None] * stride_b + heads[None, :], mask=mask, other=0.0).to(tl.float32)
    decay_rate = _exp(tl.load(a_log_ptr + heads, mask=head_ok, other=0.0), LIBDEVICE)  # [BH] exp(A_log)
    x = a + tl.load(dt_bias_ptr + heads, mask=head_ok, other=0.0)[None, :]
    if LIBDEVICE:
        soft = libdevice.log1p(libdevice.exp(x))
    else:
        soft = tl.log(1.0 + tl.exp(x))
    soft = tl.where(x > SOFTPLUS_THRESHOLD, x, soft)
    g = -decay_rate[None, :] * soft
    beta = tl.math.div_rn(1.0, 1.0 + _exp(-b, LIBDEVICE))
    if HAS_VALID:  # padding rows of a graph-captured prefill: no decay, no write
        keep = (rows < tl.load(valid_ptr))[:, None]
        g = tl.where(keep, g, 0.0)
        beta = tl.where(keep, beta, 0.0)
    offsets = rows64[:, None] * HV + heads[None, :]
    tl.store(g_ptr + offsets, g, mask=mask)
    tl.store(beta_ptr + offsets, beta, mask=mask)


@satisfies("linear-attention/gdn-gates", major=1, devices=("cuda",), backend="triton")
def gdn_gates(
    a: torch.Tensor,  # [T, Hv] (any row stride, unit column stride)
    b: torch.Tensor,  # [T, Hv]
    A_log: torch.Tensor,  # [Hv] float32
    dt_bias: torch.Tensor,  # [Hv] float32
    g: torch.Tensor,  # [T, Hv] float32, contiguous
    beta: torch.Tensor,  # [T, Hv] float32, contiguous
    valid_tokens: torch.Tensor | None = None,  # [1] integer (device): rows from this count on get g = beta = 0
) -> None:
    """g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), float32, in one launch (see the module doc)."""
    check_gdn_gates(a, b, A_log, dt_bias, g, beta)
    if not (g.is_contiguous() and beta.is_contiguous()):
        raise ValueError("g and beta must be contiguous")
    if valid_tokens is not None and (valid_tokens.numel() != 1 or valid_tokens.is_floating_point()):
        raise ValueError(f"valid_tokens must hold one integer count, got {valid_tokens.dtype} {list(valid_tokens.shape)}")
    require_launchable(a, b, A_log, dt_bias, g, beta, *(() if valid_tokens is None else (valid_tokens,)))
    tokens, heads = a.shape
    if tokens == 0:
        return
    a_in, b_in = (t if t.stride(1) == 1 else t.contiguous() for t in (a, b))
    _gdn_gates_kernel[(cdiv(tokens, BLOCK_T),)](
        a_in, b_in, A_log.float().contiguous(), dt_bias.float().contiguous(), g, beta, valid_tokens if valid_tokens is not None else g,
        tokens, a_in.stride(0), b_in.stride(0),
        HV=heads, BLOCK_T=BLOCK_T, BLOCK_H=next_power_of_2(heads), HAS_VALID=valid_tokens is not None, LIBDEVICE=not interpreting(),
    )
