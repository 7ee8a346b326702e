"""The sparse MoE block: softmax top-k router, routed experts, and the sigmoid-gated shared expert.

`out = sum_k w_k expert_{id_k}(x) + sigmoid(x @ shared_expert_gate^T) * shared_expert(x)`.

Fused decode form (built once in `__post_init__`, used when `ops` is given, i.e. on the static /
CUDA-graph decode path): when the routed experts are stacked NVFP4 (`experts.stacked`), the shared
expert is NVFP4 W4A16 with the routed experts' intermediate size, and the router and
`shared_expert_gate` are dense in one dtype, the block keeps
- `router_weight [E+1, H]` = cat(gate.weight, shared_expert_gate.weight), followed in its storage by zero rows
  up to a multiple of 8 (`ops.dense_linear.aligned_linear` runs the logits GEMM over them: cuBLAS is slow at
  N = 257); `gate` and `shared_expert_gate` are rebound as views of it (nothing held twice);
- `shared_nvfp4` (`SharedNvfp4Expert`): the shared expert's gate and up concatenated, down as is;
  the three shared Linears are rebound as views of it;
and `ops.moe_block_decode` computes the whole block (router, top-k, routed and shared experts, the
weighted sum) in one op. The eager path (prefill) of a fused block also uses the fused form, with fewer,
larger GEMMs than the composed path: the router logits and the shared gate's logit in one GEMM over
`router_weight` (`aligned_linear`), and the shared expert's gate and up projections
in one (`shared_gate_up`, a `StackedLinear` over the shared expert's concatenated rows). Any other
combination keeps the composed path below.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from reference_engine.model.eager_ops import eager_op
from reference_engine.model.experts import RoutedExperts
from reference_engine.model.linear import Linear
from reference_engine.model.stacked_linear import StackedLinear
from reference_engine.ops.dense_linear import ALIGN_ELEMENTS, aligned_linear
from reference_engine.ops.moe import shared_expert
from reference_engine.ops.norms import AddNorm
from reference_engine.ops.static_moe import SharedNvfp4Expert


@dataclass(frozen=True)
class SparseMoeBlock:
    gate: Linear  # router [E, H]
    experts: RoutedExperts
    shared_gate_proj: Linear  # [Is, H]
    shared_up_proj: Linear  # [Is, H]
    shared_down_proj: Linear  # [H, Is]
    shared_expert_gate: Linear  # [1, H]
    top_k: int
    # The fused decode form, set by __post_init__ when the block is fusable (plain attributes, not dataclass
    # fields: `dataclasses.replace` builds a new block whose __post_init__ fuses it again).
    router_weight = None  # torch.Tensor [E+1, H] | None
    shared_nvfp4 = None  # SharedNvfp4Expert | None
    shared_gate_up = None  # StackedLinear over shared_nvfp4's gate and up rows | None

    def __post_init__(self) -> None:
        if self._fusable():
            self._build_fused_form()

    def _fusable(self) -> bool:
        """True when `ops.moe_block_decode` can run this block (see the module docstring)."""
        shared = (self.shared_gate_proj, self.shared_up_proj, self.shared_down_proj)
        router = (self.gate, self.shared_expert_gate)
        return (
            self.experts.stacked is not None
            and all(linear.is_nvfp4 and not linear.activation_nvfp4 for linear in shared)
            and self.shared_gate_proj.out_features == self.shared_up_proj.out_features == self.shared_down_proj.in_features == self.experts.intermediate_size
            and all(linear.weight is not None for linear in router)
            and self.gate.weight.dtype == self.shared_expert_gate.weight.dtype
            and self.gate.weight.device == self.shared_expert_gate.weight.device
        )

    def _build_fused_form(self) -> None:
        """Concatenate router + shared gate rows and the shared gate + up weights once; rebind the Linears as views."""
        num_experts = self.gate.out_features
        rows = num_experts + 1
        padded = torch.zeros(-(-rows // ALIGN_ELEMENTS) * ALIGN_ELEMENTS, self.gate.in_features, dtype=self.gate.weight.dtype, device=self.gate.weight.device)
        padded[:num_experts] = self.gate.weight
        padded[num_experts:rows] = self.shared_expert_gate.weight
        router_weight = padded[:rows]  # [E+1, H], contiguous; zero rows after it up to a multiple of 8 (`aligned_linear`)
        gate, up, down = self.shared_gate_proj, self.shared_up_proj, self.shared_down_proj
        shared = SharedNvfp4Expert.concatenate(
            (gate.weight_packed, gate.weight_scale, gate.weight_scale_2),
            (up.weight_packed, up.weight_scale, up.weight_scale_2),
            (down.weight_packed, down.weight_scale, down.weight_scale_2),
        )
        intermediate = shared.intermediate_size

        def view(source: Linear, rows: slice, packed, scale, scale_2) -> Linear:
            return Linear(source.out_features, source.in_features, weight_packed=packed[rows], weight_scale=scale[rows], weight_scale_2=scale_2, input_scale=source.input_scale)

        row_scale_2 = torch.cat([shared.gate_up_scale_2[0].reshape(1).expand(intermediate), shared.gate_up_scale_2[1].reshape(1).expand(intermediate)])
        gate_up = StackedLinear((intermediate, intermediate), gate.in_features, weight_packed=shared.gate_up_packed, weight_scale=shared.gate_up_scale,
                                row_scale_2=row_scale_2.float().contiguous())  # fmt: skip
        rebound = {
            "router_weight": router_weight,
            "shared_nvfp4": shared,
            "shared_gate_up": gate_up,
            "gate": Linear.dense(router_weight[:num_experts]),
            "shared_expert_gate": Linear.dense(router_weight[num_experts:]),
            "shared_gate_proj": view(gate, slice(0, intermediate), shared.gate_up_packed, shared.gate_up_scale, shared.gate_up_scale_2[0]),
            "shared_up_proj": view(up, slice(intermediate, 2 * intermediate), shared.gate_up_packed, shared.gate_up_scale, shared.gate_up_scale_2[1]),
            "shared_down_proj": view(down, slice(None), shared.down_packed, shared.down_scale, shared.down_scale_2),
        }
        for name, value in rebound.items():
            object.__setattr__(self, name, value)

    def attach_tiled(self, tile) -> bool:
        """Give the routed stack and the shared expert tile-major copies, `tile(stacked, shared)` -> (routed copy,
        shared copy) (`kernels.moe_grouped_half.tile_experts`); the grouped decode kernels then read those. False
        (nothing done) where this block has no fused NVFP4 form."""
        if self.shared_nvfp4 is None or self.experts.stacked is None:
            return False
        routed, shared = tile(self.experts.stacked, self.shared_nvfp4)
        object.__setattr__(self.experts, "stacked", replace(self.experts.stacked, tiled=routed))
        object.__setattr__(self, "shared_nvfp4", replace(self.shared_nvfp4, tiled=shared))
        return True

    def steps_buffer(self, x: torch.Tensor) -> torch.Tensor | None:
        """An empty buffer like x for x in `permute_steps` order when this block's eager prefill of x would read x so
        (the fused form with the experts' Gluon gate/up launch on the GPU), else None."""
        if self.shared_nvfp4 is None:
            return None
        return torch.empty_like(x) if self.experts.prefill_takes_steps(x, self.top_k) else None

    def takes_add_norm(self, ops) -> bool:
        """True when `decode_add_norm` can run: CUDA-graph decode (`ops` given) of the fused form."""
        return ops is not None and self.shared_nvfp4 is not None

    def decode_add_norm(self, x: torch.Tensor, add_norm: AddNorm, ops) -> torch.Tensor:
        """`self(add_norm.apply(x), ops)` as one op (`ops.moe_block_decode_add_norm`), whose first launch may do the norm;
        x [T, H] is the mixer's un-normed output. Only where `takes_add_norm(ops)`."""
        out = torch.empty_like(x)  # [T, H]
        ops.moe_block_decode_add_norm(x, add_norm, self.router_weight, self.experts.stacked, self.shared_nvfp4, self.top_k, out=out)
        return out

    def __call__(self, x: torch.Tensor, ops=None, x_steps: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, H] -> [T, H]; `ops` (an ops.backend.OpSet, CUDA-graph decode only) supplies capturable ops.
        `x_steps`: x in `permute_steps` order (from `steps_buffer`, written by the norm before the block), or None."""
        num_tokens = x.shape[0]
        if ops is not None and self.shared_nvfp4 is not None:  # the whole block in one op
            out = torch.empty_like(x)  # [T, H]
            ops.moe_block_decode(x, self.router_weight, self.experts.stacked, self.shared_nvfp4, self.top_k, out=out)
            return out
        if ops is None and self.shared_nvfp4 is not None:
            return self._fused_eager(x, x_steps)
        router_logits = self.gate(x, ops)  # [T, E]
        topk_weights = torch.empty(num_tokens, self.top_k, dtype=torch.float32, device=x.device)  # [T, k]
        topk_ids = torch.empty(num_tokens, self.top_k, dtype=torch.int32, device=x.device)  # [T, k]
        (ops.router_topk if ops is not None else eager_op("router_topk", router_logits))(router_logits, topk_weights=topk_weights, topk_ids=topk_ids, top_k=self.top_k)
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

    def _fused_eager(self, x: torch.Tensor, x_steps: torch.Tensor | None = None) -> torch.Tensor:
        """The eager (prefill) path of a fused block: the same function as the composed path, in fewer GEMMs."""
        num_tokens, num_experts = x.shape[0], self.gate.out_features
        logits = aligned_linear(x, self.router_weight)  # [T, E+1]: routed logits, then the shared gate's
        topk_weights = torch.empty(num_tokens, self.top_k, dtype=torch.float32, device=x.device)  # [T, k]
        topk_ids = torch.empty(num_tokens, self.top_k, dtype=torch.int32, device=x.device)  # [T, k]
        router_logits = logits[:, :num_experts]
        eager_op("router_topk", router_logits)(router_logits, topk_weights=topk_weights, topk_ids=topk_ids, top_k=self.top_k)
        gate, up = self.shared_gate_up(x)  # [T, Is] each (views of one output)
        shared = self.shared_down_proj(torch.nn.functional.silu(gate) * up)  # [T, H]
        out = torch.empty_like(x)  # [T, H]: routed + shared * sigmoid(shared gate logit); on the GPU in the experts' last launch
        return self.experts(x, topk_weights, topk_ids, out=out, shared=(shared, logits[:, num_experts:]), x_steps=x_steps)
