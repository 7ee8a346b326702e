"""Routed experts of one MoE layer: fused dense weights, or one NVFP4 linear triple per expert.

Dense: `gate_up_proj [E, 2I, H]` (rows 0:I gate, I:2I up) and `down_proj [E, H, I]`, run by the
`routed_experts` op. NVFP4: per expert `gate`, `up`, `down` Linears (as quantised checkpoints store
them, each with its own tensor scale). The touched experts are dequantised to a compact dense stack
and handed to the same op with remapped ids: correct everywhere, not the fast path. On CUDA tensors
the stacked NVFP4 experts (below) run the grouped tensor-core kernels of `kernels/nvfp4_gemm.py` instead
(eager prefill; the torch path remains the CPU path and the fallback without Triton).
Per-expert NVFP4 weights are stacked once on an expert dimension (`stacked`; the per-expert Linears
become views of the stack, so nothing is held twice). Given `ops` (an ops.backend.OpSet: the CUDA-graph
decode path) its capturable routed-experts ops run instead: no host sync, shapes fixed by the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.model.eager_ops import triton_allowed
from reference_engine.model.linear import Linear
from reference_engine.ops import static_moe
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
    stacked: static_moe.StackedNvfp4Experts | None = None  # per-expert NVFP4 weights on one expert dimension

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
        linears = (*self.gate, *self.up, *self.down)
        if self.stacked is None and all(linear.is_nvfp4 and not linear.activation_nvfp4 for linear in linears):
            self._stack_nvfp4()

    def _stack_nvfp4(self) -> None:
        """Stack the per-expert NVFP4 tensors and rebind the Linears as views of the stack (no second copy)."""
        stacked = static_moe.StackedNvfp4Experts(
            gate_up_packed=torch.stack([torch.cat([g.weight_packed, u.weight_packed]) for g, u in zip(self.gate, self.up)]),  # [E, 2I, H/2]
            gate_up_scale=torch.stack([torch.cat([g.weight_scale, u.weight_scale]) for g, u in zip(self.gate, self.up)]),  # [E, 2I, H/16]
            gate_up_scale_2=torch.stack([torch.stack([g.weight_scale_2, u.weight_scale_2]).float() for g, u in zip(self.gate, self.up)]),  # [E, 2]
            down_packed=torch.stack([d.weight_packed for d in self.down]),  # [E, H, I/2]
            down_scale=torch.stack([d.weight_scale for d in self.down]),  # [E, H, I/16]
            down_scale_2=torch.stack([d.weight_scale_2.float() for d in self.down]),  # [E]
        )
        I, H = self.intermediate_size, self.hidden_size

        def view(e: int, rows: slice, packed, scale, scale_2) -> Linear:
            return Linear(rows.stop - rows.start, packed.shape[2] * 2, weight_packed=packed[e, rows], weight_scale=scale[e, rows], weight_scale_2=scale_2)

        gate = tuple(view(e, slice(0, I), stacked.gate_up_packed, stacked.gate_up_scale, stacked.gate_up_scale_2[e, 0]) for e in range(self.num_experts))
        up = tuple(view(e, slice(I, 2 * I), stacked.gate_up_packed, stacked.gate_up_scale, stacked.gate_up_scale_2[e, 1]) for e in range(self.num_experts))
        down = tuple(view(e, slice(0, H), stacked.down_packed, stacked.down_scale, stacked.down_scale_2[e]) for e in range(self.num_experts))
        for name, value in (("stacked", stacked), ("gate", gate), ("up", up), ("down", down)):
            object.__setattr__(self, name, value)

    @property
    def is_fused_dense(self) -> bool:
        return self.gate_up_proj is not None

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, out: torch.Tensor, ops=None,
                 shared: tuple[torch.Tensor, torch.Tensor] | None = None, x_steps: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """x [T, H], topk_weights [T, k] float32, topk_ids [T, k] int32 -> out [T, H]; `ops`: the capturable ops.

        `shared` (eager path only): (s [T, H], logit [T, 1]), the shared expert's output and gate logit; out becomes
        routed + s * sigmoid(logit). The GPU prefill kernels add it inside their last launch; elsewhere it is added
        after the routed sum (s is overwritten). `x_steps`: x in `permute_steps` order for the GPU prefill's Gluon
        gate/up launch (`prefill_takes_steps`), or None; the other paths ignore it."""
        if shared is not None and ops is None and self.stacked is not None and x.is_cuda and triton_allowed(x):
            nvfp4_moe_prefill = _gpu_prefill()
            if nvfp4_moe_prefill is not None:
                return nvfp4_moe_prefill(x, topk_weights, topk_ids, self.stacked, out=out, check_ids=False, shared=shared, x_steps=x_steps)
        self._routed(x, topk_weights, topk_ids, out, ops)
        if shared is not None:
            s, logit = shared
            out.add_(s.mul_(torch.sigmoid(logit)))
        return out

    def _routed(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, out: torch.Tensor, ops) -> torch.Tensor:
        if ops is not None and self.is_fused_dense:
            ops.routed_experts(x, topk_weights, topk_ids, self.gate_up_proj, self.down_proj, out=out)
            return out
        if ops is not None and self.stacked is not None:
            ops.nvfp4_routed_experts(x, topk_weights, topk_ids, self.stacked, out=out)
            return out
        if self.is_fused_dense:
            return routed_experts(x, topk_weights, topk_ids, self.gate_up_proj, self.down_proj, out=out)
        if self.stacked is not None and x.is_cuda and triton_allowed(x):  # eager prefill on the GPU: grouped tensor-core GEMMs
            nvfp4_moe_prefill = _gpu_prefill()
            if nvfp4_moe_prefill is not None:
                return nvfp4_moe_prefill(x, topk_weights, topk_ids, self.stacked, out=out, check_ids=False)  # ids from the router: in range
        touched = torch.unique(topk_ids.long())  # [E'] sorted
        remap = torch.full((self.num_experts,), -1, dtype=torch.int32, device=x.device)  # [E]
        remap[touched] = torch.arange(touched.numel(), dtype=torch.int32, device=x.device)
        gate_up, down = [], []
        for expert in touched.tolist():
            gate_up.append(torch.cat([self.gate[expert].dense_weight(x.dtype), self.up[expert].dense_weight(x.dtype)], dim=0))
            down.append(self.down[expert].dense_weight(x.dtype))
        compact_ids = remap[topk_ids.long()]  # [T, k] int32
        return routed_experts(x, topk_weights, compact_ids, torch.stack(gate_up), torch.stack(down), out=out)

    def prefill_takes_steps(self, x: torch.Tensor, top_k: int) -> bool:
        """Whether the GPU prefill of x (stacked NVFP4 experts, Triton allowed) reads x in `permute_steps` order
        (`kernels.nvfp4_gemm.moe_prefill_takes_steps`: the Gluon gate/up launch)."""
        if self.stacked is None or not (x.is_cuda and triton_allowed(x)):
            return False
        try:
            from reference_engine.kernels.nvfp4_gemm import moe_prefill_takes_steps
        except ImportError:
            return False
        return moe_prefill_takes_steps(x, top_k, self.stacked)

    def nbytes(self) -> int:
        if self.is_fused_dense:
            return sum(t.numel() * t.element_size() for t in (self.gate_up_proj, self.down_proj))
        if self.stacked is not None:
            held = sum(t.numel() * t.element_size() for t in static_moe.expert_tensors(self.stacked))
            return held + (self.stacked.tiled.nbytes() if self.stacked.tiled is not None else 0)
        return sum(linear.nbytes() for linear in (*self.gate, *self.up, *self.down))


def _gpu_prefill():
    """`kernels.nvfp4_gemm.nvfp4_moe_prefill`, or None without Triton (the per-expert torch path then)."""
    try:
        from reference_engine.kernels.nvfp4_gemm import nvfp4_moe_prefill
    except ImportError:
        return None
    return nvfp4_moe_prefill
