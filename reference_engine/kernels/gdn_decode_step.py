"""Fused Gated DeltaNet decode step in two Triton launches (or one), states updated in place in the pools.

Same function and signature as `reference_engine.ops.linear_attention.gdn_decode_step` (the torch
composition). Replaces, per GDN layer and decode step, the gather of both states at the slots,
the masked_fill of fresh sequences, the conv update, the conv-state scatter, the gates, the
recurrent step, the recurrent-state scatter, `z.contiguous()` and the gated RMSNorm.

Launch 1, `_conv_update_kernel`, grid (B, cdiv(C, BLOCK_C)): each program owns BLOCK_C channels
of one sequence. It reads the K-1 cached inputs of its channels at the sequence's slot (zeros when
`has_initial_state` is False) and the new input, writes silu(sum_k w_k window_k) into a float32
scratch `conv_out [B, C]`, and shifts the cached inputs left by one in place (the new state is
computed from the loaded window, so the store depends on the load). No two programs of a real row
touch the same conv-state entry.

Launch 2, `_recurrent_norm_kernel`, grid (B, Hv[, split]): the program for (sequence b, value head h) reads
q, k of key head h // (Hv / Hk) and v of head h from `conv_out`, L2-normalises q and k in float32
(x * rsqrt(sum x^2 + 1e-6), q also scaled by Dk^-0.5), computes g = -exp(A_log) softplus(a + dt_bias)
and beta = sigmoid(b), then with its whole [Dk, Dv] float32 state tile in registers:
    S <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q
stores S back in place and writes out = w * o * rsqrt(mean(o^2) + eps) * silu(z).
A second launch is needed because its programs read conv outputs that other programs of launch 1
produce. The norm needs all Dv outputs of a head, so one program holds the whole head: a single
[Dk, Dv] tile (at 128 x 128 fp32, 64 values per thread with num_warps=8) rather than a loop over
Dk chunks, so the state is read from HBM once and every load of it is in flight at once (at batch 1
there are only Hv = 32 programs, so per-program memory parallelism decides the time). Below
`STEP_SPLIT_BELOW` (row, head) pairs the head's value columns are split over `STEP_SPLIT` programs instead
(the state columns are independent); each stores its o part in a float32 scratch and takes a ticket, and
the program drawing the last ticket applies the gated norm over the whole head and resets the counter.

Fused conv (`FUSED_CONV` at every batch, `FUSED_CONV_MAX_BATCH` up to a batch): launch 2 does the conv itself and launch 1 is not made. A program reads
the windows of the channels it needs (q and k of its key head, v of its value columns) and computes the same float32
silu(conv) in registers. Its v channels belong to it alone, so it stores their shifted window directly. The q/k channels
of a key head are read by SHARERS = (Hv / Hk) * split programs of the row, so none may shift them before all have read:
each takes a ticket from a per-(row, key head) counter after reading (release), and the one drawing the last ticket
stores the shifted q/k window and resets the counter. The arithmetic is the same, in the same order: under the
interpreter the outputs and both states equal the two-launch form's bit for bit (the tests check it, and that a
first-ticket writer is caught); on the GPU the compiler contracts the state update differently, so the float32 states
agree to rounding (run58). Measured on an H100 (run58): -8% at batch 1, +2 to 3% at batches 8 to 64; off.

b/a fold (`ba_from`, the model's use up to `BA_FOLD_MAX_BATCH` sequences): a Gated DeltaNet layer's b and a come from
`in_proj_b` and `in_proj_a`, two dense 2048 -> 32 linears (bf16 in the published checkpoints), which at batch 1 are a
launch of their own (`dense_gemv`: 30 launches a step, 68 us of the H100's 2.42 ms eager step in run76). With `ba_from`
the recurrent kernel's program for (row, head) computes the head's b and a itself: rows head and Hv + head of the
stacked weight dotted with x[row] in float32, rounded to the model dtype, as `dense_gemv` computes them (the same
[2, H] products reduced along the columns: bit for bit under the interpreter; the GPU's reduction tree may differ by
the last float32 bit before the rounding). The split programs of a head each compute it (12 KB read from L2, against the
16 KB of state each reads); part 0 stores b and a into the caller's tensors, which are outputs then.

Differences from the torch op: conv outputs stay float32 (the torch op rounds them to the model
dtype) and o enters the norm in float32 (the torch op rounds it first). Padding rows that share one
scratch slot race on it; they read and write only inside that slot (no fault, results unspecified).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_engine.kernels import gemv_pairs, pdl
from reference_engine.kernels.launch import (
    cdiv,
    finish,
    next_power_of_2,
    require_launchable,
    staging_buffer,
    ticket_counters,
)
from reference_engine.kernels.norms import _round_to_bf16, _store_pairs
from reference_engine.ops.linear_attention import L2_EPS, check_gdn_decode_step
from reference_engine.ops.registry import satisfies

CONV_BLOCK_C = 128  # channels per conv program: C = 8192 gives 64 programs per sequence
CONV_WARPS = 4
STEP_WARPS = 8  # a 128 x 128 float32 state tile: 64 registers per thread for the tile
# Few programs (batch 1: Hv = 32) leave most multiprocessors idle: below STEP_SPLIT_BELOW (row, head) pairs each
# head's value columns are split over STEP_SPLIT programs, and the last one of a head applies the gated norm.
STEP_SPLIT, STEP_SPLIT_BELOW, SPLIT_WARPS = 4, 128, 4
# One launch instead of two (module docstring, "Fused conv"): `FUSED_CONV` at every batch (tuning key `gdn_step_fused_conv`),
# `FUSED_CONV_MAX_BATCH` up to that batch (key `gdn_step_fused_conv_max_batch`; run58 on an H100: batch 1 8.22 -> 7.55 us,
# batches 8 to 64 2 to 3% slower, `benchmarks/kernels/results/2026-12-05-h100-run58-gdn-fused-conv.json`).
FUSED_CONV = False
FUSED_CONV_MAX_BATCH = 0
# Tuning key `gdn_step_state_first`: the recurrent kernel issues its state tile's load first, before the conv, the q/k
# ticket (whose acquire keeps later loads behind it) and the gates; the same arithmetic. Off until
# `benchmarks/kernels/time_gdn_state_first.py` times it.
STATE_FIRST = False
QK_WRITER = -1  # which ticket stores the shared q/k conv state: -1 the last (correct); tests set 0 to show a wrong writer is caught
# The b/a fold (module docstring): up to this many sequences the model hands the step its input and the stacked dense b/a
# weight (`ba_from`) instead of running the b/a linear as a launch of its own (tuning key `gdn_step_ba_fold_max_batch`;
# 0 off until `benchmarks/kernels/time_ba_fold.py` times it).
BA_FOLD_MAX_BATCH = 0
BA_FOLD_MAX_WIDTH = 8192  # the hidden size one program's [2, H] tile may take


def folds_ba(batch: int) -> bool:
    """True when a step of `batch` sequences computes b and a itself (`ba_from`)."""
    return 1 <= batch <= BA_FOLD_MAX_BATCH


def check_ba_from(ba_from, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, num_v_heads: int) -> None:
    """`ba_from = (x [B, H], weight [2 Hv, H])`: x's rows of unit column stride, the weight contiguous (b rows then a rows),
    both in mixed_qkv's dtype and on its device; b and a are then written, so neither may overlap the inputs."""
    if not isinstance(ba_from, tuple) or len(ba_from) != 2 or not all(isinstance(t, torch.Tensor) for t in ba_from):
        raise ValueError("ba_from must be a tuple (x [B, H], weight [2 * Hv, H])")
    x, weight = ba_from
    batch = mixed_qkv.shape[0]
    if x.dim() != 2 or x.shape[0] != batch or x.stride(1) != 1:
        raise ValueError(f"ba_from x must be [B={batch}, H] with unit column stride, got shape {tuple(x.shape)} strides {x.stride()}")
    hidden = x.shape[1]
    if not 1 <= hidden <= BA_FOLD_MAX_WIDTH:
        raise ValueError(f"ba_from x must have 1 to {BA_FOLD_MAX_WIDTH} columns, got {hidden}")
    if tuple(weight.shape) != (2 * num_v_heads, hidden) or not weight.is_contiguous():
        raise ValueError(f"ba_from weight must be contiguous [2 * Hv={2 * num_v_heads}, H={hidden}], got {tuple(weight.shape)}")
    for name, tensor in (("x", x), ("weight", weight)):
        if tensor.dtype != mixed_qkv.dtype or tensor.device != mixed_qkv.device:
            raise ValueError(f"ba_from {name} must be {mixed_qkv.dtype} on {mixed_qkv.device}, got {tensor.dtype} on {tensor.device}")
    for name, written in (("b", b), ("a", a)):
        for source in (x, weight):
            if _overlaps(written, source):
                raise ValueError(f"with ba_from, {name} is written and must not overlap the inputs")


