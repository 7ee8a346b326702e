"""Gated DeltaNet (linear attention) layer over the state-slot pool (3 of every 4 layers).

in_proj_qkv -> depthwise causal conv1d + SiLU (state: the last K-1 inputs) -> split q, k, v ->
gates g, beta -> delta-rule recurrence (state [Hv, Dk, Dv] float32; the op L2-normalises q, k)
-> gated RMSNorm with z per head -> out_proj. States are gathered from `caches` at the batch's
state slots (zeros on a sequence's first chunk), updated by the ops, and scattered back. The static
(CUDA-graph) decode path, `batch.ops` set, instead calls `ops.gdn_decode_step`, which does the whole
step between the projections with the states updated in place in the pools. The eager path picks each
op through `model.eager_ops.eager_op`: on CUDA the Triton causal conv1d, gates, chunked prefill and gated RMSNorm
kernels (where Triton imports), on the CPU the torch ops. A prefill on the Triton kernels passes the pools and the
slots to them (`_prefill_in_pools`: no gather, mask or scatter launches; a padded graph prefill's padding handled
inside the conv and gates launches); the torch ops gather and scatter (`_composed`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.cache.tensors import ModelCaches
from reference_engine.forward_batch import ForwardBatch
from reference_engine.kernels import side_stream
from reference_engine.model import gemv_pairs_scope
from reference_engine.model.eager_ops import eager_backend, eager_op
from reference_engine.model.linear import Linear
from reference_engine.model.stacked_linear import StackedLinear
from reference_engine.ops.linear_attention import (
    causal_conv1d_update,
    gdn_gates,
    gdn_recurrent_decode,
)

_POOLED_OPS = ("causal_conv1d", "gdn_gates", "gdn_chunked_prefill")  # a prefill on these Triton kernels keeps its states in the pools


def _last_conv_inputs(mixed: torch.Tensor, conv_in: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The conv state after the first `valid` rows of a one-sequence prefill: its last K-1 inputs, oldest first,
    reaching back into the initial state `conv_in [1, C, K-1]` when the prompt is shorter (device indices only)."""
    width = conv_in.shape[2]
    rows = valid - width + torch.arange(width, device=mixed.device)  # [K-1] rows of `mixed`, negative: before the prompt
    from_prompt = mixed.index_select(0, rows.clamp(min=0)).t()  # [C, K-1]
    from_state = conv_in[0].index_select(1, (rows + width).clamp(max=width - 1))  # [C, K-1]
    return torch.where(rows[None, :] >= 0, from_prompt, from_state)[None]  # [1, C, K-1]


