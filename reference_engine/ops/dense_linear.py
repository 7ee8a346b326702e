"""Dense linear into a caller's buffer: `out [T, N] = x [T, K] @ weight [N, K]^T` (the torch op of the OpSet's
`dense_linear`; `kernels/dense_gemv.py` is the Triton one for decode-sized T), and `aligned_linear`, F.linear run
over N rounded up to a multiple of 8 rows where the weight's storage holds them (cuBLAS is slow at N = 257)."""

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


ALIGN_ELEMENTS = 8  # `aligned_linear` rounds N up to a multiple of this (16 bytes of bfloat16)


def aligned_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(x [T, K], weight [N, K])` [T, N], run as a GEMM over N rounded up to ALIGN_ELEMENTS rows when the
    weight's storage holds those rows right after it (a model pads such weights once: `SparseMoeBlock` pads the
    router's E + 1 = 257 rows to 264); the result is the first N columns of that output.

    Why: cuBLAS runs N = 257 (the routed experts' logits and the shared expert's gate logit) with kernels for
    one-element alignment, about 23 us at 1024 tokens on the H200 against a few us for an aligned N (run43). The
    padding rows' products land only in columns past N, which are never read, so their values do not matter.
    Without such storage (or with N aligned) this is F.linear."""
    rows, k = weight.shape
    pitch = -(-rows // ALIGN_ELEMENTS) * ALIGN_ELEMENTS
    if pitch == rows or x.dim() != 2 or not weight.is_contiguous():
        return torch.nn.functional.linear(x, weight)
    if (weight.storage_offset() + pitch * k) * weight.element_size() > weight.untyped_storage().nbytes():
        return torch.nn.functional.linear(x, weight)
    padded = weight.as_strided((pitch, k), (k, 1))  # the same storage, ALIGN-padded rows included
    return torch.nn.functional.linear(x, padded)[:, :rows]
