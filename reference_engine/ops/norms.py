"""RMSNorm variants of Qwen3.6-35B-A3B in plain torch (the CPU path and the fallback everywhere).

All three compute in float32 whatever the input dtype and round once into `out`:
- `rms_norm`: zero-centred weight, `x * rsqrt(mean(x^2) + eps) * (1 + w)` (layer norms, final
  norm, q_norm, k_norm).
- `gated_rms_norm`: plain weight, `w * norm(x) * silu(z)` (the Gated DeltaNet output norm).
- `fused_add_rms_norm`: `residual_out = x + residual` rounded to the model dtype (as transformers
  adds in the model dtype), then `out = rms_norm(residual_out)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.ops.registry import satisfies


def _check_same(name: str, tensor: torch.Tensor, like: torch.Tensor, like_name: str) -> None:
    if tuple(tensor.shape) != tuple(like.shape):
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(like.shape)} (the shape of {like_name})")
    if tensor.dtype != like.dtype:
        raise ValueError(f"{name} has dtype {tensor.dtype}, expected {like.dtype} (the dtype of {like_name})")
    if tensor.device != like.device:
        raise ValueError(f"{name} is on {tensor.device}, expected {like.device} (the device of {like_name})")


def _check_norm_inputs(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating tensor, got {x.dtype}")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must have shape ({x.shape[-1]},) to match the last dim of x, got {tuple(weight.shape)}")
    if not weight.is_floating_point():
        raise ValueError(f"weight must be a floating tensor, got {weight.dtype}")
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device}, x on {x.device}")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")


def _normalise(x32: torch.Tensor, eps: float) -> torch.Tensor:
    return x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)


@satisfies("norms-and-activations/rmsnorm", major=1)
@satisfies("attention/qk-norm", major=1)
def rms_norm(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """out = x * rsqrt(mean(x^2, -1) + eps) * (1 + weight), in float32, over the last dim of x [..., D] (also q_norm/k_norm on [T, H, D])."""
    _check_norm_inputs(x, weight, eps)
    _check_same("out", out, x, "x")
    out.copy_(_normalise(x.float(), eps) * (1.0 + weight.float()))
    return out


@satisfies("norms-and-activations/gated-rmsnorm", major=1)
def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """out = weight * norm(x) * silu(z), in float32; the weight is NOT zero-centred. x, z, out [..., D]."""
    _check_norm_inputs(x, weight, eps)
    _check_same("z", z, x, "x")
    _check_same("out", out, x, "x")
    out.copy_(weight.float() * _normalise(x.float(), eps) * torch.nn.functional.silu(z.float()))
    return out


@satisfies("norms-and-activations/fused-add-rmsnorm", major=1)
def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    residual_out: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    """residual_out = x + residual (rounded to x.dtype); out = rms_norm(residual_out). All [..., D]."""
    _check_norm_inputs(x, weight, eps)
    _check_same("residual", residual, x, "x")
    _check_same("out", out, x, "x")
    _check_same("residual_out", residual_out, x, "x")
    total = x.float() + residual.float()  # [..., D]
    residual_out.copy_(total)  # the one rounding to the model dtype, as transformers' `h = x + residual`
    out.copy_(_normalise(residual_out.float(), eps) * (1.0 + weight.float()))
    return out


@dataclass(frozen=True)
class AddNorm:
    """A fused add + RMSNorm handed to the op that consumes its output, so that op's first launch can do it
    (`moe_block_decode_add_norm`): for the op's un-normed input x, `fused_add_rms_norm(x, residual, weight, out=out,
    residual_out=residual_out, eps=eps)`, all [T, H] in x's dtype (weight [H], zero-centred)."""

    residual: torch.Tensor
    weight: torch.Tensor
    out: torch.Tensor
    residual_out: torch.Tensor
    eps: float

    def check(self, x: torch.Tensor) -> None:
        """The checks of `fused_add_rms_norm(x, ...)`, plus contiguous rows (the fused launch reads them as such)."""
        _check_norm_inputs(x, self.weight, self.eps)
        _check_same("residual", self.residual, x, "x")
        _check_same("out", self.out, x, "x")
        _check_same("residual_out", self.residual_out, x, "x")
        for name in ("residual", "weight", "out", "residual_out"):
            if not getattr(self, name).is_contiguous():
                raise ValueError(f"AddNorm.{name} must be contiguous")

    def apply(self, x: torch.Tensor, op=fused_add_rms_norm) -> torch.Tensor:
        """Run it with `op` (the torch op or a kernel of the same signature); returns `out`."""
        op(x, self.residual, self.weight, out=self.out, residual_out=self.residual_out, eps=self.eps)
        return self.out
