"""Fused MoE router: softmax (float32) + top-k + renormalise, one program per token (contract moe/router-topk).

The program loads the token's E logits once (E = 256 fits one block), then picks top_k times the
largest remaining logit, the lowest index among equal ones, with one max-reduction per pick over
int64 keys (the logit's float bits made order-preserving, then the reversed index); a chosen key is
replaced by the smallest int64, so -inf logits and repeated values cannot select an expert twice. Selecting on logits equals selecting on the
float32 probabilities except for logits within an ulp of each other. The weights are
exp(l_i - l_max) over their sum across the chosen experts: the full softmax's normaliser cancels
in the renormalisation, so it is never computed. Rows come out in decreasing order, ties toward
the lower index, as the torch op orders them.

With `WITH_SHARED` (`router_topk_with_shared`) the logits row has E+1 columns: the softmax and the
top-k still read columns 0..E-1 only, and the program also reads column E (the shared expert's gate
logit) and writes a (top_k+1)-th slot: id E (sentinel: "shared expert"), weight sigmoid(logit E)
in float32. Output rows are then top_k+1 wide.

The fused launch (`router_gemv_topk_with_shared`) can also start a bulk L2 prefetch of the selected experts' weights
from the program that finishes a token's top-k (`PREFETCH_EXPERTS`, tuning key `moe_expert_prefetch`; off, not yet
timed on a GPU).

With an `AddNorm` (`ADD_NORM`, tuning key `router_add_norm`) the fused launch also does the fused add + RMSNorm that
precedes the block: every program reads the token's un-normed input x and the residual (H values each, one step),
forms residual_out = x + residual rounded to x's dtype, its RMSNorm times (1 + w) rounded likewise, and computes its
logits rows from that; program 0 of the token stores both rows for the expert launches that follow. The arithmetic is
the norm kernel's (`norms._rms_norm_kernel`, FUSED_ADD) in the same order, so a decode MoE block needs one launch less.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_engine.kernels import pdl
from reference_engine.kernels.gemv_pairs import check_pairs_out
from reference_engine.kernels.launch import (
    cdiv,
    interpreting,
    next_power_of_2,
    require_launchable,
    ticket_counters,
)
from reference_engine.kernels.norms import _round_to_bf16
from reference_engine.kernels.nvfp4_half_dot import _store_rows_half_pairs
from reference_engine.ops.moe import _check_out, _require, check_router_with_shared
from reference_engine.ops.norms import AddNorm
from reference_engine.ops.registry import satisfies


@triton.jit
def _topk_pick(logits_row, E, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, COHERENT: tl.constexpr):
    """One token's top-k from its logits row, in registers: (ids [BK] int32, weights [BK] float32, keep [BK]: slot <
    TOP_K). COHERENT: read the logits from L2 (other programs of the same kernel wrote them)."""
    experts = tl.arange(0, BLOCK_E)
    valid = experts < E
    if COHERENT:
        logits = tl.load(logits_row + experts, mask=valid, other=float("-inf"), cache_modifier=".cg").to(tl.float32)  # [BE]
    else:
        logits = tl.load(logits_row + experts, mask=valid, other=float("-inf")).to(tl.float32)  # [BE]
    # One reduction per pick: a signed int64 key orders like the logit (float bits made monotone in the high
    # word) and, among equal logits, puts the lower index first (BLOCK_E - 1 - index in the low word).
    bits = logits.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    keys = (ordered.to(tl.int64) << 32) | (BLOCK_E - 1 - experts).to(tl.int64)
    keys = tl.where(valid, keys, -9223372036854775807 - 1)  # padding columns: never chosen before a real expert
    slots = tl.arange(0, BLOCK_K)
    chosen_ids = tl.zeros((BLOCK_K,), dtype=tl.int32)
    chosen_logits = tl.full((BLOCK_K,), float("-inf"), dtype=tl.float32)
    for slot in range(TOP_K):
        best = tl.max(keys, axis=0)
        index = (BLOCK_E - 1 - (best & 0xFFFFFFFF)).to(tl.int32)
        high = (best >> 32).to(tl.int32)
        value = (high ^ ((high >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
        keys = tl.where(experts == index, -9223372036854775807 - 1, keys)
        chosen_ids = tl.where(slots == slot, index, chosen_ids)
        chosen_logits = tl.where(slots == slot, value, chosen_logits)
    top = tl.max(chosen_logits, axis=0)
    keep = slots < TOP_K
    numerators = tl.where(keep, tl.exp(chosen_logits - top), 0.0)
    weights = numerators / tl.sum(numerators, axis=0)
    return chosen_ids, weights, keep


@triton.jit
def _topk_row(logits_row, weights_row, ids_row, E, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
              WITH_SHARED: tl.constexpr, COHERENT: tl.constexpr):
    """One token's top-k from its logits row (pointers to the row and to its output rows), stored with the shared
    slot when WITH_SHARED. COHERENT: read the logits from L2 (other programs of the same kernel wrote them)."""
    chosen_ids, weights, keep = _topk_pick(logits_row, E, TOP_K, BLOCK_E, BLOCK_K, COHERENT)
    slots = tl.arange(0, BLOCK_K)
    tl.store(weights_row + slots, weights, mask=keep)
    tl.store(ids_row + slots, chosen_ids, mask=keep)
    _shared_slot(logits_row, weights_row, ids_row, E, TOP_K, WITH_SHARED, COHERENT)
    return chosen_ids, keep


@triton.jit
def _shared_slot(logits_row, weights_row, ids_row, E, TOP_K: tl.constexpr, WITH_SHARED: tl.constexpr, COHERENT: tl.constexpr):
    """The (top_k+1)-th slot: id E, weight sigmoid(logit E), when the row carries the shared expert's gate logit."""
    if WITH_SHARED:
        if COHERENT:
            shared_logit = tl.load(logits_row + E, cache_modifier=".cg").to(tl.float32)
        else:
            shared_logit = tl.load(logits_row + E).to(tl.float32)
        tl.store(weights_row + TOP_K, tl.sigmoid(shared_logit))
        tl.store(ids_row + TOP_K, E)