def _byte_span(tensor: torch.Tensor) -> tuple[int, int]:
    """[first byte, one past the last byte] that a tensor's elements may occupy."""
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride())) if tensor.numel() else -1
    return tensor.data_ptr(), tensor.data_ptr() + (last + 1) * tensor.element_size()


def _overlaps(first: torch.Tensor, second: torch.Tensor) -> bool:
    (start, stop), (other_start, other_stop) = _byte_span(first), _byte_span(second)
    return start < other_stop and other_start < stop


@triton.jit
def _conv_window(x_ptr, w_ptr, state_ptr, row, slot, has_state, chans, c_ok, stride_xb, stride_xc, stride_ss, stride_sc, stride_sk,
                 K: tl.constexpr, BLOCK_K: tl.constexpr):
    """Channels `chans` of one sequence: (silu(conv) [BC] float32, window [BC, BK] float32, its state offsets [BC, BK]).
    The window holds the K-1 cached inputs at `slot` (zeros without a state), oldest first, then the new input."""
    taps = tl.arange(0, BLOCK_K)  # [BK], window position: 0..K-2 cached inputs (oldest first), K-1 the new input
    x = tl.load(x_ptr + row * stride_xb + chans * stride_xc, mask=c_ok, other=0.0).to(tl.float32)  # [BC]
    w = tl.load(w_ptr + chans[:, None] * K + taps[None, :], mask=c_ok[:, None] & (taps[None, :] < K), other=0.0).to(tl.float32)
    state_offsets = slot * stride_ss + chans[:, None] * stride_sc + taps[None, :] * stride_sk  # [BC, BK]
    cached = tl.load(state_ptr + state_offsets, mask=c_ok[:, None] & (taps[None, :] < K - 1) & has_state, other=0.0).to(tl.float32)
    window = tl.where(taps[None, :] == K - 1, x[:, None], cached)  # [BC, BK]
    acc = tl.sum(window * w, axis=1)  # [BC]
    return acc * tl.sigmoid(acc), window, state_offsets


