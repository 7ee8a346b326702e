"""Dense linear into a caller's buffer: `out [T, N] = x [T, K] @ weight [N, K]^T` (the torch op of the OpSet's
`dense_linear`; `kernels/dense_gemv.py` is the Triton one for decode-sized T), and `aligned_linear`, a dense
linear whose output rows start at 16-byte multiples whatever N is."""

from __future__ import annotations

import torch


def check_dense_linear(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
    """ValueError naming the argument unless x [T, K], weight [N, K] and out [T, N] share one dtype and device."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x must be [T, K] and weight [N, K] with the same K, got {tuple(x.shape)} and {tuple(weight.shape)}")
    if tuple(out.shape) != (x.shape[0], weight.shape[0]):
        raise ValueError(f"out must be [T, N] = {(x.shape[0], weight.shape[0])}, got {tuple(out.shape)}")
    if not (x.dtype == weight.dtype == out.dtype):
        raise ValueError(f"x, weight and out must share a dtype, got {x.dtype}, {weight.dtype}, {out.dtype}")
    if not (x.device == weight.device == out.device):
        raise ValueError(f"x, weight and out must be on one device, got {x.device}, {weight.device}, {out.device}")


def dense_linear(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    check_dense_linear(x, weight, out)
    if out.is_contiguous():
        return torch.mm(x, weight.t(), out=out)
    out.copy_(torch.nn.functional.linear(x, weight))
    return out


ALIGN_ELEMENTS = 8  # output row pitch multiple of `aligned_linear` (16 bytes of bfloat16)


def aligned_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(x [T, K], weight [N, K])` as a [T, N] view of a [T, N rounded up to ALIGN_ELEMENTS] buffer on CUDA.

    The MoE router's logits (N = E + 1 = 257: the routed experts and the shared expert's gate) have an odd row pitch
    as a plain output, which limits cuBLAS to kernels for one-element alignment; a padded pitch does not. The same
    products; the padding columns are never written or read. Elsewhere (CPU, N already aligned) it is F.linear."""
    rows = weight.shape[0]
    pitch = -(-rows // ALIGN_ELEMENTS) * ALIGN_ELEMENTS
    if pitch == rows or not x.is_cuda or x.dim() != 2:
        return torch.nn.functional.linear(x, weight)
    out = torch.empty(x.shape[0], pitch, dtype=x.dtype, device=x.device)[:, :rows]
    return torch.mm(x, weight.t(), out=out)
