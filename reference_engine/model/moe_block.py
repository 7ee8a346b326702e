"""The sparse MoE block: softmax top-k router, routed experts, and the sigmoid-gated shared expert.

`out = sum_k w_k expert_{id_k}(x) + sigmoid(x @ shared_expert_gate^T) * shared_expert(x)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.model.experts import RoutedExperts
from reference_engine.model.linear import Linear
from reference_engine.ops.moe import router_topk, shared_expert


@dataclass(frozen=True)
class SparseMoeBlock:
    gate: Linear  # router [E, H]
    experts: RoutedExperts
    shared_gate_proj: Linear  # [Is, H]
    shared_up_proj: Linear  # [Is, H]
    shared_down_proj: Linear  # [H, Is]
    shared_expert_gate: Linear  # [1, H]
    top_k: int

    def __call__(self, x: torch.Tensor, ops=None) -> torch.Tensor:
        """x [T, H] -> [T, H]; `ops` (an ops.backend.OpSet, CUDA-graph decode only) supplies capturable ops."""
        num_tokens = x.shape[0]
        router_logits = self.gate(x, ops)  # [T, E]
        topk_weights = torch.empty(num_tokens, self.top_k, dtype=torch.float32, device=x.device)  # [T, k]
        topk_ids = torch.empty(num_tokens, self.top_k, dtype=torch.int32, device=x.device)  # [T, k]
        (ops.router_topk if ops is not None else router_topk)(router_logits, topk_weights=topk_weights, topk_ids=topk_ids, top_k=self.top_k)
        routed = torch.empty_like(x)  # [T, H]
        self.experts(x, topk_weights, topk_ids, out=routed, ops=ops)
        shared = torch.empty_like(x)  # [T, H]
        dense_shared = (self.shared_gate_proj, self.shared_up_proj, self.shared_down_proj, self.shared_expert_gate)
        if not any(linear.is_nvfp4 for linear in dense_shared):
            (ops.shared_expert if ops is not None else shared_expert)(
                x,
                self.shared_gate_proj.weight,
                self.shared_up_proj.weight,
                self.shared_down_proj.weight,
                self.shared_expert_gate.weight,
                out=shared,
            )
        else:  # quantised shared expert: the same SwiGLU composed from the quantised linears
            hidden = torch.nn.functional.silu(self.shared_gate_proj(x, ops)) * self.shared_up_proj(x, ops)  # [T, Is]
            shared.copy_(self.shared_down_proj(hidden, ops) * torch.sigmoid(self.shared_expert_gate(x, ops)))
        return routed.add_(shared)
