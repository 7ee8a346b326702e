"""Routed experts plus the shared expert for decode batches, grouped by expert on tensor cores, Triton.

The per-pair decode kernels (`moe_decode`) decode an expert's NVFP4 weights once per (token, slot) pair that
chose it, on CUDA cores, and the shared expert once per token: at batch 32 each touched expert is decoded
about 1.6 times and the shared one 32 times, and those two kernels took 63% of the decode step (run16).
Here each expert's weights are decoded once per batch and multiplied on tensor cores against all the tokens
that chose it. Four launches, no sort, no host synchronisation, deterministic:

1. `_group_kernel`, grid (E + 1,): group g lists the pairs p = t * (top_k + 1) + j that belong to it, in
   pair order: group 0 is the shared expert (every token's last slot, told by position), group 1 + e the
   routed slots whose id is e. It writes counts [E + 1] and pairs [E + 1, P] (P = T * (top_k + 1)).
2. `_gate_up_kernel`, grid (E + 1, cdiv(I, BLOCK_N)): for each tile of BLOCK_M of its group's pairs, the
   gathered x rows times the expert's gate rows and the matching up rows (two accumulators, one x tile),
   act = silu(gate) * up rounded to x's dtype, written at the pairs' rows of act [P, I]. Empty groups return
   after reading their count; the shared group comes first in the grid (it has the most pairs).
3. `_down_kernel`, grid (E + 1, cdiv(H, BLOCK_N)): act rows times the expert's down rows, times the tensor
   scale and the pair's weight (routing weight, or sigmoid of the shared gate logit), float32 at the pair's
   row of y [P, H].
4. `nvfp4_gemm.slot_sum` (`_slot_sum_kernel`, grid (T, cdiv(H, BLOCK_H))): out[t] = sum over the slots of y[t * (top_k + 1) + j] in
   slot order, rounded once into x's dtype.

The weight tiles are `nvfp4_gemm._tile` (decode 1: codes read as int32 words and decoded to bfloat16 pairs
in PTX). `GroupedPlan.swap` puts the decoded weight tile first in the dot and the pairs second (`nvfp4_gemm._mma`):
the weight rows become the mma's M, so tiles of 64 rows run on wgmma with 16 pairs as N, where the default order
has the pairs as M (16: mma.sync). Measured slower than the committed decode path at 8 to 64 tokens (run41, H200:
0.64 to 0.87 of its speed at best, `benchmarks/kernels/time_moe_grouped_swap.py`); a tested plan field, off. A group with more than BLOCK_M pairs
(the shared expert above BLOCK_M tokens, or repeated ids) loops over its tiles, decoding its weights again
per tile. Same arithmetic as the per-pair kernels up to the float32 summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from reference_engine.kernels.launch import (
    cdiv,
    interpreting,
    next_power_of_2,
    require_launchable,
)
from reference_engine.kernels.nvfp4_gemm import (
    GemmPlan,
    _decode,
    _dot_kind,
    _gate_up_products,
    _packed_operand,
    _rows_products,
    slot_sum,
)
from reference_engine.ops.moe import _check_expert_range
from reference_engine.ops.static_moe import (
    SharedNvfp4Expert,
    StackedNvfp4Experts,
    capturing,
    check_experts_with_shared,
    expert_tensors,
)


@dataclass(frozen=True)
class GroupedPlan:
    """Tiles of the grouped decode kernels (set from the tuning file's `moe_grouped_decode`)."""

    block_m: int = 16  # pairs per tensor-core tile (the mma's M)
    gate_up_block_n: int = 32  # gate rows (and as many up rows) per program
    gate_up_block_kb: int = 32  # packed bytes of a weight row per K step (64 elements)
    down_block_n: int = 64  # H rows per program
    down_block_kb: int = 32
    num_warps: int = 4
    num_stages: int = 3
    decode: int = 1  # `nvfp4_gemm` weight decode: 1 int32 words decoded to bfloat16 pairs in PTX, 0 bytes
    swap: int = 0  # 1: the decoded weight tile is the dot's first operand and the pairs its N (`nvfp4_gemm._mma`): wgmma from 64 rows


PLAN = GroupedPlan()
MIN_TOKENS: int | None = None  # `moe_decode.moe_block_decode` runs these kernels from this batch on (None: never; the tuning file sets it)
POISON_SCRATCH = False  # tests: fill act and y with NaN first, so a pair the kernels never write shows up in the output


def _scratch(shape: tuple[int, int], dtype: torch.dtype, device: torch.device, poison: bool | None = None) -> torch.Tensor:
    """Scratch the kernels fill; NaN first when `poison` (default: this module's `POISON_SCRATCH`)."""
    if POISON_SCRATCH if poison is None else poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def grouped_inputs(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, experts: StackedNvfp4Experts, shared: SharedNvfp4Expert,
    out: torch.Tensor, check_ids: bool,
) -> tuple[int, int, int, int, list[torch.Tensor], list[torch.Tensor]]:
    """The checks every grouped path makes: shapes, one launchable device, expert ids in range (unless `check_ids` is
    False or a graph is being captured). Returns (T, H, top_k, I, routed tensors, shared tensors), contiguous."""
    tokens, hidden, top_k, inter = check_experts_with_shared(x, topk_weights, topk_ids, experts, shared, out)
    routed = [t.contiguous() for t in expert_tensors(experts)]
    shared_tensors = [t.contiguous() for t in expert_tensors(shared)]
    require_launchable(x, topk_weights, topk_ids, out, *routed, *shared_tensors)
    if check_ids and not capturing(x):
        _check_expert_range(topk_ids[:, :top_k], experts.num_experts)
    return tokens, hidden, top_k, inter, routed, shared_tensors


@triton.jit
def _group_kernel(ids_ptr, counts_ptr, pairs_ptr, P, TOP_K: tl.constexpr, BLOCK_P: tl.constexpr):
    group = tl.program_id(0)
    p = tl.arange(0, BLOCK_P)
    slot = p % (TOP_K + 1)
    in_range = p < P
    ids = tl.load(ids_ptr + p, mask=in_range & (slot < TOP_K), other=-1)
    match = in_range & tl.where(group == 0, slot == TOP_K, (slot < TOP_K) & (ids == group - 1))
    hits = match.to(tl.int32)
    rank = tl.cumsum(hits, 0) - 1
    tl.store(pairs_ptr + group.to(tl.int64) * P + rank, p, mask=match)
    tl.store(counts_ptr + group, tl.sum(hits))


@triton.jit
def _tile_pairs(pairs_ptr, group, P, count, m0, BLOCK_M: tl.constexpr):
    """(pairs [BLOCK_M] int32, valid [BLOCK_M]) of the group's tile starting at m0; invalid rows read pair 0."""
    m = m0 + tl.arange(0, BLOCK_M)
    valid = m < count
    pairs = tl.load(pairs_ptr + group.to(tl.int64) * P + m, mask=valid, other=0)
    return pairs, valid


@triton.jit
def _gate_up_group(
    x_ptr, stride_xm, w_ptr, s_ptr, s2_ptr, row0, pairs_ptr, group, P, count, act_ptr, cols,
    I: tl.constexpr, H_BYTES: tl.constexpr, SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_KIND: tl.constexpr, DECODE: tl.constexpr, SWAP: tl.constexpr,
):
    gate_rows = row0 + tl.minimum(cols, I - 1).to(tl.int64)  # clamped rows: unmasked loads, masked store
    up_rows = gate_rows + I
    undo: tl.constexpr = 128.0 if DECODE >= 1 else 16384.0  # the decoded operand's power of two
    gate_scale = tl.load(s2_ptr) * undo
    up_scale = tl.load(s2_ptr + 1) * undo
    m0 = 0
    while m0 < count:  # a while loop: the Triton 3.6 interpreter cannot take a loaded scalar as a range bound
        pairs, valid = _tile_pairs(pairs_ptr, group, P, count, m0, BLOCK_M)
        x_rows = (pairs // SLOTS).to(tl.int64) * stride_xm
        acc_gate, acc_up = _gate_up_products(x_ptr, x_rows, w_ptr, s_ptr, gate_rows, up_rows, H_BYTES, BLOCK_M, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE, 0, SWAP)
        gate = acc_gate * gate_scale
        act = gate / (1.0 + tl.exp(-gate)) * (acc_up * up_scale)
        out_ptrs = act_ptr + pairs[:, None].to(tl.int64) * I + cols[None, :]
        tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=valid[:, None] & (cols < I)[None, :])
        m0 += BLOCK_M


@triton.jit
def _gate_up_kernel(
    x_ptr, stride_xm, counts_ptr, pairs_ptr, P,
    w_ptr, s_ptr, s2_ptr, shared_w_ptr, shared_s_ptr, shared_s2_ptr, act_ptr,
    I: tl.constexpr, H_BYTES: tl.constexpr, SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_KIND: tl.constexpr, DECODE: tl.constexpr, SWAP: tl.constexpr = 0,
):
    group = tl.program_id(0)
    count = tl.load(counts_ptr + group)
    if count == 0:
        return
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    if group == 0:  # the shared expert's own tensors (a separate call keeps each pointer's alignment known)
        _gate_up_group(x_ptr, stride_xm, shared_w_ptr, shared_s_ptr, shared_s2_ptr, 0, pairs_ptr, group, P, count, act_ptr, cols,
                       I, H_BYTES, SLOTS, BLOCK_M, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE, SWAP)  # fmt: skip
    else:
        expert = (group - 1).to(tl.int64)
        _gate_up_group(x_ptr, stride_xm, w_ptr, s_ptr, s2_ptr + 2 * expert, expert * (2 * I), pairs_ptr, group, P, count, act_ptr, cols,
                       I, H_BYTES, SLOTS, BLOCK_M, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE, SWAP)  # fmt: skip


@triton.jit
def _down_group(
    act_ptr, weights_ptr, w_ptr, s_ptr, s2_ptr, row0, pairs_ptr, group, P, count, y_ptr, cols,
    H: tl.constexpr, I_BYTES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_KIND: tl.constexpr, DECODE: tl.constexpr, SWAP: tl.constexpr,
):
    down_rows = row0 + tl.minimum(cols, H - 1).to(tl.int64)
    undo: tl.constexpr = 128.0 if DECODE >= 1 else 16384.0
    tensor_scale = tl.load(s2_ptr) * undo
    m0 = 0
    while m0 < count:
        pairs, valid = _tile_pairs(pairs_ptr, group, P, count, m0, BLOCK_M)
        act_rows = pairs.to(tl.int64) * (2 * I_BYTES)
        acc = _rows_products(act_ptr, act_rows, w_ptr, s_ptr, down_rows, I_BYTES, BLOCK_M, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE, 0, SWAP)
        weight = tl.load(weights_ptr + pairs, mask=valid, other=0.0)  # [BM] routing weight or shared gate
        y = acc * tensor_scale * weight[:, None]
        tl.store(y_ptr + pairs[:, None].to(tl.int64) * H + cols[None, :], y, mask=valid[:, None] & (cols < H)[None, :])
        m0 += BLOCK_M


@triton.jit
def _down_kernel(
    act_ptr, weights_ptr, counts_ptr, pairs_ptr, P,
    w_ptr, s_ptr, s2_ptr, shared_w_ptr, shared_s_ptr, shared_s2_ptr, y_ptr,
    H: tl.constexpr, I_BYTES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_KIND: tl.constexpr, DECODE: tl.constexpr, SWAP: tl.constexpr = 0,
):
    group = tl.program_id(0)
    count = tl.load(counts_ptr + group)
    if count == 0:
        return
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    if group == 0:
        _down_group(act_ptr, weights_ptr, shared_w_ptr, shared_s_ptr, shared_s2_ptr, 0, pairs_ptr, group, P, count, y_ptr, cols,
                    H, I_BYTES, BLOCK_M, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE, SWAP)  # fmt: skip
    else:
        expert = (group - 1).to(tl.int64)
        _down_group(act_ptr, weights_ptr, w_ptr, s_ptr, s2_ptr + expert, expert * H, pairs_ptr, group, P, count, y_ptr, cols,
                    H, I_BYTES, BLOCK_M, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE, SWAP)  # fmt: skip


def _groups(ids: torch.Tensor, groups: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, top_k + 1] int32 -> (counts [E + 1] int32, pairs [E + 1, P] int32 filled up to counts): launch 1."""
    pairs = ids.numel()
    counts = torch.empty(groups, dtype=torch.int32, device=ids.device)
    group_pairs = torch.empty(groups * pairs, dtype=torch.int32, device=ids.device)
    _group_kernel[(groups,)](ids, counts, group_pairs, pairs, TOP_K=top_k, BLOCK_P=next_power_of_2(pairs))
    return counts, group_pairs


def _k_step(block_kb: int, k_bytes: int) -> int:
    """The plan's packed bytes per K step, no more than the row holds (at least 8: one dot of 16 elements)."""
    return max(8, min(block_kb, next_power_of_2(k_bytes)))


def grouped_experts_with_shared(
    x: torch.Tensor,  # [T, H]
    topk_weights: torch.Tensor,  # [T, top_k + 1] float32; column top_k: sigmoid(shared gate logit)
    topk_ids: torch.Tensor,  # [T, top_k + 1] int32; column top_k: not read (the shared slot is told by position)
    experts: StackedNvfp4Experts,
    shared: SharedNvfp4Expert,
    out: torch.Tensor,  # [T, H]
    plan: GroupedPlan | None = None,
    check_ids: bool = True,
) -> None:
    """Routed experts plus the weighted shared expert, grouped by expert (module docstring); the signature of
    `ops.static_moe.nvfp4_experts_with_shared`. `plan`: tiles other than the module's `PLAN` (benchmarks, tests).
    `check_ids=False` skips the expert-id range check (a host sync; ids from the router are in range by
    construction). An id out of range would match no group: its slot would add nothing."""
    tokens, hidden, top_k, inter, routed, shared_tensors = grouped_inputs(x, topk_weights, topk_ids, experts, shared, out, check_ids)
    if tokens == 0:
        return
    p = plan if plan is not None else PLAN
    slots, groups = top_k + 1, experts.num_experts + 1
    pairs = tokens * slots
    device = x.device
    ids, weights = topk_ids.contiguous(), topk_weights.contiguous()
    counts, group_pairs = _groups(ids, groups, top_k)

    gu_packed, gu_scale, gu_scale_2, down_packed, down_scale, down_scale_2 = routed
    s_gu_packed, s_gu_scale, s_gu_scale_2, s_down_packed, s_down_scale, s_down_scale_2 = shared_tensors
    x = x if x.stride(1) == 1 else x.contiguous()
    dot_kind = _dot_kind(x.dtype)
    staged = interpreting() and x.dtype != torch.float32  # the interpreter truncates float32 -> bf16; torch rounds
    act = _scratch((pairs, inter), torch.float32 if staged else x.dtype, device)  # [P, I]
    plan_a = GemmPlan(p.block_m, min(p.gate_up_block_n, next_power_of_2(inter)), _k_step(p.gate_up_block_kb, hidden // 2), p.num_warps, p.num_stages, decode=p.decode)
    decode_a = _decode(plan_a)
    _gate_up_kernel[(groups, cdiv(inter, plan_a.block_n))](
        x, x.stride(0), counts, group_pairs, pairs,
        _packed_operand(gu_packed, decode_a), gu_scale, gu_scale_2,
        _packed_operand(s_gu_packed, decode_a), s_gu_scale, s_gu_scale_2, act,
        I=inter, H_BYTES=hidden // 2, SLOTS=slots, BLOCK_M=p.block_m, BLOCK_N=plan_a.block_n, BLOCK_KB=plan_a.block_kb,
        EVEN_K=(hidden // 2) % plan_a.block_kb == 0, DOT_KIND=dot_kind, DECODE=decode_a, SWAP=p.swap, num_warps=p.num_warps, num_stages=p.num_stages,
    )
    if staged:
        act = act.to(x.dtype)
    y = _scratch((pairs, hidden), torch.float32, device)  # [P, H] weighted expert outputs
    plan_b = GemmPlan(p.block_m, min(p.down_block_n, next_power_of_2(hidden)), _k_step(p.down_block_kb, inter // 2), p.num_warps, p.num_stages, decode=p.decode)
    decode_b = _decode(plan_b)
    _down_kernel[(groups, cdiv(hidden, plan_b.block_n))](
        act, weights, counts, group_pairs, pairs,
        _packed_operand(down_packed, decode_b), down_scale, down_scale_2,
        _packed_operand(s_down_packed, decode_b), s_down_scale, s_down_scale_2, y,
        H=hidden, I_BYTES=inter // 2, BLOCK_M=p.block_m, BLOCK_N=plan_b.block_n, BLOCK_KB=plan_b.block_kb,
        EVEN_K=(inter // 2) % plan_b.block_kb == 0, DOT_KIND=dot_kind, DECODE=decode_b, SWAP=p.swap, num_warps=p.num_warps, num_stages=p.num_stages,
    )
    slot_sum(y, out, slots)
