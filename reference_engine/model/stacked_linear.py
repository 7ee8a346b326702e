"""Several linears of the same input stacked along their outputs, applied in one launch (decode and prefill).

Decode at batch 1 is launch-bound: `q_proj`, `k_proj`, `v_proj` (or a Gated DeltaNet layer's
`in_proj_qkv` and `in_proj_z`) read the same activation, so one GEMV over their concatenated rows
replaces three (or two). `stack_linears` concatenates the weights once, at build time, and returns the
stack together with the original linears rebound as row views of it (nothing is held twice).
NVFP4 parts keep their own tensor scale: the stack carries `row_scale_2 [N]` (each row's
`weight_scale_2`), which `w4a16_linear_rows` applies per row. Dense parts stack when they share a dtype.
Mixed stacks (dense with NVFP4, or W4A4 parts) are not formed: `stack_linears` returns None.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reference_engine.model.linear import Linear, eager_w4a16
from reference_engine.ops.dense_linear import dense_linear


@dataclass(frozen=True)
class StackedLinear:
    out_features: tuple[int, ...]  # each part's N, in order
    in_features: int
    weight: torch.Tensor | None = None  # dense [sum N, K]
    weight_packed: torch.Tensor | None = None  # [sum N, K/2] uint8
    weight_scale: torch.Tensor | None = None  # [sum N, K/16] float8_e4m3fn
    row_scale_2: torch.Tensor | None = None  # [sum N] float32

    @property
    def total_out_features(self) -> int:
        return sum(self.out_features)

    def __call__(self, x: torch.Tensor, ops=None) -> tuple[torch.Tensor, ...]:
        """x [T, K] -> one [T, N_i] view per part (views of one [T, sum N] output)."""
        if x.dim() != 2 or x.shape[-1] != self.in_features:
            raise ValueError(f"StackedLinear expects [T, {self.in_features}], got {list(x.shape)}")
        if self.weight is not None:
            out = torch.empty(x.shape[0], self.total_out_features, dtype=x.dtype, device=x.device)  # [T, sum N]
            (ops.dense_linear if ops is not None else dense_linear)(x, self.weight, out)
        else:
            out = torch.empty(x.shape[0], self.total_out_features, dtype=x.dtype, device=x.device)  # [T, sum N]
            (ops.w4a16_linear_rows if ops is not None else eager_w4a16(x, stacked=True))(x, self.weight_packed, self.weight_scale, self.row_scale_2, out=out)
        return tuple(out.split(self.out_features, dim=1))


def stack_linears(linears: Sequence[Linear]) -> tuple[StackedLinear, tuple[Linear, ...]] | None:
    """(the stack, the linears rebound as views of it), or None when the parts cannot share one launch."""
    if len(linears) < 2 or len({linear.in_features for linear in linears}) != 1:
        return None
    in_features = linears[0].in_features
    sizes = tuple(linear.out_features for linear in linears)
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    if all(not linear.is_nvfp4 for linear in linears):
        if len({linear.weight.dtype for linear in linears}) != 1 or len({linear.weight.device for linear in linears}) != 1:
            return None
        weight = torch.cat([linear.weight for linear in linears])  # [sum N, K]
        views = tuple(Linear.dense(weight[start:stop]) for start, stop in itertools.pairwise(bounds))
        return StackedLinear(sizes, in_features, weight=weight), views
    if not all(linear.is_nvfp4 and not linear.activation_nvfp4 for linear in linears):
        return None
    packed = torch.cat([linear.weight_packed for linear in linears])  # [sum N, K/2]
    scale = torch.cat([linear.weight_scale for linear in linears])  # [sum N, K/16]
    row_scale_2 = torch.cat(
        [linear.weight_scale_2.float().reshape(1).expand(linear.out_features) for linear in linears]
    ).contiguous()  # [sum N]
    views = tuple(
        Linear(
            linear.out_features,
            in_features,
            weight_packed=packed[start:stop],
            weight_scale=scale[start:stop],
            weight_scale_2=linear.weight_scale_2,
            input_scale=linear.input_scale,
        )
        for linear, start, stop in zip(linears, bounds, bounds[1:])
    )
    return StackedLinear(sizes, in_features, weight_packed=packed, weight_scale=scale, row_scale_2=row_scale_2), views
