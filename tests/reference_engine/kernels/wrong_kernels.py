"""Known-wrong variants of the Triton kernels: the contracts must catch every one of them.

Each wraps the real kernel with one deliberate mistake of a kind real kernels make. They are
imported only in the interpreter subprocess (TRITON_INTERPRET=1 set before import).
"""

from __future__ import annotations

import torch

from reference_engine.kernels import nvfp4_gemv


def w4a16_nibbles_swapped(x, weight_packed, weight_scale, weight_scale_2, out):
    """Reads element 2j from the high nibble (the other packing convention)."""
    swapped = ((weight_packed >> 4) | (weight_packed << 4)).to(torch.uint8)
    return nvfp4_gemv.w4a16_linear(x, swapped, weight_scale, weight_scale_2, out)


def w4a16_last_tile_unwritten(x, weight_packed, weight_scale, weight_scale_2, out):
    """A grid one row block short: the last BLOCK_N output features keep whatever `out` held."""
    rows = weight_packed.shape[0]
    block_n = nvfp4_gemv.plan(x.reshape(-1, x.shape[-1]).shape[0], rows, weight_packed.shape[1], 132)[1]
    keep = (rows - 1) // block_n * block_n  # rows of every block but the last
    nvfp4_gemv.w4a16_linear(x, weight_packed[:keep], weight_scale[:keep], weight_scale_2, out[..., :keep])
    return out


def w4a16_scale_2_ignored(x, weight_packed, weight_scale, weight_scale_2, out):
    """Forgets the per-tensor scale."""
    return nvfp4_gemv.w4a16_linear(x, weight_packed, weight_scale, torch.ones_like(torch.as_tensor(weight_scale_2)), out)


def moe_gate_up_swapped(x, topk_weights, topk_ids, gate_up_proj, down_proj, out):
    """Takes rows 0:I as up and I:2I as gate (the w3/w1 order mistake)."""
    from reference_engine.kernels import moe_decode

    half = gate_up_proj.shape[1] // 2
    swapped = torch.cat([gate_up_proj[:, half:], gate_up_proj[:, :half]], dim=1)
    return moe_decode.routed_experts(x, topk_weights, topk_ids, swapped, down_proj, out)


def moe_last_slot_skipped(x, topk_weights, topk_ids, gate_up_proj, down_proj, out):
    """The slot loop of the down kernel stops one short (range(TOP_K - 1))."""
    from reference_engine.kernels import moe_decode

    weights = topk_weights.clone()
    weights[:, -1] = 0.0
    return moe_decode.routed_experts(x, weights, topk_ids, gate_up_proj, down_proj, out)


def router_ties_to_higher_index(router_logits, topk_weights, topk_ids, top_k):
    """Breaks ties toward the higher expert index (the kernel run on the reversed expert axis)."""
    from reference_engine.kernels import router

    experts = router_logits.shape[1]
    router.router_topk(router_logits.flip(1).contiguous(), topk_weights, topk_ids, top_k)
    topk_ids.copy_(experts - 1 - topk_ids)


def router_not_renormalised(router_logits, topk_weights, topk_ids, top_k):
    """Returns the top-k softmax probabilities without renormalising them."""
    from reference_engine.kernels import router

    router.router_topk(router_logits, topk_weights, topk_ids, top_k)
    chosen = torch.softmax(router_logits.float(), dim=-1).gather(1, topk_ids.long())
    topk_weights.mul_(chosen.sum(dim=1, keepdim=True))


def gdn_beta_ignored(query, key, value, g, beta, state, out, state_out):
    """Writes with full strength (beta taken as 1)."""
    from reference_engine.kernels import gdn_decode

    gdn_decode.gdn_recurrent_decode(query, key, value, g, torch.ones_like(beta), state, out, state_out)


