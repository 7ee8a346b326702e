"""The Qwen3.6-35B-A3B (qwen3_5_moe) text model: embedding, decoder layers, final norm, LM head.

`model.forward(batch, caches) -> logits [len(batch.logits_indices), vocab] float32`. The new
tokens' K/V go into the paged cache, the GDN states into their slots; only the rows named by
`logits_indices` go through the final norm and LM head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.cache.tensors import ModelCaches
from reference_engine.config import ModelConfig
from reference_engine.forward_batch import ForwardBatch
from reference_engine.model.decoder import DecoderLayer
from reference_engine.model.eager_ops import eager_op
from reference_engine.model.linear import Linear


@dataclass(frozen=True)
class Qwen35MoeModel:
    config: ModelConfig
    embed_tokens: torch.Tensor  # [V, H]
    layers: tuple[DecoderLayer, ...]
    norm: torch.Tensor  # [H], zero-centred
    lm_head: Linear  # [V, H]

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, caches: ModelCaches) -> torch.Tensor:
        batch.validate()
        if batch.num_tokens == 0:
            raise ValueError("ForwardBatch has no tokens")
        hidden = self.embed_tokens[batch.input_ids]  # [T, H]
        residual = None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, batch, caches)
        hidden = hidden[batch.logits_indices]  # [B, H]
        residual = residual[batch.logits_indices]  # [B, H]
        normed, summed = torch.empty_like(hidden), torch.empty_like(hidden)  # [B, H]
        ops = getattr(batch, "ops", None)  # static decode (CUDA graphs): the OpSet chosen by the runner
        add_norm = ops.fused_add_rms_norm if ops is not None else eager_op("fused_add_rms_norm", hidden)
        add_norm(hidden, residual, self.norm, out=normed, residual_out=summed, eps=self.config.rms_norm_eps)
        logits = self.lm_head(normed, ops).float()  # [B, V]
        prefetch = getattr(batch, "prefetch", None)  # static decode: the layers' L2 prefetch stream joins back here
        if prefetch is not None:
            prefetch.join()
        return logits

    __call__ = forward

    def nbytes(self) -> int:
        """Bytes of weights held (for memory planning and reports)."""
        total = self.embed_tokens.numel() * self.embed_tokens.element_size() + self.norm.numel() * self.norm.element_size()
        total += self.lm_head.nbytes()
        for layer in self.layers:
            for value in vars(layer.mixer).values():
                if isinstance(value, Linear):
                    total += value.nbytes()
                elif isinstance(value, torch.Tensor):
                    total += value.numel() * value.element_size()
            mlp = layer.mlp
            total += mlp.experts.nbytes()
            if mlp.shared_nvfp4 is not None and mlp.shared_nvfp4.tiled is not None:
                total += mlp.shared_nvfp4.tiled.nbytes()
            total += sum(linear.nbytes() for linear in (mlp.gate, mlp.shared_gate_proj, mlp.shared_up_proj, mlp.shared_down_proj, mlp.shared_expert_gate))
            total += 2 * layer.input_layernorm.numel() * layer.input_layernorm.element_size()
        return total
