"""Paged decode attention and KV writes with static shapes and no host synchronisation (CUDA-graph capturable).

`paged_decode` attends over the whole width of `block_tables` (max_blocks_per_seq blocks) and masks
positions at or past `seq_lens`, so its shapes do not depend on the sequence lengths; entries past a
sequence's blocks may hold any block id (the runner puts its scratch block there; negative ids are
clamped to 0) and are never used. `write_kv_all_valid` writes every row: the runner points padding
rows at its scratch slot instead of marking them negative.
The data-dependent checks (lengths in range, used block ids valid) run only outside graph capture.
"""

from __future__ import annotations

import torch

from reference_engine.ops.attention import (
    _check_like,
    _check_paged,
    _require,
    output_gate,
    partial_rope,
)
from reference_engine.ops.norms import rms_norm
from reference_engine.ops.registry import satisfies
from reference_engine.ops.static_moe import capturing


@satisfies("attention/paged-decode", major=1)
def paged_decode(
    query: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [B] int32
    out: torch.Tensor,  # [B, Hq, D]
    scale: float,
) -> torch.Tensor:
    """One query per sequence over its first seq_lens cached tokens, computed over the full table width."""
    _require(
        query.dim() == 3,
        f"query must be [B, heads, head_dim], got shape {tuple(query.shape)}",
    )
    _require(
        k_cache.dim() == 4,
        f"k_cache must be [num_blocks, block_size, kv_heads, head_dim], got shape {tuple(k_cache.shape)}",
    )
    _require(
        block_tables.dim() == 2,
        f"block_tables must be [B, max_blocks_per_seq], got shape {tuple(block_tables.shape)}",
    )
    if not capturing(query):
        _check_paged(query, k_cache, v_cache, block_tables, seq_lens, query.shape[0])
    _check_like("out", out, tuple(query.shape), query.dtype, query.device)
    _require(scale > 0, f"scale must be positive, got {scale}")
    batch, query_heads, head_dim = query.shape
    kv_heads = k_cache.shape[2]
    blocks = block_tables.long().clamp(min=0)  # [B, MB]
    keys = k_cache[blocks].flatten(1, 2)  # [B, L, Hkv, D], L = MB * block_size
    values = v_cache[blocks].flatten(1, 2)
    group = query_heads // kv_heads
    q = query.float().reshape(batch, kv_heads, group, head_dim)  # [B, Hkv, G, D]
    scores = torch.einsum("bhgd,blhd->bhgl", q, keys.float()) * scale  # [B, Hkv, G, L]
    valid = (
        torch.arange(keys.shape[1], device=query.device)[None, :]
        < seq_lens.long()[:, None]
    )  # [B, L]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    attended = torch.einsum("bhgl,blhd->bhgd", probs, values.float())  # [B, Hkv, G, D]
    out.copy_(attended.reshape(batch, query_heads, head_dim))
    return out


def write_kv_all_valid(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], updated in place
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64, every entry a valid slot (padding rows: the scratch slot)
) -> None:
    """Write each token's K/V at its slot; unlike `cache.kv_write.write_kv` no entry may be negative."""
    _require(
        key.dim() == 3 and key.shape == value.shape,
        f"key and value must both be [T, Hkv, D], got {list(key.shape)} and {list(value.shape)}",
    )
    _require(
        k_cache.shape == v_cache.shape and k_cache.shape[2:] == key.shape[1:],
        f"caches {list(k_cache.shape)} do not fit key {list(key.shape)}",
    )
    _require(
        slot_mapping.dtype == torch.int64 and slot_mapping.shape == key.shape[:1],
        f"slot_mapping must be int64 [{key.shape[0]}]",
    )
    _require(
        k_cache.is_contiguous() and v_cache.is_contiguous(),
        "k_cache and v_cache must be contiguous",
    )
    if not capturing(key):
        _require(
            bool((slot_mapping >= 0).all()),
            "write_kv_all_valid: slot_mapping holds a negative (padding) entry",
        )
    heads, head_dim = key.shape[1], key.shape[2]
    k_cache.view(-1, heads, head_dim).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, heads, head_dim).index_copy_(0, slot_mapping, value)


