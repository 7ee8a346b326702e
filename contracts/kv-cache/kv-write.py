"""Executable half of kv-cache/kv-write. Imports only the standard library and torch."""

from __future__ import annotations

import torch


def make_inputs(axes, params, dtype, device, generator) -> dict:
    num_tokens, num_blocks, block_size = axes["num_tokens"], axes["num_blocks"], axes["block_size"]
    num_kv_heads, head_dim = axes["num_kv_heads"], axes["head_dim"]
    num_padding = axes["num_padding"]
    source = generator.device  # draw where the generator lives, then move

    def normal(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float32, device=source).to(dtype=dtype, device=device)

    # Distinct slots scattered over the whole cache, so a swapped block/offset lands elsewhere.
    slots = torch.randperm(num_blocks * block_size, generator=generator, device=source)[:num_tokens].to(torch.int64)  # [T]
    if num_padding:
        slots[-num_padding:] = -1
    return {
        "key": normal(num_tokens, num_kv_heads, head_dim),
        "value": normal(num_tokens, num_kv_heads, head_dim),
        "k_cache": normal(num_blocks, block_size, num_kv_heads, head_dim),
        "v_cache": normal(num_blocks, block_size, num_kv_heads, head_dim),
        "slot_mapping": slots.to(device),
    }


def reference(key, value, k_cache, v_cache, slot_mapping, **params) -> dict:
    num_blocks, block_size = k_cache.shape[0], k_cache.shape[1]
    k_out, v_out = k_cache.clone(), v_cache.clone()
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue  # padding
        block, offset = divmod(slot, block_size)
        assert block < num_blocks
        k_out[block, offset] = key[token]
        v_out[block, offset] = value[token]
    return {"k_cache_out": k_out, "v_cache_out": v_out}


def only_mapped_slots_change(inputs, outputs, params) -> None:
    """Slots not named by slot_mapping keep their old contents bit for bit (inputs hold the pre-call copies)."""
    block_size = inputs["k_cache"].shape[1]
    written = torch.zeros(inputs["k_cache"].shape[0] * block_size, dtype=torch.bool)
    mapped = inputs["slot_mapping"].cpu()
    written[mapped[mapped >= 0]] = True
    for name, out_name in (("k_cache", "k_cache_out"), ("v_cache", "v_cache_out")):
        before = inputs[name].reshape(written.shape[0], -1).cpu()
        after = outputs[out_name].reshape(written.shape[0], -1).cpu()
        changed = ~(before == after).all(dim=1) & ~written
        assert not bool(changed.any()), f"{out_name}: {int(changed.sum())} unmapped slots changed"


def key_value_mismatch(inputs, params):
    inputs = dict(inputs)
    inputs["value"] = inputs["value"][:, :, :-1].contiguous()
    return inputs, params


def slot_mapping_int32(inputs, params):
    inputs = dict(inputs)
    inputs["slot_mapping"] = inputs["slot_mapping"].to(torch.int32)
    return inputs, params


def cache_head_dim_mismatch(inputs, params):
    inputs = dict(inputs)
    inputs["k_cache"] = inputs["k_cache"][..., :-1].contiguous()
    inputs["v_cache"] = inputs["v_cache"][..., :-1].contiguous()
    return inputs, params


def cache_dtype_mismatch(inputs, params):
    inputs = dict(inputs)
    other = torch.float64 if inputs["k_cache"].dtype != torch.float64 else torch.float32
    inputs["k_cache"] = inputs["k_cache"].to(other)
    inputs["v_cache"] = inputs["v_cache"].to(other)
    return inputs, params
