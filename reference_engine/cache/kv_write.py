"""Write the new tokens' keys and values into the paged KV cache of one full-attention layer."""

from __future__ import annotations

import torch

from reference_engine.ops.host_values import host_list
from reference_engine.ops.registry import satisfies


@satisfies("kv-cache/kv-write", 1)
def write_kv(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], updated in place
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], updated in place
    slot_mapping: torch.Tensor,  # [T] int64, block_id * block_size + offset; negative entries are padding, skipped
) -> None:
    if key.dim() != 3 or key.shape != value.shape:
        raise ValueError(f"key and value must both be [T, num_kv_heads, head_dim], got {list(key.shape)} and {list(value.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], got "
            f"{list(k_cache.shape)} and {list(v_cache.shape)}"
        )
    if k_cache.shape[2:] != key.shape[1:]:
        raise ValueError(f"cache heads/head_dim {list(k_cache.shape[2:])} do not match key {list(key.shape[1:])}")
    if key.dtype != k_cache.dtype or value.dtype != v_cache.dtype:
        raise ValueError(f"key/value dtypes ({key.dtype}, {value.dtype}) differ from the caches ({k_cache.dtype}, {v_cache.dtype})")
    if slot_mapping.dtype != torch.int64 or slot_mapping.shape != key.shape[:1]:
        raise ValueError(f"slot_mapping must be int64 of shape [{key.shape[0]}], got {slot_mapping.dtype} {list(slot_mapping.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous (they are written through a flat view)")
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    flat_k = k_cache.view(-1, num_kv_heads, head_dim)  # [num_blocks * block_size, Hkv, D]
    flat_v = v_cache.view(-1, num_kv_heads, head_dim)
    if min(host_list(slot_mapping), default=0) >= 0:  # every token has a slot (read once per forward: ops/host_values.py)
        flat_k.index_copy_(0, slot_mapping, key)
        flat_v.index_copy_(0, slot_mapping, value)
    else:
        valid = slot_mapping >= 0  # [T]
        slots = slot_mapping[valid]  # [T_valid]
        flat_k.index_copy_(0, slots, key[valid])
        flat_v.index_copy_(0, slots, value[valid])