@triton.jit
def _store_shifted(state_ptr, window, state_offsets, c_ok, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """new state[:, j] = window[:, j + 1]: a one-hot select (exact), so the store depends on the loads."""
    taps = tl.arange(0, BLOCK_K)
    pick = taps[None, None, :] == taps[None, :, None] + 1  # [1, BK (j), BK (t)]
    shifted = tl.sum(tl.where(pick, window[:, None, :], 0.0), axis=2)  # [BC, BK]
    tl.store(state_ptr + state_offsets, shifted.to(state_ptr.dtype.element_ty), mask=c_ok[:, None] & (taps[None, :] < K - 1))


@triton.jit
def _conv_update_kernel(
    x_ptr, w_ptr, state_ptr, slots_ptr, init_ptr, conv_out_ptr,
    C, stride_xb, stride_xc, stride_ss, stride_sc, stride_sk,
    K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = 0,
):
    pdl.pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    chans = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BC]
    c_ok = chans < C
    slot = tl.load(slots_ptr + row)  # int64
    has_state = tl.load(init_ptr + row) != 0
    y, window, state_offsets = _conv_window(x_ptr, w_ptr, state_ptr, row, slot, has_state, chans, c_ok, stride_xb, stride_xc,
                                            stride_ss, stride_sc, stride_sk, K, BLOCK_K)  # fmt: skip
    pdl.pdl_release(PDL)
    tl.store(conv_out_ptr + row * C + chans, y, mask=c_ok)
    _store_shifted(state_ptr, window, state_offsets, c_ok, K, BLOCK_K)


