"""Paged GQA decode attention (contract attention/paged-decode), Triton, split over the sequence.

Grid (B, Hkv, SPLITS): the program for (sequence b, KV head h, split s) takes the G = Hq / Hkv
query heads of h together ([G, D], padded to 16 rows for the tensor-core dot) so each K/V row is
loaded once for all of them, and walks tokens s*TOKENS_PER_SPLIT .. (s+1)*TOKENS_PER_SPLIT - 1 in
chunks of BLOCK_T: each token's block comes from block_tables[b, t // block_size] (loaded only for
t < seq_lens[b], so entries past a sequence's blocks, -1 or a scratch id, are never read), scores
in float32, online softmax (running max m, sum l, accumulator). A chunk or split past the
sequence's end contributes nothing (the max is guarded, so no exp(-inf - -inf) NaN). Each split
writes (m, l, acc) to a float32 workspace; `_combine_kernel`, grid (B, Hq), merges the splits and
writes out. The number of splits depends only on the table width (max_blocks_per_seq x
block_size) and the batch, never on seq_lens, so the launch needs no host sync (CUDA-graph safe).
float32 inputs use IEEE float32 dots (no TF32); 16-bit inputs are widened to float32 and run TF32
dots (their values are exact in TF32; the probabilities are rounded to TF32's 10 mantissa bits for
P @ V). A bf16 x bf16 dot was tried first: the Triton 3.6 interpreter computes it wrongly (errors
of 1e8 on the CPU), so the TF32 form is the one verified here.
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
)
from reference_engine.kernels.norms import _store_pairs
from reference_engine.ops.attention import _check_like, _check_paged, _require
from reference_engine.ops.registry import satisfies
from reference_engine.ops.static_moe import capturing

_SM_COUNT_DEFAULT = 132


@triton.jit
def _paged_split_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, scale,
    MAX_BLOCKS, SPLITS,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
    TOKENS_PER_SPLIT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    IEEE: tl.constexpr, PDL: tl.constexpr = 0,
):
    pdl.pdl_wait(PDL)
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    G = HQ // HKV
    heads = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    head_ok = heads < G
    dim_ok = dims < D
    q = tl.load(q_ptr + (seq * HQ + kv_head * G + heads[:, None]) * D + dims[None, :], mask=head_ok[:, None] & dim_ok[None, :], other=0.0)  # [BG, BD]
    length = tl.load(lens_ptr + seq)
    m = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    for chunk in range(TOKENS_PER_SPLIT // BLOCK_T):
        tokens = split * TOKENS_PER_SPLIT + chunk * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
        live = tokens < length
        blocks = tl.load(tables_ptr + seq * MAX_BLOCKS + tokens // BS, mask=live, other=0).to(tl.int64)
        rows = (blocks * BS + tokens % BS) * HKV + kv_head  # row of [NB * BS * HKV, D]
        kv_mask = live[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + rows[:, None] * D + dims[None, :], mask=kv_mask, other=0.0)  # [BT, BD]
        v = tl.load(v_ptr + rows[:, None] * D + dims[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:  # bf16/fp16 values are exact in tf32: the products are exact, only p is rounded (to 10 bits)
            scores = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="tf32")
        scores = tl.where(live[None, :], scores * scale, float("-inf"))  # [BG, BT]
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(scores - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="tf32")
        m = m_new
    part = (seq * HKV + kv_head) * SPLITS + split
    pdl.pdl_release(PDL)
    tl.store(part_m_ptr + part * BLOCK_G + heads, m)
    tl.store(part_l_ptr + part * BLOCK_G + heads, l)
    tl.store(part_acc_ptr + (part * BLOCK_G + heads[:, None]) * BLOCK_D + dims[None, :], acc)


@triton.jit
def _combine_kernel(part_acc_ptr, part_m_ptr, part_l_ptr, out_ptr, gate_ptr, stride_gate, SPLITS, HQ: tl.constexpr, HKV: tl.constexpr,
                    D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, GATED: tl.constexpr,
                    pairs_ptr=None, PAIRS: tl.constexpr = False, PDL: tl.constexpr = 0):
    pdl.pdl_wait(PDL)
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    G = HQ // HKV
    kv_head = head // G
    row = head % G
    splits = tl.arange(0, BLOCK_S)
    split_ok = splits < SPLITS
    part = (seq * HKV + kv_head) * SPLITS + splits  # [BS]
    m = tl.load(part_m_ptr + part * BLOCK_G + row, mask=split_ok, other=float("-inf"))
    l = tl.load(part_l_ptr + part * BLOCK_G + row, mask=split_ok, other=0.0)
    top = tl.max(m, axis=0)  # finite: split 0 always holds the first token
    weight = tl.where(m == float("-inf"), 0.0, tl.exp(m - top))  # [BS]
    dims = tl.arange(0, BLOCK_D)
    acc = tl.load(part_acc_ptr + (part[:, None] * BLOCK_G + row) * BLOCK_D + dims[None, :], mask=split_ok[:, None], other=0.0)  # [BS, BD]
    total = tl.sum(acc * weight[:, None], axis=0) / tl.sum(l * weight, axis=0)
    if GATED:  # the output gate: the second D of head's 2D columns of the q_proj output
        gate = tl.load(gate_ptr + seq * stride_gate + head * (2 * D) + D + dims, mask=dims < D, other=0.0).to(tl.float32)
        total = total * tl.sigmoid(gate)
    pdl.pdl_release(PDL)
    tl.store(out_ptr + (seq * HQ + head) * D + dims, total.to(out_ptr.dtype.element_ty), mask=dims < D)
    if PAIRS:  # the head again as the batch-1 GEMV's float16 pairs for o_proj, both orders ([B, 2, HQ * D / 2]; D % 16 == 0)
        tl.debug_barrier()  # this program's stores of the head are visible to all its threads
        words = tl.arange(0, BLOCK_D // 2)
        word_ok = words < D // 2
        dest = pairs_ptr + seq * (HQ * D) + head * (D // 2)
        _store_pairs(out_ptr + (seq * HQ + head) * D, dest, words, word_ok, False)
        _store_pairs(out_ptr + (seq * HQ + head) * D, dest + (HQ * D) // 2, words, word_ok, True)


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNT_DEFAULT


MIN_TOKENS_PER_SPLIT = 64  # a split walks at least this many tokens (chunks of 16 one after another); the tuning file may lower it
WAVES = 2  # splits enough to fill the multiprocessors this many times over (fewer when MIN_TOKENS_PER_SPLIT binds)


def plan(batch: int, kv_heads: int, capacity: int, sm_count: int) -> tuple[int, int, int]:
    """(BLOCK_T, TOKENS_PER_SPLIT, SPLITS) for a table of `capacity` tokens per sequence; no seq_lens needed."""
    block_t = 16
    wanted = max(1, cdiv(WAVES * sm_count, batch * kv_heads))  # splits per (sequence, KV head)
    tokens_per_split = max(MIN_TOKENS_PER_SPLIT, block_t, next_power_of_2(cdiv(capacity, wanted)))
    splits = cdiv(capacity, tokens_per_split)
    return block_t, tokens_per_split, splits


def _check_inputs(query, k_cache, v_cache, block_tables, seq_lens, scale) -> None:
    _require(query.dim() == 3, f"query must be [B, heads, head_dim], got shape {tuple(query.shape)}")
    _require(k_cache.dim() == 4, f"k_cache must be [num_blocks, block_size, kv_heads, head_dim], got shape {tuple(k_cache.shape)}")
    _require(block_tables.dim() == 2, f"block_tables must be [B, max_blocks_per_seq], got shape {tuple(block_tables.shape)}")
    if not capturing(query):
        _check_paged(query, k_cache, v_cache, block_tables, seq_lens, query.shape[0])
    else:
        _require(seq_lens.dim() == 1 and seq_lens.shape[0] == query.shape[0], f"seq_lens must be [{query.shape[0]}], got shape {tuple(seq_lens.shape)}")
        _require(k_cache.dtype == query.dtype and v_cache.shape == k_cache.shape and v_cache.dtype == k_cache.dtype, "k_cache and v_cache must match each other and the query's dtype")
    _require(scale > 0, f"scale must be positive, got {scale}")


def _launch(query, k_cache, v_cache, block_tables, seq_lens, out, scale, gate, pairs_out=None) -> None:
    """Split kernel then combine kernel (which applies sigmoid(gate) when `gate` is given); out [B, Hq, D] or [B, Hq * D]."""
    batch, query_heads, head_dim = query.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if batch == 0:
        return
    block_g = max(16, next_power_of_2(query_heads // kv_heads))
    block_d = max(16, next_power_of_2(head_dim))
    block_t, tokens_per_split, splits = plan(batch, kv_heads, block_tables.shape[1] * block_size, _sm_count(query.device))
    device = query.device
    part_acc = torch.empty(batch * kv_heads * splits * block_g * block_d, dtype=torch.float32, device=device)
    part_m = torch.empty(batch * kv_heads * splits * block_g, dtype=torch.float32, device=device)
    part_l = torch.empty_like(part_m)
    tables = block_tables.to(torch.int32).contiguous()
    lens = seq_lens.to(torch.int32).contiguous()
    _paged_split_kernel[(batch, kv_heads, splits)](
        query.contiguous(), k_cache.contiguous(), v_cache.contiguous(), tables, lens, part_acc, part_m, part_l, float(scale),
        tables.shape[1], splits,
        HQ=query_heads, HKV=kv_heads, D=head_dim, BS=block_size, TOKENS_PER_SPLIT=tokens_per_split, BLOCK_T=block_t,
        BLOCK_G=block_g, BLOCK_D=block_d, IEEE=query.dtype == torch.float32, **pdl.launch_args(),
    )
    buffer = staging_buffer(out)
    target = buffer if buffer.is_contiguous() else torch.empty(buffer.shape, dtype=buffer.dtype, device=device)
    _combine_kernel[(batch, query_heads)](
        part_acc, part_m, part_l, target, query if gate is None else gate, 0 if gate is None else gate.stride(0), splits,
        HQ=query_heads, HKV=kv_heads, D=head_dim, BLOCK_S=next_power_of_2(splits), BLOCK_G=block_g, BLOCK_D=block_d,
        GATED=gate is not None, pairs_ptr=pairs_out if pairs_out is not None else target, PAIRS=pairs_out is not None, **pdl.launch_args(),
    )
    if target is not buffer:
        buffer.copy_(target)
    finish(buffer, out)


@satisfies("attention/paged-decode", major=1, devices=("cuda",), backend="triton")
def paged_decode(
    query: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [B] int32
    out: torch.Tensor,  # [B, Hq, D]
    scale: float,
) -> torch.Tensor:
    """One query per sequence over its first seq_lens cached tokens; query/out [B, Hq, D]."""
    _check_inputs(query, k_cache, v_cache, block_tables, seq_lens, scale)
    _check_like("out", out, tuple(query.shape), query.dtype, query.device)
    require_launchable(query, k_cache, v_cache, block_tables, seq_lens, out)
    _launch(query, k_cache, v_cache, block_tables, seq_lens, out, scale, gate=None)
    return out


def paged_decode_gated(
    query: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [B] int32
    q_gate: torch.Tensor,  # [B, Hq * 2D] (rows may be strided): per head [query D | gate D]
    out: torch.Tensor,  # [B, Hq * D]
    scale: float,
    pairs_out: torch.Tensor | None = None,  # kernel only: int32 [B, 2, Hq * D / 2]
) -> torch.Tensor:
    """paged_decode(query) * sigmoid(gate) in one split + one combine launch; the signature of
    `ops.static_attention.paged_decode_gated`. `pairs_out` (optional): out again as the batch-1 GEMV's float16 pairs in
    both orders (plain, then E4M3: `gemv_pairs.pairs_buffer`), for o_proj (`kernels/gemv_pairs.py`); out contiguous bfloat16, D % 16 == 0."""
    _check_inputs(query, k_cache, v_cache, block_tables, seq_lens, scale)
    batch, heads, head_dim = query.shape
    _require(q_gate.dim() == 2 and tuple(q_gate.shape) == (batch, heads * 2 * head_dim) and q_gate.stride(1) == 1,
             f"q_gate must be [{batch}, {heads * 2 * head_dim}] with unit stride along features, got {tuple(q_gate.shape)}")  # fmt: skip
    _require(q_gate.dtype == query.dtype, f"q_gate must have the query's dtype {query.dtype}, got {q_gate.dtype}")
    _check_like("out", out, (batch, heads * head_dim), query.dtype, query.device)
    if pairs_out is not None:
        gemv_pairs.check_pairs_out(pairs_out, out, head_dim)
    require_launchable(query, k_cache, v_cache, block_tables, seq_lens, q_gate, out, *(() if pairs_out is None else (pairs_out,)))
    _launch(query, k_cache, v_cache, block_tables, seq_lens, out, scale, gate=q_gate, pairs_out=pairs_out)
    return out
