"""Dense GEMV for decode-sized batches (`ops.dense_linear` signature), Triton.

Small dense linears at batch 1 (a Gated DeltaNet layer's stacked `in_proj_b` / `in_proj_a`: 64 x 2048 in
bf16, 256 KB) take cuBLAS about 5 us in a CUDA graph, mostly a GEMM kernel's fixed cost. Here one program
owns BLOCK_N output rows of every token (up to `MAX_TOKENS`), reads its whole row slice in one step of
BLOCK_K columns (K = 2048: one step), sums in float32 and writes x's dtype. Larger batches run the torch op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_engine.kernels import pdl
from reference_engine.kernels.launch import (
    cdiv,
    finish,
    next_power_of_2,
    require_launchable,
    staging_buffer,
)
from reference_engine.ops.dense_linear import check_dense_linear
from reference_engine.ops.dense_linear import dense_linear as torch_dense_linear

MAX_TOKENS = 4
BLOCK_N = 2
MAX_BLOCK_K = 2048


@triton.jit
def _dense_gemv_kernel(x_ptr, w_ptr, out_ptr, N, K: tl.constexpr, stride_xm, stride_om, TOKENS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PDL: tl.constexpr = 0):
    pdl.pdl_wait(PDL)  # a kernel this small releases the next one only by ending
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = tl.arange(0, BLOCK_K)
    for token in tl.static_range(TOKENS):
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ok = (k0 + cols) < K
            w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + (k0 + cols)[None, :], mask=row_ok[:, None] & ok[None, :], other=0.0)
            xv = tl.load(x_ptr + token * stride_xm + k0 + cols, mask=ok, other=0.0)
            acc += w.to(tl.float32) * xv.to(tl.float32)[None, :]
        tl.store(out_ptr + token * stride_om + rows, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=row_ok)


def dense_linear(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`out = x @ weight^T`; Triton up to MAX_TOKENS rows of x (contiguous rows, contiguous weight), torch above."""
    check_dense_linear(x, weight, out)
    require_launchable(x, weight, out)
    tokens, k = x.shape
    if tokens == 0:
        return out
    if tokens > MAX_TOKENS or x.stride(1) != 1 or not weight.is_contiguous() or out.stride(1) != 1:
        return torch_dense_linear(x, weight, out)
    buffer = staging_buffer(out)  # float32 under the interpreter (it truncates to bf16)
    _dense_gemv_kernel[(cdiv(weight.shape[0], BLOCK_N),)](
        x, weight, buffer, weight.shape[0], k, x.stride(0), buffer.stride(0),
        TOKENS=tokens, BLOCK_N=BLOCK_N, BLOCK_K=min(MAX_BLOCK_K, next_power_of_2(k)), **pdl.launch_args(),
    )
    finish(buffer, out)
    return out