@triton.jit
def _prefetch_expert_spans(base, ids, id_ok, PER_EXPERT: tl.constexpr, CHUNK: tl.constexpr, NCH: tl.constexpr,
                           MODE: tl.constexpr, record_ptr, record_at, BLOCK_K: tl.constexpr):
    """The selected experts' spans of one stacked tensor (expert e: bytes base + e * PER_EXPERT, PER_EXPERT long), in
    chunks of CHUNK bytes. MODE 1: one bulk L2 prefetch per chunk (not waited for); MODE 2 (tests, the interpreter):
    store each chunk's (address, bytes) at rows record_at.. of `record_ptr` (int64 [n, 2]) instead."""
    chunk = tl.arange(0, NCH)
    offset = chunk.to(tl.int64) * CHUNK
    ok = id_ok[:, None] & (offset[None, :] < PER_EXPERT)  # [BK, NCH]
    address = base + ids[:, None].to(tl.int64) * PER_EXPERT + offset[None, :]
    size = tl.where(ok, tl.minimum(PER_EXPERT - offset[None, :], CHUNK), 0).to(tl.int32)
    if MODE == 1:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [address, size], dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip
    elif MODE == 2:
        row = record_at + tl.arange(0, BLOCK_K)[:, None] * NCH + chunk[None, :]
        tl.store(record_ptr + 2 * row, tl.where(ok, address, 0))
        tl.store(record_ptr + 2 * row + 1, size.to(tl.int64))


@triton.jit
def _router_topk_kernel(
    logits_ptr, weights_ptr, ids_ptr, E, stride_t, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    WITH_SHARED: tl.constexpr = False, PDL: tl.constexpr = 0,
):
    pdl.pdl_wait(PDL)  # a kernel this small releases the next one only by ending
    token = tl.program_id(0).to(tl.int64)
    ROW: tl.constexpr = TOP_K + 1 if WITH_SHARED else TOP_K
    _topk_row(logits_ptr + token * stride_t, weights_ptr + token * ROW, ids_ptr + token * ROW, E, TOP_K, BLOCK_E, BLOCK_K, WITH_SHARED, False)


