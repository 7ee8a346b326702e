"""Fused routed experts for decode (contract moe/routed-experts), Triton, dense or NVFP4 weights.

Two launches, no permutation, no atomics:
1. `_gate_up_kernel`, grid (T * top_k, cdiv(I, BLOCK_N)): program (p, n) takes the pair
   p = t * top_k + j, its expert e = topk_ids[t, j], and gate rows n*BN.. and the matching up rows
   I + n*BN..; it streams them once against x[t] and writes act[p] = silu(gate) * up (rounded to
   x's dtype, as the model rounds the activation before the down projection).
2. `_down_kernel`, grid (T, cdiv(H, BLOCK_H)): program (t, h) loops over the top_k slots, reads
   the [BLOCK_H, I] slice of down_proj[e] and accumulates topk_weights[t, j] * (slice @ act) in
   float32: the weighted sum is fused and deterministic.
`WEIGHT_NVFP4` switches the weight loads: dense `[E, 2I, H]` / `[E, H, I]` in x's dtype, or packed
NVFP4 (`StackedNvfp4Experts`: codes `[E, 2I, H/2]`, E4M3 block scales `[E, 2I, H/16]`, tensor scales
`[E, 2]` for gate and up; down `[E, H, I/2]`, `[E, H, I/16]`, `[E]`), decoded in registers as in
`nvfp4_gemv`. Repeated ids in a row are summed like distinct ones. Expert ids are range-checked on
the host except while a CUDA graph is being captured (then out-of-range ids are the caller's bug).

With the shared expert fused in (`SHARED`, NVFP4 only: `nvfp4_experts_with_shared`, `moe_block_decode`)
each token has top_k + 1 slots: the routing rows are [T, top_k + 1] and the last slot (told by its
position, never by its id) is the shared expert (`SharedNvfp4Expert`: gate/up codes `[2I, H/2]`,
scales `[2I, H/16]`, tensor scales `[2]`; down `[H, I/2]`, `[H, I/16]`, `[]`, passed as their own
pointers, so the routed stack is never copied). The gate/up grid grows to T * (top_k + 1) pairs (a
uniform branch per program picks the shared tensors) and the down kernel adds
sigmoid(gate logit) * shared(x_t) to the same float32 sum: the block's output comes out of one kernel.
Top-k in the experts' launch (`GATE_UP_TOPK_MAX_TOKENS`, `topk_in_experts`): the fused router's last step is a
ticket (an atomic round trip) and then one program's top-k over the token's logits, a serial tail of the launch (the
fused router took 6.7 us a layer on an H100 in run76; a launch that only reads its 1 MB took 2.04 us on an H200 in
run80). Instead the router
launch writes the logits only (`router.router_gemv_logits`) and each routed gate/up program runs the router's own pick
(`router._topk_pick`) over its token's logits row before it knows its expert; program (slot 0, row block 0) also writes
the routing row (ids, weights, the shared slot) for the down kernel. The same code on the same logits: the same ids
and weights, so the block's output is the same bits.
`moe_block_decode` runs the whole block in three launches up to `FUSED_ROUTER_MAX_TOKENS` tokens (the router
logits over `[E+1, H]`, routed rows and the shared expert's gate row, and the top-k in one kernel,
`router.router_gemv_topk_with_shared`, which with `router.PREFETCH_EXPERTS` also starts a bulk L2 prefetch of the
selected experts' weights; then the two kernels here), in four above it (cuBLAS logits, then
`router_topk_with_shared`). From `moe_grouped_decode.MIN_TOKENS` tokens the experts run grouped by expert on tensor
cores instead (`moe_grouped_decode`), after the same router; in the batch range of `moe_grouped_half` (checked first)
grouped by expert in packed float16 on CUDA cores.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_engine.kernels import (
    moe_grouped_decode,
    moe_grouped_half,
    norms,
    pdl,
    router,
)
from reference_engine.kernels.launch import (
    cdiv,
    finish,
    interpreting,
    next_power_of_2,
    require_launchable,
    staging_buffer,
    ticket_counters,
)
from reference_engine.kernels.norms import _round_to_bf16
from reference_engine.kernels.nvfp4_gemv import _decode_e2m1, _e2m1_word_pair
from reference_engine.kernels.nvfp4_half_dot import (
    _half_rows_dot,
    _store_rows_half_pairs,
)
from reference_engine.kernels.router import (
    _shared_slot,
    _topk_pick,
    router_gemv_logits,
    router_gemv_topk_with_shared,
    router_topk_with_shared,
)
from reference_engine.ops.dense_linear import aligned_linear
from reference_engine.ops.moe import (
    _check_expert_range,
    _check_out,
    _check_routing,
    _require,
    check_routed_experts,
)
from reference_engine.ops.norms import AddNorm
from reference_engine.ops.registry import satisfies
from reference_engine.ops.static_moe import (
    SharedNvfp4Expert,
    StackedNvfp4Experts,
    capturing,
    check_experts_with_shared,
    check_moe_block_decode,
    expert_tensors,
)


@triton.jit
def _dense_rows_dot(w_ptr, row_base, row_ok, x_ptr, K, k0, BLOCK_K: tl.constexpr):
    """sum_k W[row, k] x[k] over k0..k0+BLOCK_K for rows at element offsets row_base [BN] (int64)."""
    cols = k0 + tl.arange(0, BLOCK_K)
    ok = cols < K
    w = tl.load(w_ptr + row_base[:, None] + cols[None, :], mask=row_ok[:, None] & ok[None, :], other=0.0).to(tl.float32)
    xv = tl.load(x_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    return tl.sum(w * xv[None, :], axis=1)


@triton.jit
def _nvfp4_rows_dot_words(words_ptr, scale_ptr, row, row_ok, x_ptr, K_WORDS, word0, BN: tl.constexpr, BLOCK_W: tl.constexpr, ASM: tl.constexpr):
    """`_nvfp4_rows_dot` over int32 words (8 codes each): per word, the 4 decoded pairs (codes j, j + 4)
    against x[8w + j], x[8w + j + 4]; each word's sum times its block scale (one per two words)."""
    wcols = word0 + tl.arange(0, BLOCK_W)
    ok = wcols < K_WORDS
    tile_ok = row_ok[:, None] & ok[None, :]
    words = tl.load(words_ptr + row[:, None] * K_WORDS + wcols[None, :], mask=tile_ok, other=0)  # [BN, BW]
    scale = tl.load(scale_ptr + row[:, None] * (K_WORDS // 2) + (wcols // 2)[None, :], mask=tile_ok, other=0.0).to(tl.float32)
    part = tl.zeros((BN, BLOCK_W), dtype=tl.float32)
    for j in tl.static_range(4):
        lo, hi = _e2m1_word_pair(words, j, ASM)
        x_lo = tl.load(x_ptr + wcols * 8 + j, mask=ok, other=0.0).to(tl.float32)
        x_hi = tl.load(x_ptr + wcols * 8 + (j + 4), mask=ok, other=0.0).to(tl.float32)
        part += lo * x_lo[None, :] + hi * x_hi[None, :]
    return tl.sum(part * scale, axis=1)


@triton.jit
def _nvfp4_rows_dot(packed_ptr, scale_ptr, row, row_ok, x_ptr, K_BYTES, byte0, BN: tl.constexpr, BLOCK_KB: tl.constexpr, DECODE: tl.constexpr = 0,
                    X_PAIRS: tl.constexpr = 0):
    """Same over packed rows `row` [BN] (int64 row index of a [rows, K/2] code matrix); result times
    2^-14 / weight_scale_2 (the caller multiplies by the tensor scale and 2^14). DECODE 0: bytes, nibbles
    split per byte; 1 / 2: `packed_ptr` is the int32 view of the codes, two codes decoded per shift and
    mask (`nvfp4_gemv._e2m1_word_pair`; 2 in PTX on the GPU, 1 the integer form for the interpreter); 3 / 4:
    `packed_ptr` is the int64 view (one scale block each) and `x_ptr` an int32 view of bfloat16 x, products in
    packed float16 pairs (`nvfp4_half_dot`; 3 in PTX, 4 the interpreter form); 5 / 6: the same with the codes
    widened through E4M3 (`nvfp4_half_dot`'s FP8 decode; 5 in PTX, 6 the interpreter form). X_PAIRS 1 or 2 (DECODE 3 to
    6): `x_ptr` holds x already as the block dot's float16 pairs for that decode (`_half_rows_dot`'s two load forms)."""
    if DECODE >= 3:
        part = _half_rows_dot(packed_ptr, scale_ptr, row, row_ok, x_ptr, K_BYTES // 8, byte0 // 8, BN, BLOCK_KB // 8, DECODE == 3 or DECODE == 5,
                              DECODE >= 5, 0, False, X_PAIRS)  # fmt: skip
        return tl.sum(part, axis=1) * (1.0 / 1024.0)  # the half path's codes are E2M1 * 2^-4; callers scale E2M1 * 2^-14
    if DECODE > 0:
        return _nvfp4_rows_dot_words(packed_ptr, scale_ptr, row, row_ok, x_ptr, K_BYTES // 4, byte0 // 4, BN, BLOCK_KB // 4, DECODE == 2)
    byte_cols = byte0 + tl.arange(0, BLOCK_KB)
    ok = byte_cols < K_BYTES
    packed = tl.load(packed_ptr + row[:, None] * K_BYTES + byte_cols[None, :], mask=row_ok[:, None] & ok[None, :], other=0)
    block_cols = byte0 // 8 + tl.arange(0, BLOCK_KB // 8)
    scale = tl.load(scale_ptr + row[:, None] * (K_BYTES // 8) + block_cols[None, :], mask=row_ok[:, None] & (block_cols < K_BYTES // 8)[None, :], other=0.0)
    scale = tl.reshape(tl.broadcast_to(scale.to(tl.float32)[:, :, None], (BN, BLOCK_KB // 8, 8)), (BN, BLOCK_KB))
    elements = 2 * byte0 + tl.arange(0, 2 * BLOCK_KB)
    x_pairs = tl.load(x_ptr + elements, mask=elements < 2 * K_BYTES, other=0.0).to(tl.float32)  # contiguous [2 KB]
    x_even, x_odd = tl.split(tl.reshape(x_pairs, (BLOCK_KB, 2)))
    products = _decode_e2m1(packed & 0xF) * x_even[None, :] + _decode_e2m1(packed >> 4) * x_odd[None, :]
    return tl.sum(products * scale, axis=1)


@triton.jit
def _nvfp4_gate_up(
    w_ptr, scale_ptr, scale_2_ptr, gate_row, row_ok, x_row, H: tl.constexpr, I: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    LOOP: tl.constexpr = 0, DECODE: tl.constexpr = 0, X_PAIRS: tl.constexpr = 0,
):
    """(gate, up) [BN] float32: packed gate rows `gate_row` [BN] (int64) and up rows gate_row + I against x_row,
    times the tensor scales scale_2_ptr[0] (gate) and scale_2_ptr[1] (up). X_PAIRS: `_nvfp4_rows_dot`'s."""
    gate = tl.zeros((BLOCK_N,), dtype=tl.float32)
    up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if LOOP == 1:  # unrolled: all of the row's loads may be in flight at once
        for byte0 in tl.static_range(0, H // 2, BLOCK_K):
            gate += _nvfp4_rows_dot(w_ptr, scale_ptr, gate_row, row_ok, x_row, H // 2, byte0, BLOCK_N, BLOCK_K, DECODE, X_PAIRS)
            up += _nvfp4_rows_dot(w_ptr, scale_ptr, gate_row + I, row_ok, x_row, H // 2, byte0, BLOCK_N, BLOCK_K, DECODE, X_PAIRS)
    elif LOOP > 1:  # software-pipelined, LOOP stages
        for byte0 in tl.range(0, H // 2, BLOCK_K, num_stages=LOOP):
            gate += _nvfp4_rows_dot(w_ptr, scale_ptr, gate_row, row_ok, x_row, H // 2, byte0, BLOCK_N, BLOCK_K, DECODE, X_PAIRS)
            up += _nvfp4_rows_dot(w_ptr, scale_ptr, gate_row + I, row_ok, x_row, H // 2, byte0, BLOCK_N, BLOCK_K, DECODE, X_PAIRS)
    else:
        for byte0 in range(0, H // 2, BLOCK_K):
            gate += _nvfp4_rows_dot(w_ptr, scale_ptr, gate_row, row_ok, x_row, H // 2, byte0, BLOCK_N, BLOCK_K, DECODE, X_PAIRS)
            up += _nvfp4_rows_dot(w_ptr, scale_ptr, gate_row + I, row_ok, x_row, H // 2, byte0, BLOCK_N, BLOCK_K, DECODE, X_PAIRS)
    return gate * (tl.load(scale_2_ptr) * 16384.0), up * (tl.load(scale_2_ptr + 1) * 16384.0)


@triton.jit
def _routed_nvfp4_gate_up(
    ids_ptr, pair, w_ptr, scale_ptr, scale_2_ptr, rows, row_ok, x_row, H: tl.constexpr, I: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    LOOP: tl.constexpr = 0, DECODE: tl.constexpr = 0, X_PAIRS: tl.constexpr = 0,
):
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    return _expert_nvfp4_gate_up(expert, w_ptr, scale_ptr, scale_2_ptr, rows, row_ok, x_row, H, I, BLOCK_N, BLOCK_K, LOOP, DECODE, X_PAIRS)


@triton.jit
def _expert_nvfp4_gate_up(
    expert, w_ptr, scale_ptr, scale_2_ptr, rows, row_ok, x_row, H: tl.constexpr, I: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    LOOP: tl.constexpr = 0, DECODE: tl.constexpr = 0, X_PAIRS: tl.constexpr = 0,
):
    gate_row = expert * 2 * I + rows  # row index in the [E * 2I, ...] view
    return _nvfp4_gate_up(w_ptr, scale_ptr, scale_2_ptr + expert * 2, gate_row, row_ok, x_row, H, I, BLOCK_N, BLOCK_K, LOOP, DECODE, X_PAIRS)


@triton.jit
def _topk_expert(logits_ptr, weights_ptr, ids_ptr, token, slot, row_block, E, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_TOPK: tl.constexpr):
    """TOPK (module docstring, "top-k in the experts' launch"): the expert of routed slot `slot` of `token`, from the
    token's router logits row [E + 1] (the router launch before wrote it) by the router's own pick (`router._topk_pick`);
    program (slot 0, row block 0) also stores the token's routing row (ids and weights, the shared slot included) for
    the down kernel."""
    SLOTS: tl.constexpr = TOP_K + 1
    logits_row = logits_ptr + token.to(tl.int64) * (E + 1)
    ids, weights, keep = _topk_pick(logits_row, E, TOP_K, BLOCK_E, BLOCK_TOPK, False)
    picks = tl.arange(0, BLOCK_TOPK)
    if slot == 0 and row_block == 0:
        tl.store(weights_ptr + token * SLOTS + picks, weights, mask=keep)
        tl.store(ids_ptr + token * SLOTS + picks, ids, mask=keep)
        _shared_slot(logits_row, weights_ptr + token * SLOTS, ids_ptr + token * SLOTS, E, TOP_K, True, False)
    return tl.sum(tl.where(picks == slot, ids, 0), axis=0).to(tl.int64)


@triton.jit
def _gate_up_kernel(
    x_ptr, ids_ptr, w_ptr, scale_ptr, scale_2_ptr, act_ptr, H: tl.constexpr, I: tl.constexpr,
    TOP_K: tl.constexpr, WEIGHT_NVFP4: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    shared_w_ptr=None, shared_scale_ptr=None, shared_scale_2_ptr=None, SHARED: tl.constexpr = False, LOOP: tl.constexpr = 0, DECODE: tl.constexpr = 0,
    ACT_PAIRS: tl.constexpr = False, X_PAIRS: tl.constexpr = 0,
    logits_ptr=None, weights_ptr=None, E=0, BLOCK_E: tl.constexpr = 1, BLOCK_TOPK: tl.constexpr = 1, TOPK: tl.constexpr = False,
    PDL: tl.constexpr = 0,
):
    pdl.pdl_wait(PDL)
    _gate_up_program(tl.program_id(0), tl.program_id(1), x_ptr, ids_ptr, w_ptr, scale_ptr, scale_2_ptr, act_ptr, H, I, TOP_K, WEIGHT_NVFP4, BLOCK_N,
                     BLOCK_K, shared_w_ptr, shared_scale_ptr, shared_scale_2_ptr, SHARED, LOOP, DECODE, False, ACT_PAIRS, X_PAIRS,
                     logits_ptr, weights_ptr, E, BLOCK_E, BLOCK_TOPK, TOPK, PDL)  # fmt: skip


@triton.jit
def _gate_up_program(
    pair, row_block, x_ptr, ids_ptr, w_ptr, scale_ptr, scale_2_ptr, act_ptr, H: tl.constexpr, I: tl.constexpr,
    TOP_K: tl.constexpr, WEIGHT_NVFP4: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    shared_w_ptr, shared_scale_ptr, shared_scale_2_ptr, SHARED: tl.constexpr, LOOP: tl.constexpr, DECODE: tl.constexpr,
    ROUND_BF16: tl.constexpr = False, ACT_PAIRS: tl.constexpr = False, X_PAIRS: tl.constexpr = 0,
    logits_ptr=None, weights_ptr=None, E=0, BLOCK_E: tl.constexpr = 1, BLOCK_TOPK: tl.constexpr = 1, TOPK: tl.constexpr = False,
    PDL: tl.constexpr = 0,
):
    """act[pair, rows] = silu(gate) * up for the pair p = t * SLOTS + j and gate rows row_block * BLOCK_N.. (module
    docstring, launch 1). ROUND_BF16: round the activation to bfloat16 in float32 first (the interpreter's store truncates).
    ACT_PAIRS (DECODE 3 to 6, BLOCK_N a multiple of 8): store it as the down kernel's float16 pairs instead, int32
    act[pair, rows / 2] in the order of this decode (`nvfp4_half_dot._store_rows_half_pairs`: the bfloat16 rounding, then
    the conversion every down program would repeat). X_PAIRS 1 or 2 (DECODE 3 to 6): x is given as those pairs
    (`_nvfp4_rows_dot`). TOPK (SHARED, NVFP4): a routed slot's expert comes from the router logits (`_topk_expert`),
    not from `ids_ptr`, which the launch then writes with `weights_ptr`. PDL 2 releases the next launch before the stores
    (`kernels/pdl.py`; the caller waited)."""
    SLOTS: tl.constexpr = TOP_K + 1 if SHARED else TOP_K  # slots per token; with SHARED the last one is the shared expert
    rows = row_block * BLOCK_N + tl.arange(0, BLOCK_N)  # gate rows; up rows are I + rows
    row_ok = rows < I
    token = pair // SLOTS
    if DECODE >= 3:  # x is read as int32 (two bfloat16 each)
        x_row = x_ptr + token.to(tl.int64) * (H // 2)
    else:
        x_row = x_ptr + token.to(tl.int64) * H
    if WEIGHT_NVFP4:
        if SHARED:
            if pair % SLOTS == TOP_K:  # uniform per program: the shared expert's own tensors
                gate, up = _nvfp4_gate_up(shared_w_ptr, shared_scale_ptr, shared_scale_2_ptr, rows.to(tl.int64), row_ok, x_row, H, I, BLOCK_N, BLOCK_K, LOOP, DECODE, X_PAIRS)
            elif TOPK:
                expert = _topk_expert(logits_ptr, weights_ptr, ids_ptr, token, pair % SLOTS, row_block, E, TOP_K, BLOCK_E, BLOCK_TOPK)
                gate, up = _expert_nvfp4_gate_up(expert, w_ptr, scale_ptr, scale_2_ptr, rows, row_ok, x_row, H, I, BLOCK_N, BLOCK_K, LOOP, DECODE, X_PAIRS)
            else:
                gate, up = _routed_nvfp4_gate_up(ids_ptr, pair, w_ptr, scale_ptr, scale_2_ptr, rows, row_ok, x_row, H, I, BLOCK_N, BLOCK_K, LOOP, DECODE, X_PAIRS)
        else:
            gate, up = _routed_nvfp4_gate_up(ids_ptr, pair, w_ptr, scale_ptr, scale_2_ptr, rows, row_ok, x_row, H, I, BLOCK_N, BLOCK_K, LOOP, DECODE, X_PAIRS)
    else:
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        gate_row = expert * 2 * I + rows
        up_row = gate_row + I
        gate = tl.zeros((BLOCK_N,), dtype=tl.float32)
        up = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            gate += _dense_rows_dot(w_ptr, gate_row * H, row_ok, x_row, H, k0, BLOCK_K)
            up += _dense_rows_dot(w_ptr, up_row * H, row_ok, x_row, H, k0, BLOCK_K)
    act = gate * tl.sigmoid(gate) * up
    pdl.pdl_release(PDL)
    if ACT_PAIRS:
        _store_rows_half_pairs(act_ptr + pair.to(tl.int64) * (I // 2), row_block, act, True, I, BLOCK_N, DECODE == 3 or DECODE == 5, DECODE >= 5)
    else:
        if ROUND_BF16:
            act = _round_to_bf16(act)
        tl.store(act_ptr + pair.to(tl.int64) * I + rows, act.to(act_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def _down_slot(act_ptr, ids_ptr, weights_ptr, w_ptr, scale_ptr, scale_2_ptr, pair, rows, row_ok, H: tl.constexpr, I: tl.constexpr,
               WEIGHT_NVFP4: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_I: tl.constexpr, DECODE: tl.constexpr = 0, X_PAIRS: tl.constexpr = 0):
    """weight * (down_e rows @ act) [BH] float32 for one (token, slot) pair of a routed expert."""
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    weight = tl.load(weights_ptr + pair)
    if DECODE >= 3:  # act is read as int32 (two bfloat16 each)
        act_row = act_ptr + pair.to(tl.int64) * (I // 2)
    else:
        act_row = act_ptr + pair.to(tl.int64) * I
    down_row = expert * H + rows
    partial = tl.zeros((BLOCK_H,), dtype=tl.float32)
    if WEIGHT_NVFP4:
        for byte0 in tl.static_range(0, I // 2, BLOCK_I):
            partial += _nvfp4_rows_dot(w_ptr, scale_ptr, down_row, row_ok, act_row, I // 2, byte0, BLOCK_H, BLOCK_I, DECODE, X_PAIRS)
        partial *= tl.load(scale_2_ptr + expert) * 16384.0
    else:
        for i0 in tl.static_range(0, I, BLOCK_I):
            partial += _dense_rows_dot(w_ptr, down_row * I, row_ok, act_row, I, i0, BLOCK_I)
    return weight * partial


@triton.jit
def _shared_down(act_ptr, weights_ptr, shared_w_ptr, shared_scale_ptr, shared_scale_2_ptr, pair, rows, row_ok, H: tl.constexpr, I: tl.constexpr,
                 BLOCK_H: tl.constexpr, BLOCK_I: tl.constexpr, DECODE: tl.constexpr, X_PAIRS: tl.constexpr = 0):
    """sigmoid(gate logit) * (shared down rows @ act) [BH] float32 for the shared expert's slot `pair`."""
    if DECODE >= 3:
        act_row = act_ptr + pair.to(tl.int64) * (I // 2)
    else:
        act_row = act_ptr + pair.to(tl.int64) * I
    partial = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for byte0 in range(0, I // 2, BLOCK_I):
        partial += _nvfp4_rows_dot(shared_w_ptr, shared_scale_ptr, rows.to(tl.int64), row_ok, act_row, I // 2, byte0, BLOCK_H, BLOCK_I, DECODE, X_PAIRS)
    return tl.load(weights_ptr + pair) * (partial * (tl.load(shared_scale_2_ptr) * 16384.0))


@triton.jit
def _down_kernel(
    act_ptr, ids_ptr, weights_ptr, w_ptr, scale_ptr, scale_2_ptr, out_ptr, H: tl.constexpr, I: tl.constexpr,
    TOP_K: tl.constexpr, WEIGHT_NVFP4: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_I: tl.constexpr,
    shared_w_ptr=None, shared_scale_ptr=None, shared_scale_2_ptr=None, SHARED: tl.constexpr = False, LOOP: tl.constexpr = 0, DECODE: tl.constexpr = 0,
    SPLIT: tl.constexpr = 1, workspace_ptr=None, counter_ptr=None, X_PAIRS: tl.constexpr = 0, PDL: tl.constexpr = 0,
):
    """Grid (T, cdiv(H, BLOCK_H)[, SPLIT]). With SPLIT > 1 the token's slots are dealt over SPLIT programs (slot j
    to part j % SPLIT, the shared slot counting as slot TOP_K); each stores its float32 sum over its slots, in slot
    order, in `workspace [SPLIT, T, H]` and takes a ticket from `counter_ptr [T * cdiv(H, BLOCK_H)]` (zero between
    calls); the program drawing the last ticket adds the parts in part order, writes `out` and resets the counter.
    The sum's order is fixed, so the result does not depend on which program finishes last. PDL: `kernels/pdl.py`."""
    pdl.pdl_wait(PDL)
    SLOTS: tl.constexpr = TOP_K + 1 if SHARED else TOP_K
    token = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = rows < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    if SPLIT > 1:
        part = tl.program_id(2)
        for j in tl.static_range(TOP_K):
            if j % SPLIT == part:  # uniform per program
                acc += _down_slot(act_ptr, ids_ptr, weights_ptr, w_ptr, scale_ptr, scale_2_ptr, token * SLOTS + j, rows, row_ok, H, I, WEIGHT_NVFP4, BLOCK_H, BLOCK_I, DECODE, X_PAIRS)
        if SHARED:  # noqa: SIM102 - constexpr outer test, runtime inner one
            if TOP_K % SPLIT == part:
                acc += _shared_down(act_ptr, weights_ptr, shared_w_ptr, shared_scale_ptr, shared_scale_2_ptr, token * SLOTS + TOP_K, rows, row_ok, H, I,
                                    BLOCK_H, BLOCK_I, DECODE, X_PAIRS)  # fmt: skip
        T = tl.num_programs(0)
        pdl.pdl_release(PDL)
        tl.store(workspace_ptr + (part * T + token).to(tl.int64) * H + rows, acc, mask=row_ok)
        tl.debug_barrier()  # every thread's part is stored before the ticket is taken (release, GPU scope)
        counter = counter_ptr + token * tl.num_programs(1) + tl.program_id(1)
        ticket = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT - 1:  # the last part of this row block: all parts are visible (acquire)
            total = tl.zeros((BLOCK_H,), dtype=tl.float32)
            for other in range(SPLIT):
                total += tl.load(workspace_ptr + (other * T + token).to(tl.int64) * H + rows, mask=row_ok, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + token.to(tl.int64) * H + rows, total.to(out_ptr.dtype.element_ty), mask=row_ok)
            tl.store(counter, 0)
    else:
        if LOOP == 1:  # unrolled over the experts: their loads may all be in flight
            for j in tl.static_range(TOP_K):
                acc += _down_slot(act_ptr, ids_ptr, weights_ptr, w_ptr, scale_ptr, scale_2_ptr, token * SLOTS + j, rows, row_ok, H, I, WEIGHT_NVFP4, BLOCK_H, BLOCK_I, DECODE, X_PAIRS)
        elif LOOP > 1:  # pipelined over the experts
            for j in tl.range(TOP_K, num_stages=LOOP):
                acc += _down_slot(act_ptr, ids_ptr, weights_ptr, w_ptr, scale_ptr, scale_2_ptr, token * SLOTS + j, rows, row_ok, H, I, WEIGHT_NVFP4, BLOCK_H, BLOCK_I, DECODE, X_PAIRS)
        else:
            for j in range(TOP_K):
                acc += _down_slot(act_ptr, ids_ptr, weights_ptr, w_ptr, scale_ptr, scale_2_ptr, token * SLOTS + j, rows, row_ok, H, I, WEIGHT_NVFP4, BLOCK_H, BLOCK_I, DECODE, X_PAIRS)
        if SHARED:  # the last slot: the shared expert, weight = sigmoid(its gate logit)
            acc += _shared_down(act_ptr, weights_ptr, shared_w_ptr, shared_scale_ptr, shared_scale_2_ptr, token * SLOTS + TOP_K, rows, row_ok, H, I, BLOCK_H, BLOCK_I, DECODE, X_PAIRS)
        pdl.pdl_release(PDL)
        tl.store(out_ptr + token.to(tl.int64) * H + rows, acc.to(out_ptr.dtype.element_ty), mask=row_ok)


# Tiles and loop form (benchmarks/kernels/time_moe_decode.py compares settings on the GPU):
LOOP = 0  # loops over K (gate/up) and over the experts (down): 0 plain, 1 unrolled, n >= 2 pipelined n stages
GATE_UP_BLOCK_N, GATE_UP_BLOCK_K = 16, 128  # rows of gate (and of up) per program, packed bytes per K step
DOWN_BLOCK_H, DOWN_BLOCK_I = 16, 128  # output rows per program, packed bytes per K step
WORDS = 0  # NVFP4 weight reads: 0 bytes, 1 int32 words with two codes decoded per shift and mask (`_nvfp4_rows_dot_words`),
# 2 (bfloat16 x; otherwise 1): int64 scale blocks, products in packed float16 pairs (`nvfp4_half_dot`), 3: as 2 with the
# E4M3 decode (`nvfp4_half_dot`, FP8 on)
ACT_PAIRS = 0  # bfloat16 x, half decode: 1 or 2, the gate/up kernel stores the activation as the down kernel's float16 pairs,
# read in `_half_rows_dot`'s load form 1 or 2 (tuning key `moe_act_pairs`; benchmarks/kernels/time_float16_pairs.py)
X_PAIRS = 0  # the same for x: with the norm folded into the fused router (`router_add_norm`), that launch writes the normed
# x as the gate/up kernel's float16 pairs, read in load form 1 or 2 (tuning key `moe_x_pairs`; time_float16_pairs.py)
# Top-k in the experts' launch (module docstring; tuning key `moe_gate_up_topk_max_tokens`, timed by
# benchmarks/kernels/time_launch_folds.py): up to this many tokens the fused router launch writes the logits only and every
# routed gate/up program picks its own expert from them; 0 off until timed.
GATE_UP_TOPK_MAX_TOKENS = 0
DOWN_SPLIT = 1  # programs a token's down slots are dealt over (ticket-ordered sum); run22: no faster at 1 or 32 tokens, so off
PERSISTENT = False  # one token: router, gate/up and down in one persistent launch (`moe_block_persistent`, its `PLAN`)
BATCH_ONE: tuple[int, ...] | None = None  # (LOOP, GATE_UP_BLOCK_N, GATE_UP_BLOCK_K, DOWN_BLOCK_H, DOWN_BLOCK_I, WORDS[, DOWN_SPLIT]) for one token
# ((max_tokens, settings as BATCH_ONE), ...) by ascending max_tokens, for 2 tokens and up (tuning `moe_decode_small_batches`;
# run80 on an H200: batch one's tiles at 2 tokens took 31.0 us against 61.8 with the module's)
SMALL_BATCHES: tuple[tuple[int, tuple[int, ...]], ...] = ()


def _settings(num_tokens: int) -> tuple[int, int, int, int, int, int, int]:
    """The loop form, tiles, weight reads and down split for this many tokens: `BATCH_ONE` for one token when set, then
    the first `SMALL_BATCHES` entry whose ceiling covers the batch, else the module's."""
    if num_tokens == 1 and BATCH_ONE is not None:
        return (*BATCH_ONE, 1)[:7]
    for max_tokens, settings in SMALL_BATCHES:
        if 2 <= num_tokens <= max_tokens:
            return (*settings, 1)[:7]
    return LOOP, GATE_UP_BLOCK_N, GATE_UP_BLOCK_K, DOWN_BLOCK_H, DOWN_BLOCK_I, WORDS, DOWN_SPLIT


def _launch(
    x, topk_weights, topk_ids, gate_up, gate_up_scale, gate_up_scale_2, down, down_scale, down_scale_2, intermediate, out, nvfp4: bool,
    shared: SharedNvfp4Expert | None = None, x_pairs: torch.Tensor | None = None, logits: torch.Tensor | None = None,
) -> None:
    """Both kernels; with `shared` the routing rows are [T, top_k + 1] and the last slot is the shared expert. `x_pairs`:
    x as float16 pairs in the order of this batch's decode (`x_pairs_order`), read instead of x with `X_PAIRS`. `logits`
    (with `shared`, NVFP4): the router's [T, E + 1] logits; the gate/up kernel picks the experts itself (`topk_in_experts`)
    and writes `topk_ids` and `topk_weights` (contiguous) for the down kernel."""
    num_tokens, hidden = x.shape
    slots = topk_ids.shape[1]
    top_k = slots - 1 if shared is not None else slots
    if num_tokens == 0:
        return
    loop, gate_up_block_n, gate_up_block_k, down_block_h, down_block_i, words, down_split = _settings(num_tokens)
    decode = 0
    half = nvfp4 and words in (2, 3) and x.dtype == torch.bfloat16
    if half:  # int64 views of the codes (one scale block each), int32 views of x and of the activation
        decode = (4 if interpreting() else 3) + (2 if words == 3 else 0)
        gate_up, down = gate_up.view(torch.int64), down.view(torch.int64)
        if shared is not None:
            shared = SharedNvfp4Expert(*(t.view(torch.int64) if t.dtype == torch.uint8 else t for t in expert_tensors(shared)))
    elif nvfp4 and words:  # int32 views of the codes (rows of H/2 and I/2 bytes, multiples of 8)
        decode = 1 if interpreting() else 2
        gate_up, down = gate_up.view(torch.int32), down.view(torch.int32)
        if shared is not None:
            shared = SharedNvfp4Expert(*(t.view(torch.int32) if t.dtype == torch.uint8 else t for t in expert_tensors(shared)))
    gate_up_shared, down_shared = {}, {}  # extra kernel arguments for the fused shared expert
    if shared is not None:
        names = ("shared_w_ptr", "shared_scale_ptr", "shared_scale_2_ptr")
        gate_up_shared = dict(zip(names, (shared.gate_up_packed, shared.gate_up_scale, shared.gate_up_scale_2))) | {"SHARED": True}
        down_shared = dict(zip(names, (shared.down_packed, shared.down_scale, shared.down_scale_2))) | {"SHARED": True}
    block_n = min(gate_up_block_n, next_power_of_2(intermediate))
    act_pairs = ACT_PAIRS if half and block_n % 8 == 0 else 0
    # Under the interpreter the activation is written in float32 and rounded by torch (the interpreter truncates); as
    # float16 pairs it is int32 [T*slots, I/2], rounded in the kernel.
    act_dtype = torch.float32 if interpreting() else x.dtype
    if act_pairs:
        act = torch.empty(num_tokens * slots, intermediate // 2, dtype=torch.int32, device=x.device)
    else:
        act = torch.empty(num_tokens * slots, intermediate, dtype=act_dtype, device=x.device)  # [T*slots, I]
    block_k = min(gate_up_block_k, next_power_of_2(hidden // 2 if nvfp4 else hidden))
    x = x.contiguous()
    ids = topk_ids.contiguous()
    x_pairs_form = X_PAIRS if half and x_pairs is not None else 0
    if logits is not None:  # the routing rows are this launch's outputs (`_topk_expert`)
        if shared is None or not nvfp4 or not (topk_ids.is_contiguous() and topk_weights.is_contiguous()):
            raise ValueError("the top-k in the experts' launch needs NVFP4 experts with the shared slot and contiguous routing rows")
        num_experts = logits.shape[1] - 1
        gate_up_shared |= {"logits_ptr": logits, "weights_ptr": topk_weights, "E": num_experts, "BLOCK_E": next_power_of_2(num_experts),
                           "BLOCK_TOPK": next_power_of_2(top_k), "TOPK": True}  # fmt: skip
    _gate_up_kernel[(num_tokens * slots, cdiv(intermediate, block_n))](
        x_pairs if x_pairs_form else x.view(torch.int32) if half else x, ids, gate_up, gate_up_scale, gate_up_scale_2, act, hidden, intermediate,
        TOP_K=top_k, WEIGHT_NVFP4=nvfp4, BLOCK_N=block_n, BLOCK_K=block_k, LOOP=loop, DECODE=decode, ACT_PAIRS=bool(act_pairs),
        X_PAIRS=x_pairs_form, **gate_up_shared, **pdl.launch_args(),
    )
    if not act_pairs:
        if act.dtype != x.dtype:
            act = act.to(x.dtype).to(act_dtype)  # round-to-nearest-even into x's dtype, as on the GPU
        if half:
            act = act.to(x.dtype).view(torch.int32)
    block_h = min(down_block_h, next_power_of_2(hidden))
    block_i = min(down_block_i, next_power_of_2(intermediate // 2 if nvfp4 else intermediate))
    buffer = staging_buffer(out)
    target = buffer if buffer.is_contiguous() else torch.empty(buffer.shape, dtype=buffer.dtype, device=buffer.device)
    row_blocks = cdiv(hidden, block_h)
    split = max(1, min(down_split, slots))
    if split > 1:
        down_shared |= {"SPLIT": split, "workspace_ptr": torch.empty(split, num_tokens, hidden, dtype=torch.float32, device=x.device),
                        "counter_ptr": ticket_counters(x.device, num_tokens * row_blocks)}  # fmt: skip
    _down_kernel[(num_tokens, row_blocks, split)](
        act, ids, topk_weights.contiguous(), down, down_scale, down_scale_2, target, hidden, intermediate,
        TOP_K=top_k, WEIGHT_NVFP4=nvfp4, BLOCK_H=block_h, BLOCK_I=block_i, LOOP=loop, DECODE=decode, X_PAIRS=act_pairs,
        **down_shared, **pdl.launch_args(),
    )
    if target is not buffer:
        buffer.copy_(target)
    finish(buffer, out)


@satisfies("moe/routed-experts", major=1, devices=("cuda",), backend="triton")
def routed_experts(
    x: torch.Tensor,  # [T, H]
    topk_weights: torch.Tensor,  # [T, top_k] float32
    topk_ids: torch.Tensor,  # [T, top_k] int32
    gate_up_proj: torch.Tensor,  # [E, 2I, H]
    down_proj: torch.Tensor,  # [E, H, I]
    out: torch.Tensor,  # [T, H]
) -> None:
    """out[t] = sum_j w[t, j] * down_e(silu(gate_e x_t) * up_e x_t), e = topk_ids[t, j]; dense weights."""
    _, _, _, num_experts, intermediate = check_routed_experts(x, topk_weights, topk_ids, gate_up_proj, down_proj, out)
    require_launchable(x, topk_weights, topk_ids, gate_up_proj, down_proj, out)
    if not capturing(x):
        _check_expert_range(topk_ids, num_experts)
    gate_up, down = gate_up_proj.contiguous(), down_proj.contiguous()
    _launch(x, topk_weights, topk_ids, gate_up, gate_up, gate_up, down, down, down, intermediate, out, nvfp4=False)


def nvfp4_routed_experts(
    x: torch.Tensor,  # [T, H]
    topk_weights: torch.Tensor,  # [T, top_k] float32
    topk_ids: torch.Tensor,  # [T, top_k] int32
    experts: StackedNvfp4Experts,
    out: torch.Tensor,  # [T, H]
) -> None:
    """Routed experts over stacked NVFP4 weights, decoded in registers; the signature of `ops.static_moe.nvfp4_routed_experts`."""
    _require(x.dim() == 2, f"x must be [T, H], got shape {tuple(x.shape)}")
    _require(x.dtype in (torch.float32, torch.bfloat16, torch.float16), f"x must be float32, bfloat16 or float16, got {x.dtype}")
    num_tokens, hidden = x.shape
    _check_routing(topk_weights, topk_ids, num_tokens)
    _check_out(out, (num_tokens, hidden), x.dtype, "out")
    num_experts, double_intermediate, half_hidden = experts.gate_up_packed.shape
    intermediate = double_intermediate // 2
    _require(half_hidden * 2 == hidden and hidden % 16 == 0, f"gate_up_packed must be [E, 2I, H/2={hidden // 2}] with H % 16 == 0, got {tuple(experts.gate_up_packed.shape)}")
    _require(intermediate % 16 == 0, f"I ({intermediate}) must be a multiple of 16")
    expected = {
        "gate_up_packed": ((num_experts, 2 * intermediate, hidden // 2), torch.uint8),
        "gate_up_scale": ((num_experts, 2 * intermediate, hidden // 16), torch.float8_e4m3fn),
        "gate_up_scale_2": ((num_experts, 2), torch.float32),
        "down_packed": ((num_experts, hidden, intermediate // 2), torch.uint8),
        "down_scale": ((num_experts, hidden, intermediate // 16), torch.float8_e4m3fn),
        "down_scale_2": ((num_experts,), torch.float32),
    }
    for name, (shape, dtype) in expected.items():
        tensor = getattr(experts, name)
        _require(tuple(tensor.shape) == shape and tensor.dtype == dtype, f"experts.{name} must be {dtype} {shape}, got {tensor.dtype} {tuple(tensor.shape)}")
    tensors = [getattr(experts, name).contiguous() for name in expected]
    require_launchable(x, topk_weights, topk_ids, out, *tensors)
    if not capturing(x):
        _check_expert_range(topk_ids, num_experts)
    _launch(x, topk_weights, topk_ids, *tensors[:3], *tensors[3:], intermediate, out, nvfp4=True)


_STACKED = ("gate_up_packed", "gate_up_scale", "gate_up_scale_2", "down_packed", "down_scale", "down_scale_2")
_SHARED = _STACKED  # SharedNvfp4Expert has the same fields, without the expert dimension


def nvfp4_experts_with_shared(
    x: torch.Tensor,  # [T, H]
    topk_weights: torch.Tensor,  # [T, top_k + 1] float32; column top_k: sigmoid(shared gate logit)
    topk_ids: torch.Tensor,  # [T, top_k + 1] int32; column top_k: E (sentinel, not read: the slot is told by position)
    experts: StackedNvfp4Experts,
    shared: SharedNvfp4Expert,
    out: torch.Tensor,  # [T, H]
) -> None:
    """Routed experts plus the weighted shared expert, one float32 sum per output; the signature of
    `ops.static_moe.nvfp4_experts_with_shared`."""
    _, _, top_k, intermediate = check_experts_with_shared(x, topk_weights, topk_ids, experts, shared, out)
    routed, shared_tensors = _contiguous_experts(x, experts, shared)
    require_launchable(x, topk_weights, topk_ids, out)
    if not capturing(x):
        _check_expert_range(topk_ids[:, :top_k], experts.num_experts)
    _launch(x, topk_weights, topk_ids, *routed, intermediate, out, nvfp4=True, shared=shared_tensors)


@satisfies("moe/moe-block-decode", major=1, devices=("cuda",), backend="triton")
def moe_block_decode(
    x: torch.Tensor,  # [T, H]
    router_weight: torch.Tensor,  # [E+1, H]: router rows, then shared_expert_gate's row
    experts: StackedNvfp4Experts,
    shared: SharedNvfp4Expert,
    top_k: int,
    out: torch.Tensor,  # [T, H]
) -> None:
    """The whole sparse MoE block for decode: router logits and top-k with the shared slot (one launch up to
    `router.FUSED_ROUTER_MAX_TOKENS` tokens, cuBLAS logits plus the top-k kernel above), then the gate/up and
    down kernels; the signature of `ops.static_moe.moe_block_decode`.
    No host synchronisation: the expert ids come from the router kernel, in range by construction."""
    check_moe_block_decode(x, router_weight, experts, shared, top_k, out)
    require_launchable(x, router_weight, out)
    _block(x, router_weight, experts, shared, top_k, out)


def folds_norm(x: torch.Tensor, router_weight: torch.Tensor) -> bool:
    """True when `moe_block_decode_add_norm` hands the norm to the fused router launch (`router.ADD_NORM`)."""
    num_tokens, hidden = x.shape
    return (router.ADD_NORM and num_tokens <= router.FUSED_ROUTER_MAX_TOKENS and not (PERSISTENT and num_tokens == 1)
            and x.is_contiguous() and router_weight.is_contiguous() and next_power_of_2(hidden) <= router.ROUTER_BLOCK_H)  # fmt: skip


def moe_block_decode_add_norm(
    x: torch.Tensor,  # [T, H]: the mixer's output, not yet added to the residual stream
    add_norm: AddNorm,
    router_weight: torch.Tensor,  # [E+1, H]
    experts: StackedNvfp4Experts,
    shared: SharedNvfp4Expert,
    top_k: int,
    out: torch.Tensor,  # [T, H]
) -> None:
    """`ops.static_moe.moe_block_decode_add_norm`: the norm before the block, then the block. Where `folds_norm`, the
    fused router launch does the norm (router module docstring): one launch less; else the norm kernel, then the block."""
    add_norm.check(x)
    check_moe_block_decode(x, router_weight, experts, shared, top_k, out)
    require_launchable(x, router_weight, out, add_norm.residual, add_norm.weight, add_norm.out, add_norm.residual_out)
    if folds_norm(x, router_weight):
        _block(add_norm.out, router_weight, experts, shared, top_k, out, router_x=x, add_norm=add_norm)
        return
    add_norm.apply(x, norms.fused_add_rms_norm)
    _block(add_norm.out, router_weight, experts, shared, top_k, out)


def _block(x, router_weight, experts, shared, top_k, out, router_x=None, add_norm=None) -> None:
    """The block on normed x; with `add_norm` the fused router reads `router_x` (un-normed) and writes x itself."""
    num_tokens = x.shape[0]
    if PERSISTENT and num_tokens == 1:  # the whole block in one persistent launch (tuning key `moe_block_persistent`)
        from reference_engine.kernels import (
            moe_block_persistent,  # it imports this module's device functions
        )

        moe_block_persistent.moe_block_persistent(x, router_weight, experts, shared, top_k, out)
        return
    from reference_engine.kernels import (
        moe_pairs_fused,  # it imports this module's device functions
    )

    grouped = moe_grouped_half.runs(num_tokens, x.dtype) or (moe_grouped_decode.MIN_TOKENS is not None and num_tokens >= moe_grouped_decode.MIN_TOKENS)
    if not grouped and moe_pairs_fused.runs_block(num_tokens, x, router_weight):  # router and experts in one launch (`moe_pairs_fused_block`)
        routed, shared_tensors = _contiguous_experts(x, experts, shared)
        require_launchable(router_weight, x)
        moe_pairs_fused.fused_block_with_shared(x, router_weight, StackedNvfp4Experts(*routed), shared_tensors, top_k, out, _settings(num_tokens)[:3],
                                                router_x=router_x, add_norm=add_norm)  # fmt: skip
        return
    topk_weights = torch.empty(num_tokens, top_k + 1, dtype=torch.float32, device=x.device)
    topk_ids = torch.empty(num_tokens, top_k + 1, dtype=torch.int32, device=x.device)
    x_pairs = logits = None
    if num_tokens <= router.FUSED_ROUTER_MAX_TOKENS and x.is_contiguous() and router_weight.is_contiguous():
        prefetch = experts if router.PREFETCH_EXPERTS and not interpreting() else None  # selected experts into L2 (tuning)
        order = None if add_norm is None else x_pairs_order(num_tokens, x)  # the launch's norm also writes x as the experts' pairs
        if order is not None:
            x_pairs = torch.empty(num_tokens, x.shape[1] // 2, dtype=torch.int32, device=x.device)
        if topk_in_experts(num_tokens, x) and prefetch is None:  # the router launch writes logits only; gate/up picks the experts
            logits = torch.empty(num_tokens, router_weight.shape[0], dtype=x.dtype, device=x.device)
            router_gemv_logits(x if add_norm is None else router_x, router_weight, logits, add_norm=add_norm, pairs_out=x_pairs, pairs_fp8=bool(order))
        else:
            router_gemv_topk_with_shared(x if add_norm is None else router_x, router_weight, topk_weights, topk_ids, top_k, prefetch=prefetch,
                                         add_norm=add_norm, pairs_out=x_pairs, pairs_fp8=bool(order))  # fmt: skip
    else:
        if add_norm is not None:  # `folds_norm` chose the fused router: its conditions are this branch's
            raise AssertionError("the norm was handed to a router launch that does not run")
        logits = aligned_linear(x, router_weight)  # [T, E+1]; over the zero rows past E+1 where the storage holds them
        router_topk_with_shared(logits, topk_weights, topk_ids, top_k)
    if moe_grouped_half.runs(num_tokens, x.dtype):  # each expert decoded once per chunk of up to 4 of its tokens, CUDA cores
        moe_grouped_half.half_grouped_experts_with_shared(x, topk_weights, topk_ids, experts, shared, out, check_ids=False)
        return
    if moe_grouped_decode.MIN_TOKENS is not None and num_tokens >= moe_grouped_decode.MIN_TOKENS:  # each expert decoded once per batch
        moe_grouped_decode.grouped_experts_with_shared(x, topk_weights, topk_ids, experts, shared, out, check_ids=False)
        return
    routed, shared_tensors = _contiguous_experts(x, experts, shared)
    if moe_pairs_fused.runs(num_tokens, x.dtype):  # gate/up and down in one launch (tuning key `moe_pairs_fused_max_tokens`)
        loop, block_n, block_k = _settings(num_tokens)[:3]
        moe_pairs_fused.fused_pairs_with_shared(x.contiguous(), topk_weights, topk_ids, StackedNvfp4Experts(*routed), shared_tensors, out, (loop, block_n, block_k))
        return
    _launch(x, topk_weights, topk_ids, *routed, int(experts.gate_up_packed.shape[1]) // 2, out, nvfp4=True, shared=shared_tensors, x_pairs=x_pairs,
            logits=logits)  # fmt: skip


def _per_pair_experts(num_tokens: int, x: torch.Tensor) -> bool:
    """True when `_block`'s experts at this batch run this module's two per-pair launches (`_launch`), not the persistent,
    grouped or fused-pairs kernels."""
    from reference_engine.kernels import moe_pairs_fused

    return not (PERSISTENT and num_tokens == 1 or moe_grouped_half.runs(num_tokens, x.dtype)
                or moe_grouped_decode.MIN_TOKENS is not None and num_tokens >= moe_grouped_decode.MIN_TOKENS or moe_pairs_fused.runs(num_tokens, x.dtype))  # fmt: skip


def x_pairs_order(num_tokens: int, x: torch.Tensor) -> bool | None:
    """The order of the x pairs `_launch` would read at this batch: True for the E4M3 decode's, False for the plain one,
    None where it reads none (`X_PAIRS` off, no half decode, x not bfloat16, or the batch runs other kernels)."""
    if not X_PAIRS or x.dtype != torch.bfloat16 or not _per_pair_experts(num_tokens, x):
        return None
    words = _settings(num_tokens)[5]
    return None if words not in (2, 3) else words == 3


def topk_in_experts(num_tokens: int, x: torch.Tensor) -> bool:
    """True when the fused router's launch at this batch writes logits only and the gate/up launch picks the experts
    (up to `GATE_UP_TOPK_MAX_TOKENS` tokens; module docstring, "top-k in the experts' launch")."""
    return 1 <= num_tokens <= min(GATE_UP_TOPK_MAX_TOKENS, router.FUSED_ROUTER_MAX_TOKENS) and _per_pair_experts(num_tokens, x)


def _contiguous_experts(x, experts: StackedNvfp4Experts, shared: SharedNvfp4Expert) -> tuple[list[torch.Tensor], SharedNvfp4Expert]:
    """The routed experts' tensors (in `_STACKED` order) and the shared expert, contiguous, checked launchable with x."""
    routed = [getattr(experts, name).contiguous() for name in _STACKED]
    shared_tensors = SharedNvfp4Expert(*(getattr(shared, name).contiguous() for name in _SHARED))
    require_launchable(x, *routed, *expert_tensors(shared_tensors))
    return routed, shared_tensors


def stack_nvfp4_experts(
    gate: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    up: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    down: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
) -> StackedNvfp4Experts:
    """Per-expert (weight_packed, weight_scale, weight_scale_2) of gate [I, H], up [I, H], down [H, I] -> the
    stacked layout the kernels read (once, at load time; `model/experts.py` does the same for its Linears)."""
    _require(len(gate) == len(up) == len(down) >= 1, f"need as many gate, up and down experts, got {len(gate)}, {len(up)}, {len(down)}")
    return StackedNvfp4Experts(
        gate_up_packed=torch.stack([torch.cat([g[0], u[0]]) for g, u in zip(gate, up)]),  # [E, 2I, H/2]
        gate_up_scale=torch.stack([torch.cat([g[1], u[1]]) for g, u in zip(gate, up)]),  # [E, 2I, H/16]
        gate_up_scale_2=torch.stack([torch.stack([torch.as_tensor(g[2]).reshape(()), torch.as_tensor(u[2]).reshape(())]).float() for g, u in zip(gate, up)]),  # [E, 2]
        down_packed=torch.stack([d[0] for d in down]),  # [E, H, I/2]
        down_scale=torch.stack([d[1] for d in down]),  # [E, H, I/16]
        down_scale_2=torch.stack([torch.as_tensor(d[2]).reshape(()).float() for d in down]),  # [E]
    )
