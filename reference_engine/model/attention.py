"""Gated full attention over the paged KV cache (every 4th layer of Qwen3.6-35B-A3B).

q_proj output per head is [query | gate] (interleaved per head); q_norm/k_norm (zero-centred, per
head) -> partial RoPE -> the new K/V written into the cache -> paged attention (prefill or decode)
-> times sigmoid(gate) -> o_proj.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.cache.kv_write import write_kv
from reference_engine.cache.tensors import ModelCaches
from reference_engine.forward_batch import ForwardBatch
from reference_engine.model import gemv_pairs_scope
from reference_engine.model.eager_ops import eager_op, triton_allowed
from reference_engine.model.linear import Linear
from reference_engine.model.stacked_linear import StackedLinear
from reference_engine.ops import static_attention
from reference_engine.ops.attention import (
    output_gate,
    paged_decode,
    paged_prefill,
    paged_prefill_sdpa,
    partial_rope,
    split_q_gate,
)


@dataclass(frozen=True)
class GatedAttention:
    layer_index: int
    q_proj: Linear  # [Hq * 2D, H]
    k_proj: Linear  # [Hkv * D, H]
    v_proj: Linear  # [Hkv * D, H]
    o_proj: Linear  # [H, Hq * D]
    q_norm: torch.Tensor  # [D]
    k_norm: torch.Tensor  # [D]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    eps: float
    qkv: StackedLinear | None = None  # q_proj, k_proj, v_proj stacked (their Linears are views of it): one decode GEMV

    def _decode_fused(self, x: torch.Tensor, batch: ForwardBatch, caches: ModelCaches, ops) -> torch.Tensor:
        """Static decode (CUDA graphs): stacked q/k/v GEMV, one prep launch (norms, RoPE, KV write), gated paged decode, o_proj."""
        num_tokens, heads, head_dim = x.shape[0], self.num_heads, self.head_dim
        q_gate, key, value = self.qkv(x, ops)  # [T, Hq*2D], [T, Hkv*D], [T, Hkv*D] (views of one output)
        k_cache, v_cache = caches.k_cache[self.layer_index], caches.v_cache[self.layer_index]
        query = torch.empty(num_tokens, heads, head_dim, dtype=x.dtype, device=x.device)  # [T, Hq, D]
        ops.attention_decode_prep(q_gate, key, value, self.q_norm, self.k_norm, batch.positions, k_cache, v_cache, batch.slot_mapping,
                                  query_out=query, eps=self.eps, rotary_dim=self.rotary_dim, theta=self.rope_theta)  # fmt: skip
        gated = torch.empty(num_tokens, heads * head_dim, dtype=x.dtype, device=x.device)  # [T, Hq * D]
        pairs = gemv_pairs_scope.pairs_for(ops, gated, "paged_decode_gated", "w4a16_linear")  # batch 1: o_proj's x as float16 pairs
        ops.paged_decode_gated(query, k_cache, v_cache, batch.block_tables, batch.seq_lens, q_gate, out=gated, scale=head_dim**-0.5,
                               **({} if pairs is None else {"pairs_out": pairs}))  # fmt: skip
        with gemv_pairs_scope.given(gated, pairs):
            return self.o_proj(gated, ops)

    def _prefill_fused(self, x: torch.Tensor, batch: ForwardBatch, caches: ModelCaches) -> torch.Tensor:
        """Eager prefill with the Triton kernels (the GPU, or a forced backend): the stacked q/k/v GEMM, the decode
        path's prep launch for every token (norms, RoPE, K/V into the cache; `kernels.attention_prep`), fused attention
        over the cache, the output gate read in place from the q_proj output, o_proj. The composed path below spends
        about twenty launches (split, two norms, two rotations, K/V writes) where the prep spends one."""
        from reference_engine.kernels.attention_prep import attention_decode_prep

        num_tokens, heads, head_dim = x.shape[0], self.num_heads, self.head_dim
        q_gate, key, value = self.qkv(x)  # [T, Hq*2D], [T, Hkv*D], [T, Hkv*D] (views of one output)
        k_cache, v_cache = caches.k_cache[self.layer_index], caches.v_cache[self.layer_index]
        query = torch.empty(num_tokens, heads, head_dim, dtype=x.dtype, device=x.device)  # [T, Hq, D]
        attention_decode_prep(q_gate, key, value, self.q_norm, self.k_norm, batch.positions, k_cache, v_cache, batch.slot_mapping,
                              query_out=query, eps=self.eps, rotary_dim=self.rotary_dim, theta=self.rope_theta)  # fmt: skip
        attended = torch.empty_like(query)  # [T, Hq, D]
        prefill = paged_prefill_sdpa if x.is_cuda else paged_prefill
        prefill(query, k_cache, v_cache, batch.block_tables, batch.cu_seqlens_q, batch.seq_lens, out=attended, scale=head_dim**-0.5)
        gate = q_gate.unflatten(1, (heads, 2, head_dim))[:, :, 1]  # [T, Hq, D]: each head's second half, in place
        gated = torch.empty(num_tokens, heads * head_dim, dtype=x.dtype, device=x.device)  # [T, Hq * D]
        output_gate(attended, gate, out=gated.view(num_tokens, heads, head_dim))
        return self.o_proj(gated)

    def __call__(self, x: torch.Tensor, batch: ForwardBatch, caches: ModelCaches) -> torch.Tensor:
        """x [T, H] -> [T, H]; writes the new tokens' K/V into this layer's cache."""
        num_tokens, heads, kv_heads, head_dim = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        ops = getattr(batch, "ops", None)  # static decode (CUDA graphs): the OpSet chosen by the runner
        if ops is not None and self.qkv is not None:
            return self._decode_fused(x, batch, caches, ops)
        if ops is None and not batch.is_decode and self.qkv is not None and triton_allowed(x):
            return self._prefill_fused(x, batch, caches)
        norm = ops.rms_norm if ops is not None else eager_op("rms_norm", x)
        query_gate = self.q_proj(x, ops)  # [T, Hq * 2D]
        query = torch.empty(num_tokens, heads, head_dim, dtype=x.dtype, device=x.device)  # [T, Hq, D]
        gate = torch.empty(num_tokens, heads * head_dim, dtype=x.dtype, device=x.device)  # [T, Hq * D]
        split_q_gate(query_gate, query=query, gate=gate)
        key = self.k_proj(x, ops).view(num_tokens, kv_heads, head_dim)  # [T, Hkv, D]
        value = self.v_proj(x, ops).view(num_tokens, kv_heads, head_dim).contiguous()  # [T, Hkv, D]

        normed_query, normed_key = torch.empty_like(query), torch.empty_like(key)
        norm(query, self.q_norm, out=normed_query, eps=self.eps)
        norm(key, self.k_norm, out=normed_key, eps=self.eps)
        rotated_query, rotated_key = torch.empty_like(query), torch.empty_like(key)
        partial_rope(normed_query, batch.positions, out=rotated_query, rotary_dim=self.rotary_dim, theta=self.rope_theta)
        partial_rope(normed_key, batch.positions, out=rotated_key, rotary_dim=self.rotary_dim, theta=self.rope_theta)

        k_cache, v_cache = caches.k_cache[self.layer_index], caches.v_cache[self.layer_index]
        static = ops is not None  # CUDA-graph decode: capturable ops, no host sync
        if static:
            static_attention.write_kv_all_valid(rotated_key, value, k_cache, v_cache, batch.slot_mapping)
        else:
            write_kv(rotated_key, value, k_cache, v_cache, batch.slot_mapping)

        attended = torch.empty_like(query)  # [T, Hq, D]
        scale = head_dim**-0.5
        if static:
            ops.paged_decode(rotated_query, k_cache, v_cache, batch.block_tables, batch.seq_lens, out=attended, scale=scale)
        elif batch.is_decode:
            paged_decode(rotated_query, k_cache, v_cache, batch.block_tables, batch.seq_lens, out=attended, scale=scale)
        else:
            prefill = paged_prefill_sdpa if x.is_cuda and triton_allowed(x) else paged_prefill  # fused attention on the GPU
            prefill(rotated_query, k_cache, v_cache, batch.block_tables, batch.cu_seqlens_q, batch.seq_lens, out=attended, scale=scale)
        gated = torch.empty(num_tokens, heads * head_dim, dtype=x.dtype, device=x.device)  # [T, Hq * D]
        output_gate(attended.view(num_tokens, heads * head_dim), gate, out=gated)
        return self.o_proj(gated, ops)