@triton.jit
def _router_logits_rows(x_row, w_ptr, logits_row, block, E, H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
    """Logits rows block*BLOCK_R.. of one token (rows 0..E: the routed rows, then the shared expert's gate row): float32
    sums over H, stored rounded to the logits' dtype (x's, as F.linear returns them)."""
    rows = block * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows <= E
    cols = tl.arange(0, BLOCK_H)
    acc = tl.zeros((BLOCK_R, BLOCK_H), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        ok = (h0 + cols) < H
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * H + (h0 + cols)[None, :], mask=row_ok[:, None] & ok[None, :], other=0.0)
        xv = tl.load(x_row + h0 + cols, mask=ok, other=0.0)
        acc += w.to(tl.float32) * xv.to(tl.float32)[None, :]
    logits = tl.sum(acc, axis=1)
    tl.store(logits_row + rows, logits.to(logits_row.dtype.element_ty), mask=row_ok)


@triton.jit
def _router_logits_rows_of(xv, w_ptr, logits_row, block, E, H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
    """`_router_logits_rows` for an x row already in registers (xv [BLOCK_H] float32, BLOCK_H >= H: one step)."""
    rows = block * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows <= E
    cols = tl.arange(0, BLOCK_H)
    ok = cols < H
    w = tl.load(w_ptr + rows[:, None].to(tl.int64) * H + cols[None, :], mask=row_ok[:, None] & ok[None, :], other=0.0)
    acc = tl.zeros((BLOCK_R, BLOCK_H), dtype=tl.float32)
    acc += w.to(tl.float32) * xv[None, :]
    logits = tl.sum(acc, axis=1)
    tl.store(logits_row + rows, logits.to(logits_row.dtype.element_ty), mask=row_ok)


@triton.jit
def _add_norm_row(x_row, residual_row, norm_w_ptr, normed_row, residual_out_row, eps, store, H: tl.constexpr, BLOCK_H: tl.constexpr,
                  BF16: tl.constexpr, pairs_ptr=None, token=0, PAIRS: tl.constexpr = 0, ASM: tl.constexpr = False):
    """One token's fused add + RMSNorm as `norms._rms_norm_kernel` computes it (FUSED_ADD): returns the normed row
    [BLOCK_H] float32, already rounded to x's dtype; with `store`, writes it and the rounded sum as well, and with PAIRS
    (bfloat16 x) the normed row as float16 pairs at row `token` of `pairs_ptr` (H / 2 int32 words; 1 plain order, 2 the E4M3 decode's:
    `nvfp4_half_dot.x_half_pairs`) for the MoE gate/up kernel that reads x as pairs."""
    cols = tl.arange(0, BLOCK_H)
    ok = cols < H
    total = tl.load(x_row + cols, mask=ok, other=0.0).to(tl.float32) + tl.load(residual_row + cols, mask=ok, other=0.0).to(tl.float32)
    if BF16:
        total = _round_to_bf16(total)
    else:
        total = total.to(x_row.dtype.element_ty).to(tl.float32)
    weight = tl.load(norm_w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    normed = total * tl.rsqrt(tl.sum(total * total, axis=0) / H + eps)
    y = normed * (1.0 + weight)
    if BF16:
        y = _round_to_bf16(y)
    else:
        y = y.to(x_row.dtype.element_ty).to(tl.float32)
    if store:
        tl.store(residual_out_row + cols, total.to(residual_out_row.dtype.element_ty), mask=ok)
        tl.store(normed_row + cols, y.to(normed_row.dtype.element_ty), mask=ok)
        if PAIRS:
            _store_rows_half_pairs(pairs_ptr + token * (H // 2), 0, y, True, H, BLOCK_H, ASM, PAIRS == 2)
    return y


@triton.jit
def _router_logits_ticket(block, token, x_ptr, w_ptr, logits_ptr, counter_ptr, E, H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
                          residual_ptr, norm_w_ptr, normed_ptr, residual_out_ptr, eps, ADD_NORM: tl.constexpr, BF16: tl.constexpr,
                          NORM_WRITER: tl.constexpr, pairs_ptr=None, PAIRS: tl.constexpr = 0, ASM: tl.constexpr = False,
                          TICKET: tl.constexpr = True):
    """One program of the fused router up to its ticket: token `token`'s logits rows block*BLOCK_R.. (with ADD_NORM of
    the normed x, which program NORM_WRITER stores with the sum), then a ticket from the token's counter; returns it.
    The program drawing ROW_BLOCKS - 1 sees every row block's logits (acquire) and does the top-k. Without TICKET (the
    logits-only launch) it returns 0 after its stores."""
    if ADD_NORM:
        xv = _add_norm_row(x_ptr + token * H, residual_ptr + token * H, norm_w_ptr, normed_ptr + token * H, residual_out_ptr + token * H,
                           eps, block == NORM_WRITER, H, BLOCK_H, BF16, pairs_ptr, token, PAIRS, ASM)  # fmt: skip
        _router_logits_rows_of(xv, w_ptr, logits_ptr + token * (E + 1), block, E, H, BLOCK_R, BLOCK_H)
    else:
        _router_logits_rows(x_ptr + token * H, w_ptr, logits_ptr + token * (E + 1), block, E, H, BLOCK_R, BLOCK_H)
    if not TICKET:
        return 0
    tl.debug_barrier()  # every thread's logits are stored before the ticket is taken (release, GPU scope)
    return tl.atomic_add(counter_ptr + token, 1, sem="acq_rel", scope="gpu")


@triton.jit
def _router_gemv_topk_kernel(
    x_ptr, w_ptr, logits_ptr, counter_ptr, weights_ptr, ids_ptr, E, H: tl.constexpr,
    TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, ROW_BLOCKS: tl.constexpr,
    gate_up_base=0, gate_up_scale_base=0, down_base=0, down_scale_base=0, record_ptr=None,
    PREFETCH: tl.constexpr = 0, GU_BYTES: tl.constexpr = 0, GUS_BYTES: tl.constexpr = 0, D_BYTES: tl.constexpr = 0, DS_BYTES: tl.constexpr = 0,
    CHUNK: tl.constexpr = 65536, NCH_GU: tl.constexpr = 1, NCH_GUS: tl.constexpr = 1, NCH_D: tl.constexpr = 1, NCH_DS: tl.constexpr = 1,
    residual_ptr=None, norm_w_ptr=None, normed_ptr=None, residual_out_ptr=None, eps=1e-6, ADD_NORM: tl.constexpr = False,
    BF16: tl.constexpr = False, NORM_WRITER: tl.constexpr = 0, pairs_ptr=None, PAIRS: tl.constexpr = 0, ASM: tl.constexpr = False,
    TOPK: tl.constexpr = True, PDL: tl.constexpr = 0,
):
    """Router logits and the top-k with the shared slot in one launch. Grid (ROW_BLOCKS, T): program (r, t)
    computes logits rows r*BLOCK_R.. of token t (float32 sums over H, rounded to x's dtype as F.linear
    returns them) into `logits [T, E+1]`, then takes a ticket from the token's counter; the program that
    draws the last one runs `_topk_row` over the finished row and puts the counter back to zero. ADD_NORM: x is the
    un-normed input; each program normalises the token's row itself (module docstring), program NORM_WRITER stores it
    (and with PAIRS its float16 pairs, `_add_norm_row`). Without TOPK the launch writes the logits (and the norm) only:
    no ticket, no top-k (`router_gemv_logits`). PDL: `kernels/pdl.py` (the release follows the ticket)."""
    pdl.pdl_wait(PDL)
    token = tl.program_id(1).to(tl.int64)
    ticket = _router_logits_ticket(tl.program_id(0), token, x_ptr, w_ptr, logits_ptr, counter_ptr, E, H, BLOCK_R, BLOCK_H, residual_ptr, norm_w_ptr,
                                   normed_ptr, residual_out_ptr, eps, ADD_NORM, BF16, NORM_WRITER, pairs_ptr, PAIRS, ASM, TOPK)  # fmt: skip
    pdl.pdl_release(PDL)
    if TOPK and ticket == ROW_BLOCKS - 1:
        ROW: tl.constexpr = TOP_K + 1
        ids, id_ok = _topk_row(logits_ptr + token * (E + 1), weights_ptr + token * ROW, ids_ptr + token * ROW, E, TOP_K, BLOCK_E, BLOCK_K, True, True)
        tl.store(counter_ptr + token, 0)
        if PREFETCH:  # the selected experts' weights into L2 while the next launches start (`prefetch_experts`)
            PER_TOKEN: tl.constexpr = BLOCK_K * (NCH_GU + NCH_GUS + NCH_D + NCH_DS)
            at = token * PER_TOKEN
            _prefetch_expert_spans(gate_up_base, ids, id_ok, GU_BYTES, CHUNK, NCH_GU, PREFETCH, record_ptr, at, BLOCK_K)
            at += BLOCK_K * NCH_GU
            _prefetch_expert_spans(gate_up_scale_base, ids, id_ok, GUS_BYTES, CHUNK, NCH_GUS, PREFETCH, record_ptr, at, BLOCK_K)
            at += BLOCK_K * NCH_GUS
            _prefetch_expert_spans(down_base, ids, id_ok, D_BYTES, CHUNK, NCH_D, PREFETCH, record_ptr, at, BLOCK_K)
            at += BLOCK_K * NCH_D
            _prefetch_expert_spans(down_scale_base, ids, id_ok, DS_BYTES, CHUNK, NCH_DS, PREFETCH, record_ptr, at, BLOCK_K)


@satisfies("moe/router-topk", major=1, devices=("cuda",), backend="triton")
def router_topk(
    router_logits: torch.Tensor,  # [T, E]
    topk_weights: torch.Tensor,  # [T, top_k] float32
    topk_ids: torch.Tensor,  # [T, top_k] int32
    top_k: int,
) -> None:
    """softmax in float32, the top_k largest (ties: lower index first), renormalised to sum 1."""
    _require(router_logits.dim() == 2, f"router_logits must be [T, E], got shape {tuple(router_logits.shape)}")
    num_tokens, num_experts = router_logits.shape
    _require(isinstance(top_k, int) and 1 <= top_k <= num_experts, f"top_k must be an integer in [1, E={num_experts}], got {top_k!r}")
    _check_out(topk_weights, (num_tokens, top_k), torch.float32, "topk_weights")
    _check_out(topk_ids, (num_tokens, top_k), torch.int32, "topk_ids")
    require_launchable(router_logits, topk_weights, topk_ids)
    _launch(router_logits, topk_weights, topk_ids, num_experts, top_k, with_shared=False)


def _launch(router_logits, topk_weights, topk_ids, num_experts: int, top_k: int, with_shared: bool) -> None:
    num_tokens = router_logits.shape[0]
    if num_tokens == 0:
        return
    logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
    weights = topk_weights if topk_weights.is_contiguous() else torch.empty_like(topk_weights, memory_format=torch.contiguous_format)
    ids = topk_ids if topk_ids.is_contiguous() else torch.empty_like(topk_ids, memory_format=torch.contiguous_format)
    _router_topk_kernel[(num_tokens,)](
        logits, weights, ids, num_experts, logits.stride(0),
        TOP_K=top_k, BLOCK_E=next_power_of_2(num_experts), BLOCK_K=next_power_of_2(top_k), WITH_SHARED=with_shared, **pdl.launch_args(),
    )
    if weights is not topk_weights:
        topk_weights.copy_(weights)
    if ids is not topk_ids:
        topk_ids.copy_(ids)


ROUTER_ROWS, ROUTER_BLOCK_H = 2, 2048  # fused router: logits rows per program, columns per step (H = 2048: one step)
# fused router: warps per program (the tuning file's `router_rows` / `router_warps` set both). run41 (H200): 4.7 to 5.5 us at
# batch 1 for every rows x warps setting without spills (2 x 4: 5.1 us); the launch is a dependent chain, not tile-bound.
ROUTER_WARPS = 4
FUSED_ROUTER_MAX_TOKENS = 4  # up to this many tokens `moe_block_decode` computes the logits and the top-k in one launch


PREFETCH_EXPERTS = False  # tuning key `moe_expert_prefetch`: the fused router prefetches the selected experts into L2
# Tuning key `router_add_norm`: `moe_decode.moe_block_decode_add_norm` hands the norm before the block to the fused launch
# (module docstring) instead of launching the norm kernel first. Off until `benchmarks/kernels/time_router_add_norm.py` times it.
ADD_NORM = False
NORM_WRITER = 0  # which program of a token stores the normed row and the sum; tests set one past the last to show a missing writer is caught
PREFETCH_CHUNK = 1 << 16  # bytes per bulk prefetch


def expert_prefetch_spans(experts) -> tuple[tuple[int, int], ...] | None:
    """(base address, bytes per expert) of the stacked experts' gate/up codes, their scales, down codes, their scales;
    None when a tensor is not contiguous or not 16-byte aligned in base and per-expert size (the bulk prefetch's rule)."""
    spans = []
    for tensor in (experts.gate_up_packed, experts.gate_up_scale, experts.down_packed, experts.down_scale):
        per_expert = tensor[0].numel() * tensor.element_size()
        if not tensor.is_contiguous() or tensor.data_ptr() % 16 or per_expert % 16:
            return None
        spans.append((tensor.data_ptr(), per_expert))
    return tuple(spans)


def router_gemv_topk_with_shared(
    x: torch.Tensor,  # [T, H]
    router_weight: torch.Tensor,  # [E+1, H]: routed rows, then the shared expert's gate row
    topk_weights: torch.Tensor,  # [T, top_k + 1] float32
    topk_ids: torch.Tensor,  # [T, top_k + 1] int32
    top_k: int,
    prefetch=None,  # StackedNvfp4Experts: prefetch the selected experts' weights into L2 (CUDA), or None
    record: torch.Tensor | None = None,  # tests: int64 [T * prefetch_rows(top_k, experts), 2] gets the chunks instead
    add_norm: AddNorm | None = None,  # x is un-normed: this launch also does the norm before the block (module docstring)
    pairs_out: torch.Tensor | None = None,  # with add_norm and bfloat16 x: int32 [T, H/2] gets the normed x as float16 pairs
    pairs_fp8: bool = False,  # ... in the E4M3 decode's order (else the plain one)
) -> None:
    """`router_topk_with_shared(F.linear(x, router_weight), ...)` in one launch; inputs as `moe_block_decode`
    checks them (contiguous x and weight of one dtype, contiguous outputs). Writes every output slot. With `prefetch`,
    the program that finishes a token's top-k also issues a bulk L2 prefetch of its experts' gate/up and down codes and
    scales (64 KB chunks, not waited for), so the experts' launches that follow read them from L2 sooner; with `record`,
    it stores those chunks' (address, bytes) there instead (the interpreter cannot run the PTX). With `add_norm` the
    logits are those of add_norm's normed x, which this launch writes to `add_norm.out` (and the sum to `residual_out`),
    and with `pairs_out` also as the float16 pairs the MoE gate/up kernel can read instead of converting x."""
    logits = torch.empty(x.shape[0], router_weight.shape[0], dtype=x.dtype, device=x.device)
    _fused_launch(x, router_weight, logits, (topk_weights, topk_ids, top_k), prefetch, record, add_norm, pairs_out, pairs_fp8)


def router_gemv_logits(
    x: torch.Tensor,  # [T, H]
    router_weight: torch.Tensor,  # [E+1, H]
    logits: torch.Tensor,  # [T, E+1] in x's dtype, contiguous: written
    add_norm: AddNorm | None = None,
    pairs_out: torch.Tensor | None = None,
    pairs_fp8: bool = False,
) -> None:
    """The fused launch without its ticket and top-k: `logits = F.linear(x, router_weight)` rounded to x's dtype (with
    `add_norm` and `pairs_out` as in `router_gemv_topk_with_shared`); the MoE gate/up launch then picks the experts
    (`moe_decode.topk_in_experts`)."""
    if logits.shape != (x.shape[0], router_weight.shape[0]) or logits.dtype != x.dtype or not logits.is_contiguous():
        raise ValueError(f"logits must be contiguous {x.dtype} [{x.shape[0]}, {router_weight.shape[0]}], got {logits.dtype} {tuple(logits.shape)}")
    _fused_launch(x, router_weight, logits, None, None, None, add_norm, pairs_out, pairs_fp8)


def _fused_launch(x, router_weight, logits, topk, prefetch, record, add_norm, pairs_out, pairs_fp8) -> None:
    """The fused router launch; `topk` (weights, ids, top_k) or None for the logits-only form."""
    num_tokens, hidden = x.shape
    num_experts = router_weight.shape[0] - 1
    if add_norm is not None:
        add_norm.check(x)
        if next_power_of_2(hidden) > ROUTER_BLOCK_H:
            raise ValueError(f"the fused norm needs the row in one step: H={hidden} is over ROUTER_BLOCK_H={ROUTER_BLOCK_H}")
    if pairs_out is not None:
        if add_norm is None:
            raise ValueError("pairs_out needs add_norm: the pairs are written by the launch's norm")
        check_pairs_out(pairs_out, add_norm.out, hidden, both=False)
    if num_tokens == 0:
        return
    row_blocks = cdiv(num_experts + 1, ROUTER_ROWS)
    extra = {}
    spans = expert_prefetch_spans(prefetch) if prefetch is not None else None
    if spans is not None:
        (gu, gu_bytes), (gus, gus_bytes), (d, d_bytes), (ds, ds_bytes) = spans
        extra = {
            "gate_up_base": gu, "gate_up_scale_base": gus, "down_base": d, "down_scale_base": ds, "record_ptr": record,
            "PREFETCH": 2 if record is not None else 1, "GU_BYTES": gu_bytes, "GUS_BYTES": gus_bytes, "D_BYTES": d_bytes, "DS_BYTES": ds_bytes,
            "CHUNK": PREFETCH_CHUNK, **{f"NCH_{name}": next_power_of_2(cdiv(size, PREFETCH_CHUNK))
                                        for name, size in (("GU", gu_bytes), ("GUS", gus_bytes), ("D", d_bytes), ("DS", ds_bytes))},
        }  # fmt: skip
    if add_norm is not None:
        extra |= {
            "residual_ptr": add_norm.residual, "norm_w_ptr": add_norm.weight, "normed_ptr": add_norm.out,
            "residual_out_ptr": add_norm.residual_out, "eps": float(add_norm.eps), "ADD_NORM": True,
            "BF16": x.dtype == torch.bfloat16, "NORM_WRITER": NORM_WRITER,
        }  # fmt: skip
        if pairs_out is not None:
            extra |= {"pairs_ptr": pairs_out, "PAIRS": 2 if pairs_fp8 else 1, "ASM": not interpreting()}
    if topk is None:  # logits only: the routing outputs and the counters are not touched
        topk_weights, topk_ids, top_k, counters = logits, logits, 1, logits
    else:
        (topk_weights, topk_ids, top_k), counters = topk, ticket_counters(x.device, num_tokens)
    _router_gemv_topk_kernel[(row_blocks, num_tokens)](
        x, router_weight, logits, counters, topk_weights, topk_ids, num_experts, hidden,
        TOP_K=top_k, BLOCK_E=next_power_of_2(num_experts), BLOCK_K=next_power_of_2(top_k),
        BLOCK_R=ROUTER_ROWS, BLOCK_H=min(ROUTER_BLOCK_H, next_power_of_2(hidden)), ROW_BLOCKS=row_blocks, num_warps=ROUTER_WARPS,
        TOPK=topk is not None, **extra, **pdl.launch_args(),
    )


def prefetch_rows(top_k: int, experts) -> int:
    """Rows of the `record` table per token: every chunk slot of the four spans for each of the padded top-k slots."""
    spans = expert_prefetch_spans(experts)
    if spans is None:
        raise ValueError("the stacked experts cannot be prefetched (not contiguous or not 16-byte aligned)")
    return next_power_of_2(top_k) * sum(next_power_of_2(cdiv(size, PREFETCH_CHUNK)) for _, size in spans)


def router_topk_with_shared(
    router_logits: torch.Tensor,  # [T, E+1]: routed logits, then the shared expert's gate logit
    topk_weights: torch.Tensor,  # [T, top_k + 1] float32
    topk_ids: torch.Tensor,  # [T, top_k + 1] int32
    top_k: int,
) -> None:
    """Slots 0..top_k-1 as `router_topk` over the first E columns; slot top_k: id E, weight sigmoid(logit E)."""
    _, num_experts = check_router_with_shared(router_logits, topk_weights, topk_ids, top_k)
    require_launchable(router_logits, topk_weights, topk_ids)
    _launch(router_logits, topk_weights, topk_ids, num_experts, top_k, with_shared=True)
