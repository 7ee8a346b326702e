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

from reference_engine.ops.attention import _check_like, _check_paged, _require
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
