"""Gated full attention of Qwen3.6-35B-A3B in plain torch: partial RoPE, q/gate split, output gate, attention.

Layouts (fixed across contracts and engine): query/key/value `[T, heads, head_dim]`; ragged
batches by `cu_seqlens [num_seqs + 1]` int32; paged caches `[num_blocks, block_size,
num_kv_heads, head_dim]` with `block_tables [num_seqs, max_blocks_per_seq]` int32 (entries past a
sequence's blocks are never read) and `seq_lens [num_seqs]` int32. Math runs in float32 whatever
the storage dtype; each output is rounded once.
"""

from __future__ import annotations

import torch

from reference_engine.ops.host_values import host_list
from reference_engine.ops.registry import satisfies


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check_like(name: str, tensor: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    _require(tuple(tensor.shape) == tuple(shape), f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
    _require(tensor.dtype == dtype, f"{name} has dtype {tensor.dtype}, expected {dtype}")
    _require(tensor.device == device, f"{name} is on {tensor.device}, expected {device}")


def _rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, rotary_dim // 2] in float32; the angles are formed in float64 so large positions stay exact."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=positions.device) / rotary_dim
    inverse_frequencies = 1.0 / (theta**exponents)  # [rotary_dim // 2]
    angles = positions.to(torch.float64)[:, None] * inverse_frequencies[None, :]  # [T, rotary_dim // 2]
    return angles.cos().float(), angles.sin().float()


@satisfies("attention/partial-rope", major=1)
def partial_rope(x: torch.Tensor, positions: torch.Tensor, out: torch.Tensor, rotary_dim: int = 64, theta: float = 1e7) -> torch.Tensor:
    """Rotate the first `rotary_dim` dims of each head (half-split pairs (i, i + rotary_dim/2)); copy the rest. x [T, H, D]."""
    _require(x.dim() == 3, f"x must be [T, heads, head_dim], got shape {tuple(x.shape)}")
    _require(x.is_floating_point(), f"x must be floating, got {x.dtype}")
    tokens, _, head_dim = x.shape
    _require(isinstance(rotary_dim, int) and rotary_dim > 0 and rotary_dim % 2 == 0, f"rotary_dim must be a positive even integer, got {rotary_dim!r}")
    _require(rotary_dim <= head_dim, f"rotary_dim {rotary_dim} exceeds head_dim {head_dim}")
    _require(theta > 0, f"theta must be positive, got {theta}")
    _require(positions.dim() == 1 and positions.shape[0] == tokens, f"positions must be [{tokens}], got shape {tuple(positions.shape)}")
    _require(not positions.is_floating_point() and positions.dtype != torch.bool, f"positions must be integers, got {positions.dtype}")
    _check_like("out", out, tuple(x.shape), x.dtype, x.device)
    cos, sin = _rope_cos_sin(positions, rotary_dim, theta)  # [T, R/2]
    cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, R/2]
    half = rotary_dim // 2
    first = x[..., :half].float()  # [T, H, R/2]
    second = x[..., half:rotary_dim].float()
    rotated_first = first * cos - second * sin
    rotated_second = second * cos + first * sin
    if rotary_dim < head_dim:
        out[..., rotary_dim:].copy_(x[..., rotary_dim:])
    out[..., :half].copy_(rotated_first)
    out[..., half:rotary_dim].copy_(rotated_second)
    return out


@satisfies("attention/q-gate-split", major=1)
def split_q_gate(q_proj_out: torch.Tensor, query: torch.Tensor, gate: torch.Tensor, head_dim: int | None = None) -> torch.Tensor:
    """[T, H*2D] with head h at columns [h*2D, h*2D+D) (query) and [h*2D+D, (h+1)*2D) (gate) -> query [T, H, D], gate [T, H*D].

    `head_dim`, when given, must equal query's last dim (the contract passes it; the model need not).
    """
    _require(query.dim() == 3, f"query must be [T, heads, head_dim], got shape {tuple(query.shape)}")
    tokens, heads, query_head_dim = query.shape
    _require(head_dim is None or head_dim == query_head_dim, f"head_dim {head_dim} differs from query's last dim {query_head_dim}")
    head_dim = query_head_dim
    _check_like("q_proj_out", q_proj_out, (tokens, heads * 2 * head_dim), query.dtype, query.device)
    _check_like("gate", gate, (tokens, heads * head_dim), query.dtype, query.device)
    _require(gate.is_contiguous(), "gate must be contiguous (it is written through a per-head view)")
    per_head = q_proj_out.reshape(tokens, heads, 2, head_dim)  # [T, H, 2, D]
    query.copy_(per_head[:, :, 0, :])
    gate.view(tokens, heads, head_dim).copy_(per_head[:, :, 1, :])
    return query


@satisfies("attention/output-gate", major=1)
def output_gate(attn: torch.Tensor, gate: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = attn * sigmoid(gate), in float32; attn, gate, out [T, H*D]."""
    _require(attn.is_floating_point(), f"attn must be floating, got {attn.dtype}")
    _check_like("gate", gate, tuple(attn.shape), attn.dtype, attn.device)
    _check_like("out", out, tuple(attn.shape), attn.dtype, attn.device)
    out.copy_(attn.float() * torch.sigmoid(gate.float()))
    return out


def _check_heads(query: torch.Tensor, key_like: torch.Tensor, name: str) -> None:
    _require(query.dim() == 3, f"query must be [tokens, heads, head_dim], got shape {tuple(query.shape)}")
    _require(query.is_floating_point(), f"query must be floating, got {query.dtype}")
    _require(key_like.dtype == query.dtype, f"{name} has dtype {key_like.dtype}, query {query.dtype}")
    _require(key_like.device == query.device, f"{name} is on {key_like.device}, query on {query.device}")
    _require(key_like.shape[-1] == query.shape[-1], f"{name} head_dim {key_like.shape[-1]} differs from query's {query.shape[-1]}")
    kv_heads = key_like.shape[-2]
    _require(kv_heads >= 1 and query.shape[1] % kv_heads == 0, f"query heads {query.shape[1]} are not a multiple of {name} heads {kv_heads}")


def _check_cu_seqlens(cu_seqlens: torch.Tensor, total: int, name: str) -> list[int]:
    _require(cu_seqlens.dim() == 1 and cu_seqlens.shape[0] >= 2, f"{name} must be [num_seqs + 1] with num_seqs >= 1, got shape {tuple(cu_seqlens.shape)}")
    _require(cu_seqlens.dtype in (torch.int32, torch.int64), f"{name} must be int32, got {cu_seqlens.dtype}")
    bounds = host_list(cu_seqlens)
    _require(bounds[0] == 0, f"{name} must start at 0, got {bounds[0]}")
    _require(all(b <= a for b, a in zip(bounds, bounds[1:])), f"{name} must be non-decreasing, got {bounds}")
    _require(bounds[-1] == total, f"{name} ends at {bounds[-1]} but there are {total} tokens")
    return bounds


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float, first_position: int) -> torch.Tensor:
    """Causal attention of q_len queries at positions first_position.. over keys 0..; float32 [q_len, Hq, D]."""
    q_len, query_heads, _ = query.shape
    key_len, kv_heads, _ = key.shape
    group = query_heads // kv_heads
    q = query.float().transpose(0, 1)  # [Hq, q_len, D]
    k = key.float().transpose(0, 1).repeat_interleave(group, dim=0)  # [Hq, key_len, D]
    v = value.float().transpose(0, 1).repeat_interleave(group, dim=0)
    scores = torch.matmul(q, k.transpose(1, 2)) * scale  # [Hq, q_len, key_len]
    query_positions = torch.arange(q_len, device=query.device)[:, None] + first_position
    allowed = torch.arange(key_len, device=query.device)[None, :] <= query_positions  # [q_len, key_len]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v).transpose(0, 1)  # [q_len, Hq, D]


@satisfies("attention/gqa-prefill", major=1)
def gqa_prefill(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor, out: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention per sequence of a ragged batch; query [T, Hq, D], key/value [T, Hkv, D]."""
    _check_heads(query, key, "key")
    _check_like("value", value, tuple(key.shape), key.dtype, key.device)
    _require(key.dim() == 3 and key.shape[0] == query.shape[0], f"key must be [{query.shape[0]}, kv_heads, head_dim], got {tuple(key.shape)}")
    _check_like("out", out, tuple(query.shape), query.dtype, query.device)
    _require(scale > 0, f"scale must be positive, got {scale}")
    bounds = _check_cu_seqlens(cu_seqlens, query.shape[0], "cu_seqlens")
    for start, end in zip(bounds, bounds[1:]):
        if end > start:
            out[start:end].copy_(_attend(query[start:end], key[start:end], value[start:end], scale, 0))
    return out


def _check_paged(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor, num_seqs: int) -> list[int]:
    _check_heads(query, k_cache, "k_cache")
    _require(k_cache.dim() == 4, f"k_cache must be [num_blocks, block_size, kv_heads, head_dim], got shape {tuple(k_cache.shape)}")
    _check_like("v_cache", v_cache, tuple(k_cache.shape), k_cache.dtype, k_cache.device)
    _require(block_tables.dim() == 2 and block_tables.shape[0] == num_seqs, f"block_tables must be [{num_seqs}, max_blocks_per_seq], got shape {tuple(block_tables.shape)}")
    _require(block_tables.dtype in (torch.int32, torch.int64), f"block_tables must be int32, got {block_tables.dtype}")
    _require(seq_lens.dim() == 1 and seq_lens.shape[0] == num_seqs, f"seq_lens must be [{num_seqs}], got shape {tuple(seq_lens.shape)}")
    _require(seq_lens.dtype in (torch.int32, torch.int64), f"seq_lens must be int32, got {seq_lens.dtype}")
    lengths = host_list(seq_lens)
    num_blocks, block_size = k_cache.shape[0], k_cache.shape[1]
    capacity = block_tables.shape[1] * block_size
    _require(all(1 <= n <= capacity for n in lengths), f"seq_lens must lie in [1, {capacity}] (max_blocks_per_seq x block_size), got {lengths}")
    tables = host_list(block_tables)
    for row, length in zip(tables, lengths):
        used = row[: -(-length // block_size)]
        _require(all(0 <= b < num_blocks for b in used), f"block table row {used} names blocks outside [0, {num_blocks})")
    return lengths


def _gather(cache: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
    return cache[blocks].flatten(0, 1)[:length]  # [length, Hkv, D]


def _prefill_sequences(query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out, scale):
    """Checks every input of a paged prefill first, then yields (start, end, cached length, key [L, Hkv, D],
    value) per sequence with queries, its keys gathered from the cache in block-table order."""
    bounds = _check_cu_seqlens(cu_seqlens_q, query.shape[0], "cu_seqlens_q")
    lengths = _check_paged(query, k_cache, v_cache, block_tables, seq_lens, len(bounds) - 1)
    _check_like("out", out, tuple(query.shape), query.dtype, query.device)
    _require(scale > 0, f"scale must be positive, got {scale}")
    for index, (start, end, length) in enumerate(zip(bounds, bounds[1:], lengths)):
        _require(end - start <= length, f"sequence {index} has {end - start} queries but only {length} cached tokens")
    block_size = k_cache.shape[1]
    for index, (start, end, length) in enumerate(zip(bounds, bounds[1:], lengths)):
        if end > start:
            blocks = block_tables[index, : -(-length // block_size)].long()
            yield start, end, length, _gather(k_cache, blocks, length), _gather(v_cache, blocks, length)


@satisfies("attention/paged-prefill", major=1)
def paged_prefill(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Queries are the last q_len tokens of each sequence; their keys (and all earlier ones) are already cached."""
    for start, end, length, key, value in _prefill_sequences(query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out, scale):
        out[start:end].copy_(_attend(query[start:end], key, value, scale, length - (end - start)))
    return out


@satisfies("attention/paged-prefill", major=1)
def paged_prefill_sdpa(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """`paged_prefill` through torch's fused attention (`scaled_dot_product_attention`, grouped heads): on CUDA
    in bf16 a flash / memory-efficient kernel per sequence instead of float32 score matrices (the eager
    prefill's choice on the GPU). A sequence whose queries are all its tokens runs causal; one that continues
    a cached prefix gets the offset causal mask."""
    for start, end, length, key, value in _prefill_sequences(query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out, scale):
        q_len = end - start
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (query[start:end], key, value))  # [1, H, len, D]
        mask = None
        if q_len != length:  # query i sits at position length - q_len + i and sees keys 0 .. that position
            mask = torch.arange(length, device=query.device)[None, :] <= torch.arange(length - q_len, length, device=query.device)[:, None]
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True)
        out[start:end].copy_(attended[0].transpose(0, 1))
    return out


@satisfies("attention/paged-decode", major=1)
def paged_decode(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per sequence over its seq_lens cached tokens; query/out [B, Hq, D]. Vectorised over the batch."""
    lengths = _check_paged(query, k_cache, v_cache, block_tables, seq_lens, query.shape[0])
    _check_like("out", out, tuple(query.shape), query.dtype, query.device)
    _require(scale > 0, f"scale must be positive, got {scale}")
    batch, query_heads, head_dim = query.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    max_blocks = -(-max(lengths) // block_size)
    blocks = block_tables[:, :max_blocks].long().clamp(min=0)  # unused entries masked below, never trusted
    keys = k_cache[blocks].flatten(1, 2).float()  # [B, L, Hkv, D]
    values = v_cache[blocks].flatten(1, 2).float()
    group = query_heads // kv_heads
    q = query.float().reshape(batch, kv_heads, group, head_dim)  # [B, Hkv, G, D]
    scores = torch.einsum("bhgd,blhd->bhgl", q, keys) * scale  # [B, Hkv, G, L]
    valid = torch.arange(keys.shape[1], device=query.device)[None, :] < seq_lens.to(query.device).long()[:, None]  # [B, L]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out.copy_(torch.einsum("bhgl,blhd->bhgd", weights, values).reshape(batch, query_heads, head_dim))
    return out