def gdn_key_heads_tiled(query, key, value, g, beta, state, out, state_out):
    """Key head i serves value heads i, i + Hk, i + 2 Hk, ... (tiled) instead of i*G .. i*G+G-1."""
    from reference_engine.kernels import gdn_decode

    num_k_heads, num_v_heads = query.shape[1], value.shape[1]
    group = num_v_heads // num_k_heads
    heads = torch.arange(num_v_heads)
    order = torch.empty_like(heads)
    order[(heads % num_k_heads) * group + heads // num_k_heads] = heads  # slot p holds value head order[p]
    inverse = torch.argsort(order)
    moved_out = torch.empty_like(out)
    moved_state = torch.empty_like(state_out)
    gdn_decode.gdn_recurrent_decode(query, key, value[:, order].contiguous(), g[:, order].contiguous(), beta[:, order].contiguous(), state[:, order].contiguous(), moved_out, moved_state)
    out.copy_(moved_out[:, inverse])
    state_out.copy_(moved_state[:, inverse])


def paged_last_token_dropped(query, k_cache, v_cache, block_tables, seq_lens, out, scale):
    """Attends to seq_lens - 1 tokens (the new token's key and value left out)."""
    from reference_engine.kernels import paged_decode

    return paged_decode.paged_decode(query, k_cache, v_cache, block_tables, (seq_lens - 1).clamp(min=1), out, scale)


def paged_kv_heads_tiled(query, k_cache, v_cache, block_tables, seq_lens, out, scale):
    """Query head h reads KV head h % Hkv instead of h // (Hq / Hkv)."""
    from reference_engine.kernels import paged_decode

    query_heads, kv_heads = query.shape[1], k_cache.shape[2]
    group = query_heads // kv_heads
    heads = torch.arange(query_heads)
    order = torch.empty_like(heads)
    order[(heads % kv_heads) * group + heads // kv_heads] = heads
    moved = torch.empty_like(out)
    paged_decode.paged_decode(query[:, order].contiguous(), k_cache, v_cache, block_tables, seq_lens, moved, scale)
    out.copy_(moved[:, torch.argsort(order)])
    return out


def rms_norm_weight_not_zero_centred(x, weight, out, eps=1e-6):
    """Multiplies by w instead of 1 + w."""
    from reference_engine.kernels import norms

    return norms.rms_norm(x, weight - 1.0, out, eps)


def gated_rms_norm_zero_centred(x, z, weight, out, eps=1e-6):
    """Multiplies by 1 + w (the layer-norm convention) instead of w."""
    from reference_engine.kernels import norms

    return norms.gated_rms_norm(x, z, weight + 1.0, out, eps)


def fused_add_norms_x_not_the_sum(x, residual, weight, out, residual_out, eps=1e-6):
    """Writes the sum but normalises x alone."""
    from reference_engine.kernels import norms

    norms.fused_add_rms_norm(x, torch.zeros_like(residual), weight, out, torch.empty_like(residual_out), eps)
    residual_out.copy_(x.float() + residual.float())
    return out


def conv_taps_reversed(x, weight, cu_seqlens, initial_state, out, final_state):
    """Multiplies the current input by weight[:, 0] (the taps in the other order, a flipped kernel)."""
    from reference_engine.kernels import causal_conv1d

    causal_conv1d.causal_conv1d(x, weight.flip(1).contiguous(), cu_seqlens, initial_state, out, final_state)


def conv_initial_state_ignored(x, weight, cu_seqlens, initial_state, out, final_state):
    """Convolves with zero left padding (a plain causal conv) instead of the initial state; final state right."""
    from reference_engine.kernels import causal_conv1d

    causal_conv1d.causal_conv1d(x, weight, cu_seqlens, initial_state, torch.empty_like(out), final_state)
    causal_conv1d.causal_conv1d(x, weight, cu_seqlens, torch.zeros_like(initial_state), out, torch.empty_like(final_state))


def conv_final_state_from_outputs(x, weight, cu_seqlens, initial_state, out, final_state):
    """Keeps the last K-1 outputs (after the conv and SiLU) as the state instead of the last K-1 inputs."""
    from reference_engine.kernels import causal_conv1d

    state = initial_state.clone()
    causal_conv1d.causal_conv1d(x, weight, cu_seqlens, initial_state, out, final_state)
    causal_conv1d.causal_conv1d(out.clone(), weight, cu_seqlens, state, torch.empty_like(out), final_state)


def _grouped_with_counts(fix, x, router_weight, experts, shared, top_k, out):
    """`moe_block_decode` grouped by expert, with the group counts altered by `fix` before the expert kernels."""
    from reference_engine.kernels import moe_decode, moe_grouped_decode

    real_groups, real_min = moe_grouped_decode._groups, moe_grouped_decode.MIN_TOKENS

    def groups(ids, count, k):
        counts, pairs = real_groups(ids, count, k)
        fix(counts)
        return counts, pairs

    moe_grouped_decode._groups, moe_grouped_decode.MIN_TOKENS = groups, 1
    try:
        moe_decode.moe_block_decode(x, router_weight, experts, shared, top_k, out)
    finally:
        moe_grouped_decode._groups, moe_grouped_decode.MIN_TOKENS = real_groups, real_min


def grouped_shared_group_dropped(x, router_weight, experts, shared, top_k, out):
    """The grouped MoE decode without group 0 (the shared expert): its grid starts at the routed experts."""
    _grouped_with_counts(lambda counts: counts[:1].zero_(), x, router_weight, experts, shared, top_k, out)


def grouped_first_tile_only(x, router_weight, experts, shared, top_k, out):
    """The grouped MoE decode computing one tile of BLOCK_M pairs per group (no loop over a busy group's tiles)."""
    from reference_engine.kernels import moe_grouped_decode

    _grouped_with_counts(lambda counts: counts.clamp_(max=moe_grouped_decode.PLAN.block_m), x, router_weight, experts, shared, top_k, out)


def _half_grouped_with(fix_counts, chunk, x, router_weight, experts, shared, top_k, out):
    """`moe_block_decode` grouped by expert in packed float16 (`moe_grouped_half`), with the group counts altered by
    `fix_counts` and the shared expert's chunk size on the host set to `chunk` (the kernels still take 4 per chunk)."""
    from reference_engine.kernels import moe_decode, moe_grouped_half

    real = moe_grouped_half._groups, moe_grouped_half.CHUNK, moe_grouped_half.MIN_TOKENS, moe_grouped_half.MAX_TOKENS

    def groups(ids, count, k):
        counts, pairs = real[0](ids, count, k)
        fix_counts(counts)
        return counts, pairs

    moe_grouped_half._groups, moe_grouped_half.CHUNK, moe_grouped_half.MIN_TOKENS, moe_grouped_half.MAX_TOKENS = groups, chunk, 1, None
    try:
        moe_decode.moe_block_decode(x, router_weight, experts, shared, top_k, out)
    finally:
        moe_grouped_half._groups, moe_grouped_half.CHUNK, moe_grouped_half.MIN_TOKENS, moe_grouped_half.MAX_TOKENS = real


def half_grouped_first_pair_only(x, router_weight, experts, shared, top_k, out):
    """The packed float16 grouped MoE decode applying each routed expert to its first pair only."""
    _half_grouped_with(lambda counts: counts[1:].clamp_(max=1), 4, x, router_weight, experts, shared, top_k, out)


def half_grouped_first_chunk_only(x, router_weight, experts, shared, top_k, out):
    """The packed float16 grouped MoE decode without the loop over a busy expert's chunks (4 pairs at most)."""
    _half_grouped_with(lambda counts: counts[1:].clamp_(max=4), 4, x, router_weight, experts, shared, top_k, out)


def half_grouped_shared_chunks_short(x, router_weight, experts, shared, top_k, out):
    """The packed float16 grouped MoE decode launching one shared-expert program per 8 tokens (each still takes 4)."""
    _half_grouped_with(lambda counts: None, 8, x, router_weight, experts, shared, top_k, out)


def dequant_high_nibble_first(weight_packed, weight_scale, weight_scale_2, out):
    """Element 2j from the high nibble (the other packing convention)."""
    from reference_engine.kernels import nvfp4_dequant

    swapped = ((weight_packed >> 4) | (weight_packed << 4)).to(torch.uint8)
    nvfp4_dequant.dequantize_nvfp4_into(swapped, weight_scale, weight_scale_2, out)


def dequant_scale_per_32(weight_packed, weight_scale, weight_scale_2, out):
    """One block scale per 32 elements (the MXFP4 block size): every second scale column read twice."""
    from reference_engine.kernels import nvfp4_dequant

    doubled = weight_scale[:, ::2].repeat_interleave(2, dim=1)[:, : weight_scale.shape[1]].contiguous()
    nvfp4_dequant.dequantize_nvfp4_into(weight_packed, doubled, weight_scale_2, out)