@triton.jit
def _ba_dot(x_ptr, w_ptr, row, head, stride_xb, HV: tl.constexpr, H: tl.constexpr, BLOCK_H: tl.constexpr, BF16: tl.constexpr):
    """(b, a) of (row, head) as the stacked b/a linear gives them: rows head and HV + head of `w [2 HV, H]` (b rows, then
    a rows) dotted with x[row] in float32 and rounded to x's dtype, as `dense_gemv` computes a two-row block: the same
    [2, BLOCK_H] products reduced along the columns."""
    cols = tl.arange(0, BLOCK_H)
    c_ok = cols < H
    pick = tl.arange(0, 2)  # 0: b, 1: a
    xv = tl.load(x_ptr + row * stride_xb + cols, mask=c_ok, other=0.0)
    w = tl.load(w_ptr + (pick * HV + head)[:, None].to(tl.int64) * H + cols[None, :], mask=c_ok[None, :], other=0.0)
    sums = tl.sum(w.to(tl.float32) * xv.to(tl.float32)[None, :], axis=1)  # [2]
    if BF16:
        sums = _round_to_bf16(sums)
    else:
        sums = sums.to(x_ptr.dtype.element_ty).to(tl.float32)
    return tl.sum(tl.where(pick == 0, sums, 0.0), axis=0), tl.sum(tl.where(pick == 1, sums, 0.0), axis=0)


