"""Executable half of attention/decode-prep: float64 reference (norm, rotation, cache write), inputs, mutations.

The reference follows the model's definition step by step, per head and per rotated pair, with no
shortcut shared with an engine: zero-centred RMSNorm `x / sqrt(mean(x^2) + eps) * (1 + w)` over
head_dim, then half-split RoPE of the first rotary_dim dims (pairs (i, i + rotary_dim / 2), angle
position * theta^(-2i / rotary_dim) formed in float64), then the key and the untouched value
written at their slot of the paged cache.
"""

from __future__ import annotations

import torch

FLOAT32_MAX_POSITION = 8192  # float32 cases: an implementation forming angles in float32 stays in bound
MAX_POSITION = 262144  # max_position_embeddings of the model


def make_inputs(axes, params, dtype, device, generator):
    tokens, query_heads, kv_heads, head_dim = axes["T"], axes["HQ"], axes["HKV"], axes["D"]
    num_blocks, block_size = axes["NB"], axes["BS"]

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    # Each (token, head) at its own scale, so a norm over all heads of a token (not per head) is wrong.
    q_scale = torch.rand(tokens, query_heads, 1, 1, generator=generator, dtype=torch.float64) * 3.5 + 0.5
    q_gate = (draw(tokens, query_heads, 2, head_dim) * q_scale).reshape(tokens, query_heads * 2 * head_dim)
    k_scale = torch.rand(tokens, kv_heads, 1, generator=generator, dtype=torch.float64) * 3.5 + 0.5
    key = (draw(tokens, kv_heads, head_dim) * k_scale).reshape(tokens, kv_heads * head_dim)
    value = draw(tokens, kv_heads * head_dim)
    high = FLOAT32_MAX_POSITION if dtype == torch.float32 else MAX_POSITION
    positions = torch.randint(0, high, (tokens,), generator=generator, dtype=torch.int64)
    if tokens >= 2:
        positions[0] = 0  # the identity rotation
        positions[1] = high - 1  # the largest position of the case
    slots = torch.randperm(num_blocks * block_size, generator=generator)[:tokens].to(torch.int64)  # distinct, scattered
    if tokens >= 2 and slots[0] < slots[1]:
        slots[[0, 1]] = slots[[1, 0]]  # never in increasing order
    cache_shape = (num_blocks, block_size, kv_heads, head_dim)
    return {
        "q_gate": q_gate.to(dtype).to(device),
        "key": key.to(dtype).to(device),
        "value": value.to(dtype).to(device),
        "q_norm": (0.3 * draw(head_dim)).to(dtype).to(device),
        "k_norm": (0.3 * draw(head_dim)).to(dtype).to(device),
        "positions": positions.to(device),
        "k_cache": draw(*cache_shape).to(dtype).to(device),
        "v_cache": draw(*cache_shape).to(dtype).to(device),
        "slot_mapping": slots.to(device),
    }


def zero_centred_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, H, D] float64: per head over D, scale (1 + weight)."""
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * (1.0 + weight.double())


def rotate(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float) -> torch.Tensor:
    """Half-split RoPE of the first rotary_dim dims of x [T, H, D] float64, one pair at a time."""
    out = x.clone()
    half = rotary_dim // 2
    for i in range(half):
        angle = positions.double() * float(theta) ** (-(2.0 * i) / rotary_dim)  # [T]
        cos, sin = torch.cos(angle)[:, None], torch.sin(angle)[:, None]
        first, second = x[:, :, i], x[:, :, i + half]
        out[:, :, i] = first * cos - second * sin
        out[:, :, i + half] = second * cos + first * sin
    return out


def reference(q_gate, key, value, q_norm, k_norm, positions, k_cache, v_cache, slot_mapping, eps, rotary_dim, theta):
    tokens = q_gate.shape[0]
    _, block_size, kv_heads, head_dim = k_cache.shape
    query_heads = q_gate.shape[1] // (2 * head_dim)
    query = q_gate.double().reshape(tokens, query_heads, 2, head_dim)[:, :, 0, :]  # the first D of each head's 2D
    keys = key.double().reshape(tokens, kv_heads, head_dim)
    query_out = rotate(zero_centred_norm(query, q_norm, eps), positions, rotary_dim, theta)
    rotated_keys = rotate(zero_centred_norm(keys, k_norm, eps), positions, rotary_dim, theta)
    k_out, v_out = k_cache.double().clone(), v_cache.double().clone()
    values = value.double().reshape(tokens, kv_heads, head_dim)
    for token, slot in enumerate(slot_mapping.tolist()):
        block, offset = divmod(slot, block_size)
        k_out[block, offset] = rotated_keys[token]
        v_out[block, offset] = values[token]
    return {"query_out": query_out, "k_cache_out": k_out, "v_cache_out": v_out}


def only_mapped_slots_change(inputs, outputs, params) -> None:
    """Cache slots not named by slot_mapping keep their contents bit for bit (inputs hold the pre-call copies)."""
    num_blocks, block_size = inputs["k_cache"].shape[:2]
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[inputs["slot_mapping"].cpu()] = True
    for name, out_name in (("k_cache", "k_cache_out"), ("v_cache", "v_cache_out")):
        before = _bytes_per_slot(inputs[name], written.shape[0])
        after = _bytes_per_slot(outputs[out_name], written.shape[0])
        changed = (before != after).any(dim=1) & ~written
        assert not bool(changed.any()), f"{out_name}: {int(changed.sum())} slots outside slot_mapping changed"


def _bytes_per_slot(cache: torch.Tensor, slots: int) -> torch.Tensor:
    """The raw bytes of each slot [slots, bytes] (a bitwise comparison, NaN included)."""
    return cache.detach().cpu().contiguous().reshape(-1).view(torch.uint8).reshape(slots, -1)


def unchanged(inputs, params):
    return inputs, params


def slot_mapping_int32(inputs, params):
    inputs["slot_mapping"] = inputs["slot_mapping"].to(torch.int32)
    return inputs, params


def positions_short(inputs, params):
    inputs["positions"] = inputs["positions"][:-1].clone()
    return inputs, params


def q_gate_without_gate(inputs, params):
    """The query alone, [T, HQ * D]: the gate half of each head missing."""
    tokens = inputs["q_gate"].shape[0]
    head_dim = inputs["k_cache"].shape[3]
    inputs["q_gate"] = inputs["q_gate"].reshape(tokens, -1, 2, head_dim)[:, :, 0, :].reshape(tokens, -1).clone()
    return inputs, params


def caches_other_dtype(inputs, params):
    other = torch.float16 if inputs["k_cache"].dtype != torch.float16 else torch.float32
    inputs["k_cache"] = inputs["k_cache"].to(other)
    inputs["v_cache"] = inputs["v_cache"].to(other)
    return inputs, params


def k_norm_per_token(inputs, params):
    """k_norm over all KV heads of a token, [HKV * D]."""
    inputs["k_norm"] = inputs["k_norm"].repeat(inputs["k_cache"].shape[2]).clone()
    return inputs, params


def caches_not_contiguous(inputs, params):
    """Caches of the right shape stored [NB, HKV, BS, D] (a transposed view): slot offsets would be wrong."""
    for name in ("k_cache", "v_cache"):
        cache = inputs[name]
        inputs[name] = cache.transpose(1, 2).contiguous().transpose(1, 2)
    return inputs, params