def check_attention_decode_prep(
    q_gate, key, value, q_norm, k_norm, positions, k_cache, v_cache, slot_mapping, query_out, eps, rotary_dim
) -> tuple[int, int, int]:
    """Shape and dtype checks of `attention_decode_prep` (no data-dependent checks: capturable); (T, Hq, D)."""
    _require(query_out.dim() == 3, f"query_out must be [T, Hq, D], got shape {tuple(query_out.shape)}")
    tokens, heads, head_dim = query_out.shape
    _require(k_cache.dim() == 4 and k_cache.shape == v_cache.shape and k_cache.shape[3] == head_dim,
             f"k_cache/v_cache must be [num_blocks, block_size, Hkv, D={head_dim}], got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")  # fmt: skip
    _require(k_cache.is_contiguous() and v_cache.is_contiguous(), "k_cache and v_cache must be contiguous")
    kv_heads = k_cache.shape[2]
    for name, tensor, width in (("q_gate", q_gate, heads * 2 * head_dim), ("key", key, kv_heads * head_dim), ("value", value, kv_heads * head_dim)):
        _require(tensor.dim() == 2 and tuple(tensor.shape) == (tokens, width) and tensor.stride(1) == 1,
                 f"{name} must be [{tokens}, {width}] with unit stride along features, got {tuple(tensor.shape)} strides {tensor.stride()}")  # fmt: skip
        _require(tensor.dtype == query_out.dtype, f"{name} must have query_out's dtype {query_out.dtype}, got {tensor.dtype}")
    _require(k_cache.dtype == query_out.dtype, f"the caches must have query_out's dtype {query_out.dtype}, got {k_cache.dtype}")
    for name, tensor in (("q_norm", q_norm), ("k_norm", k_norm)):
        _require(tuple(tensor.shape) == (head_dim,), f"{name} must be [{head_dim}], got {tuple(tensor.shape)}")
    for name, tensor in (("positions", positions), ("slot_mapping", slot_mapping)):
        _require(tensor.dtype == torch.int64 and tuple(tensor.shape) == (tokens,), f"{name} must be int64 [{tokens}], got {tensor.dtype} {tuple(tensor.shape)}")
    _require(0 < rotary_dim <= head_dim and rotary_dim % 2 == 0, f"rotary_dim must be even and in (0, {head_dim}], got {rotary_dim}")
    _require(eps > 0, f"eps must be positive, got {eps}")
    return tokens, heads, head_dim


@satisfies("attention/decode-prep", major=1)
def attention_decode_prep(
    q_gate: torch.Tensor,  # [T, Hq * 2D]: per head [query D | gate D]
    key: torch.Tensor,  # [T, Hkv * D]
    value: torch.Tensor,  # [T, Hkv * D]
    q_norm: torch.Tensor,  # [D], zero-centred
    k_norm: torch.Tensor,  # [D], zero-centred
    positions: torch.Tensor,  # [T] int64
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], written at slot_mapping
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64, every entry valid (padding rows: the scratch slot)
    query_out: torch.Tensor,  # [T, Hq, D]
    eps: float,
    rotary_dim: int,
    theta: float,
) -> torch.Tensor:
    """query_out = rope(q_norm(query)); the caches get rope(k_norm(key)) and value at slot_mapping.

    The composition of the model's eager ops (split, RMSNorm, partial RoPE, KV write); capturable.
    """
    tokens, heads, head_dim = check_attention_decode_prep(
        q_gate, key, value, q_norm, k_norm, positions, k_cache, v_cache, slot_mapping, query_out, eps, rotary_dim
    )
    kv_heads = k_cache.shape[2]
    query = q_gate.reshape(tokens, heads, 2, head_dim)[:, :, 0, :]  # [T, Hq, D]
    keys = key.reshape(tokens, kv_heads, head_dim)
    normed_query, normed_key = torch.empty_like(query_out), torch.empty(tokens, kv_heads, head_dim, dtype=key.dtype, device=key.device)
    rms_norm(query.contiguous(), q_norm, out=normed_query, eps=eps)
    rms_norm(keys.contiguous(), k_norm, out=normed_key, eps=eps)
    rotated_key = torch.empty_like(normed_key)
    partial_rope(normed_query, positions, out=query_out, rotary_dim=rotary_dim, theta=theta)
    partial_rope(normed_key, positions, out=rotated_key, rotary_dim=rotary_dim, theta=theta)
    write_kv_all_valid(rotated_key, value.reshape(tokens, kv_heads, head_dim).contiguous(), k_cache, v_cache, slot_mapping)
    return query_out


def paged_decode_gated(
    query: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [B] int32
    q_gate: torch.Tensor,  # [B, Hq * 2D]: the gate is the second D of each head's 2D columns
    out: torch.Tensor,  # [B, Hq * D]
    scale: float,
) -> torch.Tensor:
    """out = paged_decode(query) * sigmoid(gate), per head; the attention output gate fused (torch composition)."""
    batch, heads, head_dim = query.shape
    _require(tuple(q_gate.shape) == (batch, heads * 2 * head_dim), f"q_gate must be [{batch}, {heads * 2 * head_dim}], got {tuple(q_gate.shape)}")
    _check_like("out", out, (batch, heads * head_dim), query.dtype, query.device)
    attended = torch.empty_like(query)
    paged_decode(query, k_cache, v_cache, block_tables, seq_lens, out=attended, scale=scale)
    gate = q_gate.reshape(batch, heads, 2, head_dim)[:, :, 1, :].reshape(batch, heads * head_dim)
    output_gate(attended.view(batch, heads * head_dim), gate.contiguous(), out=out)
    return out