@triton.jit
def _gated_norm_store(o, dv, v_ok, row, head, z_ptr, norm_w_ptr, out_ptr, stride_zb, stride_zc, stride_ob, stride_oc, eps, DV: tl.constexpr,
                      pairs_ptr=None, HV: tl.constexpr = 1, PAIRS: tl.constexpr = False, BLOCK_DV: tl.constexpr = 2):
    """out[row, head * DV + dv] = w * o * rsqrt(mean(o^2) + eps) * silu(z) for a whole head's o [BLOCK] (zero where masked).
    PAIRS: the head's stored values again as the batch-1 GEMV's float16 pairs in both orders (`pairs_ptr` [B, 2, HV * DV / 2],
    plain then E4M3; DV a multiple of 16 and out's columns contiguous, which the wrapper checks)."""
    inv_rms = tl.rsqrt(tl.sum(o * o, axis=0) / DV + eps)
    cols = head * DV + dv
    z = tl.load(z_ptr + row * stride_zb + cols * stride_zc, mask=v_ok, other=0.0).to(tl.float32)
    weight = tl.load(norm_w_ptr + dv, mask=v_ok, other=0.0).to(tl.float32)
    y = weight * (o * inv_rms) * (z * tl.sigmoid(z))
    tl.store(out_ptr + row * stride_ob + cols * stride_oc, y.to(out_ptr.dtype.element_ty), mask=v_ok)
    if PAIRS:
        tl.debug_barrier()  # this program's stores of the head are visible to all its threads
        words = tl.arange(0, BLOCK_DV // 2)
        word_ok = words < DV // 2
        head_ptr = out_ptr + row * stride_ob + head * DV
        dest = pairs_ptr + row * (HV * DV) + head * (DV // 2)
        _store_pairs(head_ptr, dest, words, word_ok, False)
        _store_pairs(head_ptr, dest + (HV * DV) // 2, words, word_ok, True)


@triton.jit
def _recurrent_norm_kernel(
    conv_out_ptr, z_ptr, b_ptr, a_ptr, a_log_ptr, dt_bias_ptr, norm_w_ptr, state_ptr, slots_ptr, init_ptr, out_ptr, o_ptr, counter_ptr,
    stride_zb, stride_zc, stride_bb, stride_bh, stride_ab, stride_ah,
    stride_ss, stride_sh, stride_sk, stride_sv, stride_ob, stride_oc,
    q_scale, eps,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, L2_EPS: tl.constexpr, SPLIT: tl.constexpr = 1, BLOCK_DV: tl.constexpr = 0,
    x_ptr=None, conv_w_ptr=None, conv_state_ptr=None, conv_counter_ptr=None, stride_xb=0, stride_xc=0, stride_cs=0, stride_cc=0, stride_ck=0,
    FUSED_CONV: tl.constexpr = False, KW: tl.constexpr = 4, BLOCK_KW: tl.constexpr = 4, QK_WRITER: tl.constexpr = -1,
    STATE_FIRST: tl.constexpr = False, pairs_ptr=None, PAIRS: tl.constexpr = False,
    ba_x_ptr=None, ba_w_ptr=None, stride_bax=0, BA_DOT: tl.constexpr = False, BA_H: tl.constexpr = 1, BA_BLOCK: tl.constexpr = 1,
    BA_BF16: tl.constexpr = False, PDL: tl.constexpr = 0,
):
    pdl.pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    part = tl.program_id(2)  # value columns part * BLOCK_V.. of the head (SPLIT > 1)
    key_head = head // (HV // HK)
    dk = tl.arange(0, BLOCK_K)
    dv = part * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok = dk < DK
    v_ok = dv < DV
    offsets = head * stride_sh + dk[:, None] * stride_sk + dv[None, :] * stride_sv  # [BK, BV], plus the slot's row below
    mask = k_ok[:, None] & v_ok[None, :]
    if FUSED_CONV or STATE_FIRST:
        slot = tl.load(slots_ptr + row)  # int64
        has_state = tl.load(init_ptr + row) != 0
    if STATE_FIRST:  # the state tile, the launch's largest read, issued before the conv and the gates it does not depend on
        s = tl.load(state_ptr + slot * stride_ss + offsets, mask=mask & has_state, other=0.0)  # fresh sequence: zeros
    if FUSED_CONV:  # the conv in this launch (module docstring): v channels owned, q/k channels shared by SHARERS programs
        q, q_window, q_offsets = _conv_window(x_ptr, conv_w_ptr, conv_state_ptr, row, slot, has_state, key_head * DK + dk, k_ok,
                                              stride_xb, stride_xc, stride_cs, stride_cc, stride_ck, KW, BLOCK_KW)  # fmt: skip
        k, k_window, k_offsets = _conv_window(x_ptr, conv_w_ptr, conv_state_ptr, row, slot, has_state, HK * DK + key_head * DK + dk, k_ok,
                                              stride_xb, stride_xc, stride_cs, stride_cc, stride_ck, KW, BLOCK_KW)  # fmt: skip
        v, v_window, v_offsets = _conv_window(x_ptr, conv_w_ptr, conv_state_ptr, row, slot, has_state, 2 * HK * DK + head * DV + dv, v_ok,
                                              stride_xb, stride_xc, stride_cs, stride_cc, stride_ck, KW, BLOCK_KW)  # fmt: skip
        _store_shifted(conv_state_ptr, v_window, v_offsets, v_ok, KW, BLOCK_KW)
        # Every program of (row, key head) reads the same q/k window; the one drawing the last ticket (all the others
        # have read theirs) stores it shifted and puts the counter back to zero.
        SHARERS: tl.constexpr = (HV // HK) * SPLIT
        WRITER: tl.constexpr = SHARERS - 1 if QK_WRITER < 0 else QK_WRITER  # QK_WRITER: tests only (a known-wrong writer)
        tl.debug_barrier()  # every thread's window is loaded and used before the ticket is taken (release, GPU scope)
        qk_counter = conv_counter_ptr + row * HK + key_head
        qk_ticket = tl.atomic_add(qk_counter, 1, sem="acq_rel", scope="gpu")
        if qk_ticket == WRITER:
            _store_shifted(conv_state_ptr, q_window, q_offsets, k_ok, KW, BLOCK_KW)
            _store_shifted(conv_state_ptr, k_window, k_offsets, k_ok, KW, BLOCK_KW)
        if qk_ticket == SHARERS - 1:
            tl.store(qk_counter, 0)
    else:
        base = conv_out_ptr + row * (2 * HK * DK + HV * DV)  # conv_out [B, C] float32, contiguous
        q = tl.load(base + key_head * DK + dk, mask=k_ok, other=0.0)
        k = tl.load(base + HK * DK + key_head * DK + dk, mask=k_ok, other=0.0)
        v = tl.load(base + 2 * HK * DK + head * DV + dv, mask=v_ok, other=0.0)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + L2_EPS) * q_scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + L2_EPS)

    if BA_DOT:  # b and a computed here from the layer's input (module docstring, "b/a fold") and written out by part 0
        b, a = _ba_dot(ba_x_ptr, ba_w_ptr, row, head, stride_bax, HV, BA_H, BA_BLOCK, BA_BF16)
        if part == 0:
            tl.store(b_ptr + row * stride_bb + head * stride_bh, b.to(b_ptr.dtype.element_ty))
            tl.store(a_ptr + row * stride_ab + head * stride_ah, a.to(a_ptr.dtype.element_ty))
    else:
        a = tl.load(a_ptr + row * stride_ab + head * stride_ah).to(tl.float32)
        b = tl.load(b_ptr + row * stride_bb + head * stride_bh).to(tl.float32)
    x = a + tl.load(dt_bias_ptr + head).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x))))  # torch's threshold 20
    decay = tl.exp(-tl.exp(tl.load(a_log_ptr + head).to(tl.float32)) * softplus)  # exp(g)
    beta = tl.sigmoid(b)

    if not (FUSED_CONV or STATE_FIRST):
        slot = tl.load(slots_ptr + row)  # int64
        has_state = tl.load(init_ptr + row) != 0
    offsets = slot * stride_ss + offsets
    if not STATE_FIRST:
        s = tl.load(state_ptr + offsets, mask=mask & has_state, other=0.0)  # fresh sequence: zeros
    s = s * decay
    delta = beta * (v - tl.sum(s * k[:, None], axis=0))  # [BV]
    s = s + k[:, None] * delta[None, :]
    tl.store(state_ptr + offsets, s, mask=mask)
    o = tl.sum(s * q[:, None], axis=0)  # [BV] float32, zero in masked columns
    pdl.pdl_release(PDL)

    if SPLIT == 1:
        _gated_norm_store(o, dv, v_ok, row, head, z_ptr, norm_w_ptr, out_ptr, stride_zb, stride_zc, stride_ob, stride_oc, eps, DV, pairs_ptr, HV, PAIRS, BLOCK_DV)
    else:  # the norm needs the whole head: o parts go to a float32 scratch, the last program of (row, head) finishes
        pair = row * HV + head
        tl.store(o_ptr + pair * DV + dv, o, mask=v_ok)
        tl.debug_barrier()  # every thread's o is stored before the ticket is taken (release, GPU scope)
        ticket = tl.atomic_add(counter_ptr + pair, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT - 1:
            full = tl.arange(0, BLOCK_DV)
            full_ok = full < DV
            o_all = tl.load(o_ptr + pair * DV + full, mask=full_ok, other=0.0, cache_modifier=".cg")
            _gated_norm_store(o_all, full, full_ok, row, head, z_ptr, norm_w_ptr, out_ptr, stride_zb, stride_zc, stride_ob, stride_oc, eps, DV,
                              pairs_ptr, HV, PAIRS, BLOCK_DV)  # fmt: skip
            tl.store(counter_ptr + pair, 0)


@satisfies("linear-attention/gdn-decode-step", major=1, devices=("cuda",), backend="triton")
def gdn_decode_step(
    mixed_qkv: torch.Tensor,  # [B, C] model dtype, C = 2 * Hk * Dk + Hv * Dv, layout [q | k | v]
    z: torch.Tensor,  # [B, Hv * Dv] model dtype (any strides)
    b: torch.Tensor,  # [B, Hv] (any strides)
    a: torch.Tensor,  # [B, Hv] (any strides)
    conv_weight: torch.Tensor,  # [C, K]
    A_log: torch.Tensor,  # [Hv]
    dt_bias: torch.Tensor,  # [Hv]
    norm_weight: torch.Tensor,  # [Dv] (plain weight, not zero-centred)
    conv_state: torch.Tensor,  # [S, C, K - 1] model dtype, updated in place at rows state_slots
    recurrent_state: torch.Tensor,  # [S, Hv, Dk, Dv] float32, updated in place at rows state_slots
    state_slots: torch.Tensor,  # [B] int64
    has_initial_state: torch.Tensor,  # [B] bool (False: both states start at zero)
    out: torch.Tensor,  # [B, Hv * Dv] model dtype
    eps: float,
    pairs_out: torch.Tensor | None = None,  # kernel only: int32 [B, 2, Hv * Dv / 2]
    ba_from: tuple[torch.Tensor, torch.Tensor] | None = None,  # kernel only: (x [B, H], stacked b/a weight [2 * Hv, H])
) -> None:
    """One Gated DeltaNet decode token per sequence (see the module docstring); two launches (one with `FUSED_CONV`, or up to
    `FUSED_CONV_MAX_BATCH` sequences), capturable. `pairs_out` (optional): out again as the batch-1 GEMV's float16 pairs in
    both orders (plain, then E4M3: `gemv_pairs.pairs_buffer`), for out_proj (`kernels/gemv_pairs.py`); out must then be
    contiguous bfloat16 with Dv a multiple of 16. `ba_from` (optional): the layer's input x and the stacked dense weight of
    `in_proj_b` and `in_proj_a` (b rows, then a rows); the step computes b and a itself (module docstring, "b/a fold") and
    writes them into `b` and `a`, which are then outputs."""
    dims = check_gdn_decode_step(
        mixed_qkv, z, b, a, conv_weight, A_log, dt_bias, norm_weight, conv_state, recurrent_state, state_slots, has_initial_state, out, eps
    )
    if ba_from is not None:
        check_ba_from(ba_from, mixed_qkv, b, a, dims.num_v_heads)
    require_launchable(mixed_qkv, z, b, a, conv_weight, A_log, dt_bias, norm_weight, conv_state, recurrent_state, state_slots, has_initial_state, out)
    if pairs_out is not None:
        gemv_pairs.check_pairs_out(pairs_out, out, dims.v_head_dim)
    if ba_from is not None:
        require_launchable(*ba_from)
    if dims.batch == 0:
        return
    init = has_initial_state.view(torch.uint8)  # same bytes, no copy
    slots = state_slots if state_slots.is_contiguous() else state_slots.contiguous()
    init = init if init.is_contiguous() else init.contiguous()
    # parameters: no-ops when contiguous (they are); the conv weight rows are then K contiguous taps
    conv_weight, A_log, dt_bias, norm_weight = conv_weight.contiguous(), A_log.contiguous(), dt_bias.contiguous(), norm_weight.contiguous()
    buffer = staging_buffer(out)  # float32 under the interpreter (it truncates to bf16), else `out`
    split = STEP_SPLIT if dims.batch * dims.num_v_heads < STEP_SPLIT_BELOW else 1
    pairs = dims.batch * dims.num_v_heads
    fused_conv = FUSED_CONV or dims.batch <= FUSED_CONV_MAX_BATCH
    qk_groups = dims.batch * dims.num_k_heads if fused_conv else 0  # the fused conv's tickets, after the split's
    counters = ticket_counters(mixed_qkv.device, (pairs if split > 1 else 0) + qk_groups) if split > 1 or fused_conv else slots
    o_parts = buffer  # unused without the split
    if split > 1:
        o_parts = torch.empty(pairs * dims.v_head_dim, dtype=torch.float32, device=mixed_qkv.device)
    fused = {}  # the fused conv's arguments
    conv_out = mixed_qkv  # unused with the fused conv
    if fused_conv:
        fused = {
            "x_ptr": mixed_qkv, "conv_w_ptr": conv_weight, "conv_state_ptr": conv_state, "conv_counter_ptr": counters[pairs if split > 1 else 0 :],
            "stride_xb": mixed_qkv.stride(0), "stride_xc": mixed_qkv.stride(1),
            "stride_cs": conv_state.stride(0), "stride_cc": conv_state.stride(1), "stride_ck": conv_state.stride(2),
            "FUSED_CONV": True, "KW": dims.kernel, "BLOCK_KW": next_power_of_2(dims.kernel), "QK_WRITER": QK_WRITER,
        }  # fmt: skip
    else:
        conv_out = torch.empty(dims.batch, dims.channels, dtype=torch.float32, device=mixed_qkv.device)  # [B, C] scratch
        _conv_update_kernel[(dims.batch, cdiv(dims.channels, CONV_BLOCK_C))](
            mixed_qkv, conv_weight, conv_state, slots, init, conv_out,
            dims.channels, mixed_qkv.stride(0), mixed_qkv.stride(1),
            conv_state.stride(0), conv_state.stride(1), conv_state.stride(2),
            K=dims.kernel, BLOCK_C=CONV_BLOCK_C, BLOCK_K=next_power_of_2(dims.kernel), num_warps=CONV_WARPS, **pdl.launch_args(),
        )  # fmt: skip
    if ba_from is not None:  # b and a become outputs: part 0 of each (row, head) writes the rounded values
        ba_x, ba_weight = ba_from
        fused |= {"ba_x_ptr": ba_x, "ba_w_ptr": ba_weight, "stride_bax": ba_x.stride(0), "BA_DOT": True, "BA_H": ba_x.shape[1],
                  "BA_BLOCK": next_power_of_2(ba_x.shape[1]), "BA_BF16": ba_x.dtype == torch.bfloat16}  # fmt: skip
    block_v = next_power_of_2(cdiv(dims.v_head_dim, split))
    _recurrent_norm_kernel[(dims.batch, dims.num_v_heads, split)](
        conv_out, z, b, a, A_log, dt_bias, norm_weight, recurrent_state, slots, init, buffer, o_parts, counters,
        z.stride(0), z.stride(1), b.stride(0), b.stride(1), a.stride(0), a.stride(1),
        recurrent_state.stride(0), recurrent_state.stride(1), recurrent_state.stride(2), recurrent_state.stride(3),
        buffer.stride(0), buffer.stride(1), float(dims.k_head_dim**-0.5), float(eps),
        HK=dims.num_k_heads, HV=dims.num_v_heads, DK=dims.k_head_dim, DV=dims.v_head_dim,
        BLOCK_K=next_power_of_2(dims.k_head_dim), BLOCK_V=block_v, L2_EPS=L2_EPS,
        SPLIT=split, BLOCK_DV=next_power_of_2(dims.v_head_dim), num_warps=STEP_WARPS if split == 1 else SPLIT_WARPS, STATE_FIRST=STATE_FIRST,
        pairs_ptr=pairs_out if pairs_out is not None else buffer, PAIRS=pairs_out is not None, **fused, **pdl.launch_args(),
    )  # fmt: skip
    finish(buffer, out)