@dataclass(frozen=True)
class GatedDeltaNet:
    layer_index: int
    in_proj_qkv: Linear  # [2 * Hk * Dk + Hv * Dv, H]
    in_proj_z: Linear  # [Hv * Dv, H]
    in_proj_b: Linear  # [Hv, H]
    in_proj_a: Linear  # [Hv, H]
    conv_weight: torch.Tensor  # [C, K]
    A_log: torch.Tensor  # [Hv]
    dt_bias: torch.Tensor  # [Hv]
    norm_weight: torch.Tensor  # [Dv]
    out_proj: Linear  # [H, Hv * Dv]
    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    eps: float
    in_proj_qkvz: StackedLinear | None = None  # in_proj_qkv + in_proj_z stacked (their Linears are views): one GEMV / GEMM
    in_proj_ba: StackedLinear | None = None  # in_proj_b + in_proj_a stacked likewise

    def _projections(self, x: torch.Tensor, ops, side=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """mixed [T, C], z [T, Hv*Dv], b [T, Hv], a [T, Hv]: from the stacks where built (strided views), else one by one.

        With `side` (a `kernels.side_stream.SideStream`, static decode) and both stacks built, the b/a launch runs on the
        side stream beside the q/k/v/z launch."""
        if side is not None and self.in_proj_qkvz is not None and self.in_proj_ba is not None:
            (mixed, z_flat), (b, a) = side.branches(lambda: self.in_proj_qkvz(x, ops), lambda: self.in_proj_ba(x, ops))
            return mixed, z_flat, b, a
        if self.in_proj_qkvz is not None:
            mixed, z_flat = self.in_proj_qkvz(x, ops)
        else:
            mixed, z_flat = self.in_proj_qkv(x, ops), self.in_proj_z(x, ops)
        if self.in_proj_ba is not None:
            b, a = self.in_proj_ba(x, ops)
        else:
            b, a = self.in_proj_b(x, ops), self.in_proj_a(x, ops)
        return mixed, z_flat, b, a

    def _ba_fold_weight(self, ops, x: torch.Tensor) -> torch.Tensor | None:
        """The stacked dense b/a weight when the graph decode's Triton GDN step computes b and a itself at this batch
        (`gdn_decode_step.folds_ba`), else None (the b/a linear runs as its own launch)."""
        stack = self.in_proj_ba
        if ops.backends.get("gdn_decode_step") != "triton" or stack is None or stack.weight is None or stack.weight.dtype != x.dtype:
            return None
        from reference_engine.kernels import gdn_decode_step

        return stack.weight if gdn_decode_step.folds_ba(x.shape[0]) and x.stride(1) == 1 else None

    def _initial_states(self, batch: ForwardBatch, caches: ModelCaches) -> tuple[torch.Tensor, torch.Tensor]:
        slots = batch.state_slots
        conv = caches.conv_state[self.layer_index][slots]  # [B, C, K-1]
        recurrent = caches.recurrent_state[self.layer_index][slots]  # [B, Hv, Dk, Dv]
        fresh = ~batch.has_initial_state  # [B]
        # masked_fill with a broadcast mask (not boolean indexing): no host sync, so CUDA graphs can capture it
        return conv.masked_fill(fresh[:, None, None], 0), recurrent.masked_fill(fresh[:, None, None, None], 0)

    def __call__(self, x: torch.Tensor, batch: ForwardBatch, caches: ModelCaches) -> torch.Tensor:
        """x [T, H] -> [T, H]; reads and writes this layer's conv and recurrent states at batch.state_slots."""
        num_tokens = x.shape[0]
        ops = getattr(batch, "ops", None)  # static decode (CUDA graphs): the OpSet chosen by the runner
        if ops is not None and batch.is_decode:  # static decode (T = B): one fused op, both states updated in place at the slots
            ba_weight = self._ba_fold_weight(ops, x)
            fold = {}
            if ba_weight is not None:  # the step computes b and a from x itself: no b/a launch (kernels/gdn_decode_step.py)
                mixed, z_flat = self.in_proj_qkvz(x, ops) if self.in_proj_qkvz is not None else (self.in_proj_qkv(x, ops), self.in_proj_z(x, ops))
                b, a = torch.empty(num_tokens, 2 * self.num_v_heads, dtype=x.dtype, device=x.device).split(self.num_v_heads, dim=1)  # written by the step
                fold = {"ba_from": (x, ba_weight)}
            else:
                side = getattr(batch, "side", None)
                side = side if side_stream.ba_on_side(side, num_tokens) else None
                mixed, z_flat, b, a = self._projections(x, ops, side)  # [T, C], [T, Hv*Dv], [T, Hv], [T, Hv] (views)
            core = torch.empty_like(z_flat, memory_format=torch.contiguous_format)  # [B, Hv * Dv]
            pairs = gemv_pairs_scope.pairs_for(ops, core, "gdn_decode_step", "w4a16_linear")  # batch 1: out_proj's x as float16 pairs
            ops.gdn_decode_step(
                mixed, z_flat, b, a, self.conv_weight, self.A_log, self.dt_bias,
                self.norm_weight, caches.conv_state[self.layer_index], caches.recurrent_state[self.layer_index],
                batch.state_slots, batch.has_initial_state, out=core, eps=self.eps, **({} if pairs is None else {"pairs_out": pairs}), **fold,
            )  # fmt: skip
            with gemv_pairs_scope.given(core, pairs):
                return self.out_proj(core, ops)
        mixed, z_flat, b, a = self._projections(x, ops)  # [T, C], [T, Hv * Dv], [T, Hv], [T, Hv] (views of two stacked outputs)
        z = z_flat.view(num_tokens, self.num_v_heads, self.v_head_dim)  # [T, Hv, Dv]
        valid = getattr(batch, "valid_tokens", None)  # a padded prefill (prefill_graphs.py): rows valid.. are padding
        conv_out = torch.empty_like(mixed)  # [T, C]
        g = torch.empty(num_tokens, self.num_v_heads, dtype=torch.float32, device=x.device)  # [T, Hv]
        beta = torch.empty(num_tokens, self.num_v_heads, dtype=torch.float32, device=x.device)  # [T, Hv]
        core = torch.empty(num_tokens, self.num_v_heads, self.v_head_dim, dtype=x.dtype, device=x.device)  # [T, Hv, Dv]
        if not batch.is_decode and all(eager_backend(name, mixed) == "triton" for name in _POOLED_OPS):
            self._prefill_in_pools(mixed, a, b, batch, caches, conv_out, g, beta, core, valid)
        else:
            self._composed(mixed, a, b, batch, caches, conv_out, g, beta, core, valid)
        normed = torch.empty_like(core)  # [T, Hv, Dv]
        eager_op("gated_rms_norm", core)(core, z, self.norm_weight, out=normed, eps=self.eps)  # z: a view of the stacked output
        return self.out_proj(normed.view(num_tokens, self.num_v_heads * self.v_head_dim), ops)

    def _composed(self, mixed, a, b, batch: ForwardBatch, caches: ModelCaches, conv_out, g, beta, core, valid) -> None:
        """Gather the states at the batch's slots (zeros for fresh sequences), run the ops, scatter the states back."""
        num_tokens = mixed.shape[0]
        conv_in, state_in = self._initial_states(batch, caches)
        conv_state_out = torch.empty_like(conv_in)  # [B, C, K-1]
        if batch.is_decode:
            causal_conv1d_update(mixed, self.conv_weight, conv_in, out=conv_out, conv_state_out=conv_state_out)
        else:
            eager_op("causal_conv1d", mixed)(mixed, self.conv_weight, batch.cu_seqlens_q, conv_in, out=conv_out, final_state=conv_state_out)
        if valid is not None:
            conv_state_out.copy_(_last_conv_inputs(mixed, conv_in, valid))
        caches.conv_state[self.layer_index][batch.state_slots] = conv_state_out
        query, key, value = self._heads(conv_out)
        # padding rows (valid set): decay exp(0) = 1 and beta 0 leave the state exactly as the prompt left it
        if eager_backend("gdn_gates", a) == "triton":  # one launch; padding rows zeroed in it
            eager_op("gdn_gates", a)(a, b, self.A_log, self.dt_bias, g=g, beta=beta, **({} if valid is None else {"valid_tokens": valid}))
        else:
            gdn_gates(a, b, self.A_log, self.dt_bias, g=g, beta=beta)
            if valid is not None:
                keep = (torch.arange(num_tokens, device=mixed.device) < valid).to(torch.float32)[:, None]  # [T, 1]
                g.mul_(keep)
                beta.mul_(keep)
        state_out = torch.empty_like(state_in)  # [B, Hv, Dk, Dv]
        if batch.is_decode:
            gdn_recurrent_decode(query, key, value, g, beta, state_in, out=core, state_out=state_out)
        else:  # Triton on CUDA (two launches), the torch chunked form elsewhere
            prefill = eager_op("gdn_chunked_prefill", query)
            prefill(query, key, value, g, beta, batch.cu_seqlens_q, state_in, out=core, final_state=state_out)
        caches.recurrent_state[self.layer_index][batch.state_slots] = state_out

    def _prefill_in_pools(self, mixed, a, b, batch: ForwardBatch, caches: ModelCaches, conv_out, g, beta, core, valid) -> None:
        """A prefill on the Triton kernels with both states read and written in place in the pools at the batch's slots
        (fresh sequences read zeros inside the kernels) and the padding of a graph prefill handled by `valid_tokens`
        in the conv and gates launches: none of the composed path's gather, mask and scatter launches."""
        padding = {} if valid is None else {"valid_tokens": valid}
        slots = {"state_slots": batch.state_slots, "has_initial_state": batch.has_initial_state}
        conv_pool, state_pool = caches.conv_state[self.layer_index], caches.recurrent_state[self.layer_index]
        eager_op("causal_conv1d", mixed)(mixed, self.conv_weight, batch.cu_seqlens_q, conv_pool, out=conv_out, final_state=conv_pool, **slots, **padding)
        query, key, value = self._heads(conv_out)
        eager_op("gdn_gates", a)(a, b, self.A_log, self.dt_bias, g=g, beta=beta, **padding)
        eager_op("gdn_chunked_prefill", query)(query, key, value, g, beta, batch.cu_seqlens_q, state_pool, out=core, final_state=state_pool, **slots)

    def _heads(self, conv_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """query, key [T, Hk, Dk] and value [T, Hv, Dv]: views of the conv output's column ranges."""
        num_tokens, key_dim = conv_out.shape[0], self.num_k_heads * self.k_head_dim
        query = conv_out[:, :key_dim].reshape(num_tokens, self.num_k_heads, self.k_head_dim)
        key = conv_out[:, key_dim : 2 * key_dim].reshape(num_tokens, self.num_k_heads, self.k_head_dim)
        value = conv_out[:, 2 * key_dim :].reshape(num_tokens, self.num_v_heads, self.v_head_dim)
        return query, key, value
