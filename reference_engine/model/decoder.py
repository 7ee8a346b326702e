"""One decoder layer: pre-norm mixer (Gated DeltaNet or gated attention) and pre-norm sparse MoE, both residual.

The residual stream is carried between layers so each norm fuses the preceding residual add:
`residual = x + residual; h = norm(residual)`. On the eager GPU prefill, when the MoE block's experts run the Gluon
gate/up launch (which reads its input with each 128-column step permuted), the Triton norm before the block also
writes h in that order (`steps_out`), so the experts need no copy launch of their own. On the batch-1 graph decode
with `gemv_pairs.X_PAIRS` on, the norm before the mixer also writes h as the GEMV's float16 pairs, which the mixer's
first NVFP4 GEMV reads instead of converting h in every program (`kernels/gemv_pairs.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.cache.tensors import ModelCaches
from reference_engine.forward_batch import ForwardBatch
from reference_engine.model import gemv_pairs_scope
from reference_engine.model.attention import GatedAttention
from reference_engine.model.eager_ops import eager_backend, eager_op
from reference_engine.model.gated_deltanet import GatedDeltaNet
from reference_engine.model.moe_block import SparseMoeBlock
from reference_engine.ops.norms import AddNorm


@dataclass(frozen=True)
class DecoderLayer:
    layer_index: int
    input_layernorm: torch.Tensor  # [H], zero-centred
    post_attention_layernorm: torch.Tensor  # [H], zero-centred
    mixer: GatedAttention | GatedDeltaNet
    mlp: SparseMoeBlock
    eps: float

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch, caches: ModelCaches
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] (the previous layer's output, not yet added), residual [T, H] or None on the first layer.

        Returns (this layer's MoE output, the residual stream before it); their sum is the layer's output.
        """
        ops = getattr(batch, "ops", None)  # static decode (CUDA graphs): the OpSet chosen by the runner
        prefetch = getattr(batch, "prefetch", None)  # static decode: warms the next layer's weights in L2 (kernels/l2_prefetch.py)
        if prefetch is not None:
            prefetch.at(self.layer_index, "mixer")
        norm = ops.rms_norm if ops is not None else eager_op("rms_norm", x)
        add_norm = ops.fused_add_rms_norm if ops is not None else eager_op("fused_add_rms_norm", x)
        normed = torch.empty_like(x)  # [T, H]
        pairs = gemv_pairs_scope.pairs_for(ops, normed, "rms_norm" if residual is None else "fused_add_rms_norm", "w4a16_linear_rows")
        pairs_kwargs = {} if pairs is None else {"pairs_out": pairs, "pairs_fp8": None}
        if residual is None:
            residual = x
            norm(x, self.input_layernorm, out=normed, eps=self.eps, **pairs_kwargs)
        else:
            new_residual = torch.empty_like(x)  # [T, H]
            add_norm(x, residual, self.input_layernorm, out=normed, residual_out=new_residual, eps=self.eps, **pairs_kwargs)
            residual = new_residual
        with gemv_pairs_scope.given(normed, pairs):  # the mixer's first NVFP4 GEMV (its stacked input projection) reads the pairs
            mixed = self.mixer(normed, batch, caches)  # [T, H]
        if prefetch is not None:
            prefetch.at(self.layer_index, "moe")
        post_normed, post_residual = torch.empty_like(x), torch.empty_like(x)  # [T, H]
        if self.mlp.takes_add_norm(ops):  # graph decode: the block's op does the norm too (its router launch may fold it in)
            add_norm = AddNorm(residual, self.post_attention_layernorm, post_normed, post_residual, self.eps)
            return self.mlp.decode_add_norm(mixed, add_norm, ops), post_residual
        # The eager prefill's experts may read the normed input in another column order: the norm writes that too.
        steps = self.mlp.steps_buffer(post_normed) if ops is None and eager_backend("fused_add_rms_norm", mixed) == "triton" else None
        add_norm(mixed, residual, self.post_attention_layernorm, out=post_normed, residual_out=post_residual, eps=self.eps,
                 **({} if steps is None else {"steps_out": steps}))  # fmt: skip
        return self.mlp(post_normed, ops=ops, x_steps=steps), post_residual
