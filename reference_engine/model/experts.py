"""Routed experts of one MoE layer: fused dense weights, or one NVFP4 linear triple per expert.

Dense: `gate_up_proj [E, 2I, H]` (rows 0:I gate, I:2I up) and `down_proj [E, H, I]`, run by the
`routed_experts` op. NVFP4: per expert `gate`, `up`, `down` Linears (as quantised checkpoints store
them, each with its own tensor scale). The touched experts are dequantised to a compact dense stack
and handed to the same op with remapped ids: correct everywhere, not the fast path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.model.linear import Linear
from reference_engine.ops.moe import routed_experts


@dataclass(frozen=True)
class RoutedExperts:
    num_experts: int
    hidden_size: int
    intermediate_size: int
    gate_up_proj: torch.Tensor | None = None  # [E, 2I, H]
    down_proj: torch.Tensor | None = None  # [E, H, I]
    gate: tuple[Linear, ...] = ()  # E x [I, H]
    up: tuple[Linear, ...] = ()  # E x [I, H]
    down: tuple[Linear, ...] = ()  # E x [H, I]

    def __post_init__(self) -> None:
        E, H, I = self.num_experts, self.hidden_size, self.intermediate_size
        if self.gate_up_proj is not None:
            if self.down_proj is None or tuple(self.gate_up_proj.shape) != (E, 2 * I, H) or tuple(self.down_proj.shape) != (E, H, I):
                raise ValueError(
                    f"dense experts: expected gate_up_proj [{E}, {2 * I}, {H}] and down_proj [{E}, {H}, {I}], got "
                    f"{None if self.gate_up_proj is None else list(self.gate_up_proj.shape)} and "
                    f"{None if self.down_proj is None else list(self.down_proj.shape)}"
                )
            return
        if not (len(self.gate) == len(self.up) == len(self.down) == E):
            raise ValueError(f"per-expert weights: expected {E} gate/up/down linears, got {len(self.gate)}/{len(self.up)}/{len(self.down)}")

    @property
    def is_fused_dense(self) -> bool:
        return self.gate_up_proj is not None

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """x [T, H], topk_weights [T, k] float32, topk_ids [T, k] int32 -> out [T, H]."""
        if self.is_fused_dense:
            return routed_experts(x, topk_weights, topk_ids, self.gate_up_proj, self.down_proj, out=out)
        touched = torch.unique(topk_ids.long())  # [E'] sorted
        remap = torch.full((self.num_experts,), -1, dtype=torch.int32, device=x.device)  # [E]
        remap[touched] = torch.arange(touched.numel(), dtype=torch.int32, device=x.device)
        gate_up, down = [], []
        for expert in touched.tolist():
            gate_up.append(torch.cat([self.gate[expert].dense_weight(x.dtype), self.up[expert].dense_weight(x.dtype)], dim=0))
            down.append(self.down[expert].dense_weight(x.dtype))
        compact_ids = remap[topk_ids.long()]  # [T, k] int32
        return routed_experts(x, topk_weights, compact_ids, torch.stack(gate_up), torch.stack(down), out=out)

    def nbytes(self) -> int:
        if self.is_fused_dense:
            return sum(t.numel() * t.element_size() for t in (self.gate_up_proj, self.down_proj))
        return sum(linear.nbytes() for linear in (*self.gate, *self.up, *self.down))
