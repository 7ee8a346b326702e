"""Depthwise causal conv1d + SiLU over a ragged batch (contract linear-attention/causal-conv1d), Triton, two launches.

The same computation as the torch op `reference_engine.ops.linear_attention.causal_conv1d`. For token t
at position p of sequence b (cu_seqlens[b] <= t < cu_seqlens[b + 1], p = t - cu_seqlens[b]) and channel c:

    out[t, c] = silu(sum_j weight[c, j] * u[p - (K-1) + j, c])     j = 0 .. K-1 (tap K-1: the current input)

where u is the sequence's input preceded by initial_state[b, c, 0..K-2] (oldest first): a tap at a
negative position p - (K-1) + j reads initial_state[b, c, p + j]. The products and the sum run in
float32 in tap order 0 .. K-1 (as the torch op: product of the input and the float32 weight, then
accumulated), SiLU in float32, rounded once into `out`.

Launch 1, grid (cdiv(T, BLOCK_T), cdiv(C, BLOCK_C)): each program takes a [BLOCK_T, BLOCK_C] tile of
tokens and channels. It finds the sequence of each of its tokens on the device by a binary search over
cu_seqlens (ceil(log2 B) steps, vectorised over the tile's tokens), then loads the K shifted input
tiles (rows before the sequence start come from its initial state) and writes out. A tile whose tokens all sit
at position K-1 or later (all but the first tile of each sequence) takes a branch that loads inputs only.

Launch 2, grid (B, cdiv(C, BLOCK_C)): final_state[b] = the last K-1 entries of [initial_state[b], x of
sequence b] (a sequence shorter than K-1 keeps the tail of its initial state; an empty one returns it
whole). It runs after launch 1 (same stream), and each program loads its whole slice of
`initial_state` before it stores the same slice of `final_state`, so the two may be one tensor.

Validation is the torch op's (one host read of `cu_seqlens`, as there); nothing else goes to the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from reference_engine.kernels.launch import (
    cdiv,
    finish,
    interpreting,
    next_power_of_2,
    require_launchable,
    staging_buffer,
)
from reference_engine.ops.linear_attention import check_causal_conv1d
from reference_engine.ops.registry import satisfies

BLOCK_T = 32  # tokens per program of launch 1
BLOCK_C = 128  # channels per program (C = 8192: 64 channel blocks)
NUM_WARPS = 4


@triton.jit
def _sequence_of(cu_ptr, tokens, num_seqs, STEPS: tl.constexpr):
    """Per token: the b in [0, B) with cu[b] <= t < cu[b + 1] (the last b with cu[b] <= t, so empty
    sequences are skipped). Binary search, lo always satisfies cu[lo] <= t; STEPS = ceil(log2 B)."""
    lo = tl.zeros_like(tokens)
    hi = tl.zeros_like(tokens) + num_seqs
    for _ in tl.static_range(STEPS):
        mid = (lo + hi) // 2  # = lo once hi = lo + 1: the search stays put
        below = tl.load(cu_ptr + mid) <= tokens
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid)
    return lo


@triton.jit
def _conv_kernel(
    x_ptr, w_ptr, cu_ptr, state_ptr, out_ptr, slots_ptr, has_ptr,
    T, C, num_seqs, stride_xt, stride_ot, stride_sb, stride_sc, stride_sk,
    K: tl.constexpr, STEPS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, LIBDEVICE_EXP: tl.constexpr,
    POOL: tl.constexpr = False,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    chans = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BC]
    token_ok = tokens < T
    chan_ok = chans < C
    safe_tokens = tl.where(token_ok, tokens, 0)
    seq = _sequence_of(cu_ptr, safe_tokens, num_seqs, STEPS)  # [BT]
    position = safe_tokens - tl.load(cu_ptr + seq)  # [BT] position in the sequence
    seq64 = seq.to(tl.int64)
    if POOL:  # the states live in a pool: sequence b's row is slots[b]; a sequence without a state reads zeros
        seq64 = tl.load(slots_ptr + seq).to(tl.int64)
        token_has = tl.load(has_ptr + seq) != 0  # [BT]
    else:
        token_has = seq >= 0
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)  # 0 + the first product: that product exactly
    if tl.min(tl.where(token_ok, position, K - 1), axis=0) >= K - 1:
        # no tap of this tile reaches before its sequence's start (every tile but the first of each sequence):
        # inputs only, without the initial-state addresses and loads (a third of the instructions)
        for j in tl.static_range(K):
            x_rows = (safe_tokens + (j - (K - 1))).to(tl.int64)
            x_tap = tl.load(x_ptr + x_rows[:, None] * stride_xt + chans[None, :], mask=token_ok[:, None] & chan_ok[None, :], other=0.0)
            w = tl.load(w_ptr + chans * K + j, mask=chan_ok, other=0.0).to(tl.float32)  # [BC]
            acc += x_tap.to(tl.float32) * w[None, :]
    else:
        for j in tl.static_range(K):
            rel = position + (j - (K - 1))  # [BT] position this tap reads; < 0: from the initial state
            from_x = (rel >= 0) & token_ok
            from_state = (rel < 0) & token_ok & token_has
            x_rows = (safe_tokens + (j - (K - 1))).to(tl.int64)
            x_tap = tl.load(x_ptr + x_rows[:, None] * stride_xt + chans[None, :], mask=from_x[:, None] & chan_ok[None, :], other=0.0)
            # clamped rather than tl.where(from_state, ...): with the search loop, that select fails Triton's sm_90 layout pass
            slot = tl.minimum(tl.maximum(rel + (K - 1), 0), K - 2).to(tl.int64)  # [BT] index into the K-1 state entries (clamped; used where rel < 0)
            s_tap = tl.load(
                state_ptr + (seq64 * stride_sb + slot * stride_sk)[:, None] + chans[None, :].to(tl.int64) * stride_sc,
                mask=from_state[:, None] & chan_ok[None, :], other=0.0,
            )
            u = tl.where(from_x[:, None], x_tap.to(tl.float32), s_tap.to(tl.float32))  # [BT, BC]
            w = tl.load(w_ptr + chans * K + j, mask=chan_ok, other=0.0).to(tl.float32)  # [BC]
            acc += u * w[None, :]
    # SiLU in float32 as torch computes it, x / (1 + exp(-x)): on the GPU with CUDA's expf (libdevice) and an
    # IEEE division (Triton's `/` and tl.exp are approximate there); the interpreter has no libdevice.
    if LIBDEVICE_EXP:
        e = libdevice.exp(-acc)
    else:
        e = tl.exp(-acc)
    y = tl.math.div_rn(acc, 1.0 + e)
    out_rows = tokens.to(tl.int64)
    tl.store(out_ptr + out_rows[:, None] * stride_ot + chans[None, :], y.to(out_ptr.dtype.element_ty), mask=token_ok[:, None] & chan_ok[None, :])


@triton.jit
def _final_state_kernel(
    x_ptr, cu_ptr, state_ptr, final_ptr, slots_ptr, has_ptr, valid_ptr,
    C, stride_xt, stride_sb, stride_sc, stride_sk, stride_fb, stride_fc, stride_fk,
    K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr, POOL: tl.constexpr = False, HAS_VALID: tl.constexpr = False,
):
    seq = tl.program_id(0).to(tl.int64)
    chans = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BC]
    entries = tl.arange(0, BLOCK_K)  # [BK] final-state entries i = 0 .. K-2 (oldest first)
    chan_ok = chans < C
    entry_ok = entries < K - 1
    start = tl.load(cu_ptr + seq)
    length = tl.load(cu_ptr + seq + 1) - start
    if HAS_VALID:  # tokens from valid_tokens on are padding: the state ends at the last valid input
        length = tl.maximum(tl.minimum(length, tl.load(valid_ptr).to(tl.int32) - start), 0)
    row = seq
    has_state = True
    if POOL:
        row = tl.load(slots_ptr + seq).to(tl.int64)
        has_state = tl.load(has_ptr + seq) != 0
    # Entry i is element length + i of [initial_state (K-1), x of the sequence]: an input when >= K-1.
    history = length + entries  # [BK]
    from_x = (history >= K - 1) & entry_ok
    from_state = (history < K - 1) & entry_ok
    x_rows = (start + tl.where(from_x, history - (K - 1), 0)).to(tl.int64)
    chans64 = chans.to(tl.int64)
    x_part = tl.load(x_ptr + x_rows[None, :] * stride_xt + chans64[:, None], mask=chan_ok[:, None] & from_x[None, :], other=0.0)
    slot = tl.where(from_state, history, 0).to(tl.int64)
    s_part = tl.load(state_ptr + row * stride_sb + chans64[:, None] * stride_sc + slot[None, :] * stride_sk,
                     mask=chan_ok[:, None] & from_state[None, :] & has_state, other=0.0)
    values = tl.where(from_x[None, :], x_part, s_part)  # [BC, BK] in x's dtype: a copy, no rounding
    tl.store(final_ptr + row * stride_fb + chans64[:, None] * stride_fc + entries[None, :].to(tl.int64) * stride_fk, values, mask=chan_ok[:, None] & entry_ok[None, :])


@satisfies("linear-attention/causal-conv1d", major=1, devices=("cuda",), backend="triton")
def causal_conv1d(
    x: torch.Tensor,  # [T, C]
    weight: torch.Tensor,  # [C, K]
    cu_seqlens: torch.Tensor,  # [B + 1] int32
    initial_state: torch.Tensor,  # [B, C, K - 1]
    out: torch.Tensor,  # [T, C]
    final_state: torch.Tensor,  # [B, C, K - 1] (may be `initial_state`)
    state_slots: torch.Tensor | None = None,  # [B] integer (device): initial_state / final_state are pools [S, C, K - 1]
    has_initial_state: torch.Tensor | None = None,  # [B] bool (device), with state_slots: False reads zeros
    valid_tokens: torch.Tensor | None = None,  # [1] integer (device), one sequence: tokens from this count on are padding
) -> None:
    """Depthwise causal conv over each sequence (previous inputs from `initial_state`), then SiLU; two Triton launches.

    Beyond the contract, for the model's prefill (no gather or scatter launches around the op): with `state_slots`
    and `has_initial_state`, sequence b's state is row state_slots[b] of the pools `initial_state` and `final_state`
    (zeros where has_initial_state[b] is False; the two may be one pool); with `valid_tokens` (one sequence), the
    final state holds the last K-1 inputs before that count (a padded graph prefill)."""
    pool = state_slots is not None
    if pool != (has_initial_state is not None):
        raise ValueError("state_slots and has_initial_state go together")
    if pool:
        _check_pool(initial_state, final_state, state_slots, has_initial_state, x, weight)
        num_seqs = state_slots.shape[0]
        head = (num_seqs, *initial_state.shape[1:])
        num_tokens, channels, kernel, offsets = check_causal_conv1d(x, weight, cu_seqlens, initial_state.new_empty(head), out, final_state.new_empty(head))
    else:
        num_tokens, channels, kernel, offsets = check_causal_conv1d(x, weight, cu_seqlens, initial_state, out, final_state)
    num_seqs = len(offsets) - 1
    if valid_tokens is not None and (num_seqs != 1 or valid_tokens.numel() != 1 or valid_tokens.is_floating_point()):
        raise ValueError(f"valid_tokens must hold one integer count and goes with one sequence, got {valid_tokens.dtype} {list(valid_tokens.shape)} for {num_seqs} sequences")
    extra = tuple(t for t in (state_slots, has_initial_state, valid_tokens) if t is not None)
    require_launchable(x, weight, cu_seqlens, initial_state, out, final_state, *extra)
    if channels == 0:
        return

    x_in = x if x.stride(1) == 1 else x.contiguous()
    w_in = weight.contiguous()
    cu = cu_seqlens.contiguous()
    block_c = min(BLOCK_C, next_power_of_2(channels))
    if num_tokens > 0:
        buffer = staging_buffer(out)
        result = buffer if buffer.stride(1) == 1 else torch.empty(buffer.shape, dtype=buffer.dtype, device=buffer.device)
        block_t = min(BLOCK_T, next_power_of_2(num_tokens))
        _conv_kernel[(cdiv(num_tokens, block_t), cdiv(channels, block_c))](
            x_in, w_in, cu, initial_state, result, state_slots if pool else cu, has_initial_state if pool else cu,
            num_tokens, channels, num_seqs, x_in.stride(0), result.stride(0), *initial_state.stride(),
            K=kernel, STEPS=(num_seqs - 1).bit_length(), BLOCK_T=block_t, BLOCK_C=block_c, LIBDEVICE_EXP=not interpreting(), POOL=pool,
            num_warps=NUM_WARPS,
        )  # fmt: skip
        if result is not buffer:
            buffer.copy_(result)
        finish(buffer, out)
    _final_state_kernel[(num_seqs, cdiv(channels, block_c))](
        x_in, cu, initial_state, final_state, state_slots if pool else cu, has_initial_state if pool else cu, valid_tokens if valid_tokens is not None else cu,
        channels, x_in.stride(0), *initial_state.stride(), *final_state.stride(),
        K=kernel, BLOCK_K=next_power_of_2(kernel - 1), BLOCK_C=block_c, POOL=pool, HAS_VALID=valid_tokens is not None, num_warps=NUM_WARPS,
    )  # fmt: skip


def _check_pool(initial_state: torch.Tensor, final_state: torch.Tensor, state_slots: torch.Tensor, has_initial_state: torch.Tensor,
                x: torch.Tensor, weight: torch.Tensor) -> None:  # fmt: skip
    """Pools [S, C, K - 1] (the slot values themselves are not read on the host: capturable)."""
    shape = (x.shape[1] if x.dim() == 2 else -1, weight.shape[-1] - 1)
    for name, pool in (("initial_state", initial_state), ("final_state", final_state)):
        if pool.dim() != 3 or tuple(pool.shape[1:]) != shape or pool.dtype != x.dtype:
            raise ValueError(f"{name} must be a {x.dtype} pool [S, C, K-1] = [S, {shape[0]}, {shape[1]}] with state_slots, got {pool.dtype} {list(pool.shape)}")
    if state_slots.dim() != 1 or state_slots.is_floating_point() or tuple(has_initial_state.shape) != tuple(state_slots.shape) or has_initial_state.dtype != torch.bool:
        raise ValueError(f"state_slots must be integer [B] and has_initial_state bool [B], got {state_slots.dtype} {list(state_slots.shape)} "
                         f"and {has_initial_state.dtype} {list(has_initial_state.shape)}")  # fmt: skip
