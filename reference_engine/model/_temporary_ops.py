"""TEMPORARY until ops/attention.py, ops/linear_attention.py, ops/moe.py, quant/*.py, cache/kv_write.py land.

Private plain-torch stand-ins with the agreed signatures (COMMON.md); deleted before the work is done.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def split_q_gate(q_proj_out, query, gate):  # TEMPORARY
    T, H, D = query.shape
    both = q_proj_out.view(T, H, 2 * D)
    query.copy_(both[..., :D])
    gate.copy_(both[..., D:].reshape(T, H * D))
    return query, gate


def partial_rope(x, positions, out, rotary_dim, theta):  # TEMPORARY
    half = rotary_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=x.device) / rotary_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, half]
    cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
    x32 = x.float()
    x1, x2 = x32[..., :half], x32[..., half:rotary_dim]
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    out.copy_(torch.cat([rotated, x32[..., rotary_dim:]], dim=-1))
    return out


def output_gate(attn, gate, out):  # TEMPORARY
    out.copy_(attn.float() * torch.sigmoid(gate.float()))
    return out


def _gather_kv(cache, block_table, length):
    block_size = cache.shape[1]
    blocks = block_table[: (length + block_size - 1) // block_size].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:length]


def paged_prefill(query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out, scale):  # TEMPORARY
    num_heads, num_kv = query.shape[1], k_cache.shape[2]
    for b in range(seq_lens.shape[0]):
        start, end = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        length = int(seq_lens[b])
        q_len = end - start
        k = _gather_kv(k_cache, block_tables[b], length).float().repeat_interleave(num_heads // num_kv, dim=1)
        v = _gather_kv(v_cache, block_tables[b], length).float().repeat_interleave(num_heads // num_kv, dim=1)
        q = query[start:end].float()
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        q_pos = torch.arange(length - q_len, length, device=q.device)[:, None]
        k_pos = torch.arange(length, device=q.device)[None, :]
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
        out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(out.dtype)
    return out


def paged_decode(query, k_cache, v_cache, block_tables, seq_lens, out, scale):  # TEMPORARY
    cu = torch.arange(query.shape[0] + 1, dtype=torch.int32, device=query.device)
    return paged_prefill(query, k_cache, v_cache, block_tables, cu, seq_lens, out, scale)


def write_kv(key, value, k_cache, v_cache, slot_mapping):  # TEMPORARY
    k_cache.view(-1, *k_cache.shape[2:])[slot_mapping] = key.to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slot_mapping] = value.to(v_cache.dtype)


def causal_conv1d(x, weight, cu_seqlens, initial_state, out, final_state):  # TEMPORARY
    K = weight.shape[1]
    for b in range(cu_seqlens.shape[0] - 1):
        start, end = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
        full = torch.cat([initial_state[b].float(), x[start:end].float().t()], dim=1)  # [C, K-1+L]
        y = F.conv1d(full[None], weight.float()[:, None, :], groups=weight.shape[0])[0]  # [C, L]
        out[start:end] = F.silu(y).t().to(out.dtype)
        final_state[b] = full[:, full.shape[1] - (K - 1):].to(final_state.dtype)
    return out


def causal_conv1d_update(x, weight, conv_state, out, conv_state_out):  # TEMPORARY
    full = torch.cat([conv_state.float(), x.float()[:, :, None]], dim=2)  # [B, C, K]
    out.copy_(F.silu((full * weight.float()[None]).sum(-1)))
    conv_state_out.copy_(full[:, :, 1:])
    return out


def gdn_gates(a, b, A_log, dt_bias, g, beta):  # TEMPORARY
    g.copy_(-A_log.float().exp() * F.softplus(a.float() + dt_bias.float()))
    beta.copy_(torch.sigmoid(b.float()))
    return g, beta


def _recurrence(q, k, v, g, beta, state):
    Hv, Hk = v.shape[1], q.shape[1]
    q = q.float().repeat_interleave(Hv // Hk, dim=1)
    k = k.float().repeat_interleave(Hv // Hk, dim=1)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * q.shape[-1] ** -0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    S = state.float().clone()  # [Hv, Dk, Dv]
    outs = []
    for t in range(q.shape[0]):
        S = S * g[t].float().exp()[:, None, None]
        delta = beta[t].float()[:, None] * (v[t].float() - torch.einsum("hkv,hk->hv", S, k[t]))
        S = S + k[t][:, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", S, q[t]))
    return torch.stack(outs), S


def gdn_chunked_prefill(query, key, value, g, beta, cu_seqlens, initial_state, out, final_state, chunk_size=64):  # TEMPORARY
    for b in range(cu_seqlens.shape[0] - 1):
        s, e = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
        o, S = _recurrence(query[s:e], key[s:e], value[s:e], g[s:e], beta[s:e], initial_state[b])
        out[s:e] = o.to(out.dtype)
        final_state[b] = S
    return out


def gdn_recurrent_decode(query, key, value, g, beta, state, out, state_out):  # TEMPORARY
    for b in range(query.shape[0]):
        o, S = _recurrence(query[b : b + 1], key[b : b + 1], value[b : b + 1], g[b : b + 1], beta[b : b + 1], state[b])
        out[b] = o[0].to(out.dtype)
        state_out[b] = S
    return out


def router_topk(router_logits, topk_weights, topk_ids, top_k):  # TEMPORARY
    probs = router_logits.float().softmax(-1)
    values, ids = torch.topk(probs, top_k, dim=-1)
    topk_weights.copy_(values / values.sum(-1, keepdim=True))
    topk_ids.copy_(ids.to(torch.int32))
    return topk_weights, topk_ids


def routed_experts(x, topk_weights, topk_ids, gate_up_proj, down_proj, out):  # TEMPORARY
    acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    inter = down_proj.shape[2]
    for e in topk_ids.unique().tolist():
        rows, which = torch.where(topk_ids == e)
        h = x[rows].float() @ gate_up_proj[e].float().t()
        y = (F.silu(h[:, :inter]) * h[:, inter:]) @ down_proj[e].float().t()
        acc.index_add_(0, rows, y * topk_weights[rows, which, None])
    out.copy_(acc)
    return out


def shared_expert(x, gate_proj, up_proj, down_proj, gate_weight, out):  # TEMPORARY
    x32 = x.float()
    y = (F.silu(x32 @ gate_proj.float().t()) * (x32 @ up_proj.float().t())) @ down_proj.float().t()
    out.copy_(y * torch.sigmoid(x32 @ gate_weight.float().t()))
    return out


_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def dequantize_nvfp4(weight_packed, weight_scale, weight_scale_2, dtype):  # TEMPORARY
    low, high = weight_packed & 0xF, weight_packed >> 4
    codes = torch.stack([low, high], dim=-1).reshape(weight_packed.shape[0], -1).long()
    values = _E2M1.to(weight_packed.device)[codes]
    scales = weight_scale.float().repeat_interleave(16, dim=1) * weight_scale_2.float()
    return (values * scales).to(dtype)


def w4a16_linear(x, weight_packed, weight_scale, weight_scale_2, out):  # TEMPORARY
    w = dequantize_nvfp4(weight_packed, weight_scale, weight_scale_2, torch.float32)
    out.copy_(x.float() @ w.t())
    return out


def w4a4_linear(x, weight_packed, weight_scale, weight_scale_2, input_scale, out):  # TEMPORARY
    return w4a16_linear(x, weight_packed, weight_scale, weight_scale_2, out)
