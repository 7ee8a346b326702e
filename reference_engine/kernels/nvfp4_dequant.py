"""NVFP4 weights dequantised to bfloat16 in one streaming Triton kernel (contract quantization/nvfp4-dequantize),
and the prefill linear built on it: dequantise into a scratch buffer, then one cuBLAS GEMM.

`_dequant_kernel`, grid (cdiv(N, BLOCK_N), cdiv(K/2, BLOCK_KB)): each program reads a [BLOCK_N, BLOCK_KB] tile of
packed codes and the matching E4M3 block scales, decodes both nibbles of every byte (element 2j in the low nibble),
multiplies by the block scale and the tensor scale (one float32 value, or one per row for stacked linears) in
float32 and writes the interleaved [BLOCK_N, 2 * BLOCK_KB] tile in the output dtype (rounded to nearest even).
Under the interpreter, which truncates float32 to bfloat16, it writes a float32 buffer that torch rounds.

`dequant_matmul` (the prefill linears from `MIN_TOKENS` tokens; the tuning file sets it): the tensor-core NVFP4 GEMM
of `nvfp4_gemm` decodes every weight tile again for every 64 or 128 tokens and runs at 187 to 377 TFLOP/s at 1024
tokens (run23), bound by the decode's instructions. Decoding each weight once per call (read N*K/2 code bytes and
N*K/16 scale bytes, write 2*N*K bytes) and handing cuBLAS a plain bfloat16 GEMM took the five prefill shapes from
356.5 to 257.5 us summed at 1024 tokens (run23). Numerics: e2m1 * block scale is exact in bfloat16; the tensor
scale folded in rounds each weight once more (relative error below 2^-9), and cuBLAS accumulates in float32 and
rounds the output once: 2.3e-3 to 2.6e-3 relative error against the float32 op, against 2e-5 to 8e-5 for the
GEMM (run23). Off in the module (None); the H200 tuning file sets 512 since run25, whose engine A/B with 4 gate
prompts passed the gate with it (KL 0.109, top-1 0.30 against the bound 0.25; run23-B's failure had been 13 rows
from 2 short prompts that never reached this path) and took TTFT from 7.46 to 6.71 times its floor (benchmarks/NOTES.md). With `CACHE` (the H200 file sets it since run29) each weight's copy is kept
between prefills: TTFT 44.2 -> 41.9 ms across two calls, 250 launches fewer, 2.8 GB of device memory at the real size.
"""

from __future__ import annotations

import weakref

import torch
import triton
import triton.language as tl

from reference_engine.kernels.launch import (
    cdiv,
    finish,
    require_launchable,
    staging_buffer,
)
from reference_engine.kernels.nvfp4_gemv import _decode_e2m1
from reference_engine.ops.registry import satisfies
from reference_engine.quant.nvfp4 import _check_quantized

BLOCK_N, BLOCK_KB, NUM_WARPS = 16, 128, 4  # 2 KiB of codes per program: 8 KiB of bfloat16 out
MIN_TOKENS: int | None = None  # prefill linears of at least this many bfloat16 tokens use `dequant_matmul` (None: never)


@triton.jit
def _dequant_kernel(packed_ptr, scale_ptr, scale_2_ptr, out_ptr, N, K_BYTES, ROW_SCALES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    byte_cols = tl.program_id(1) * BLOCK_KB + tl.arange(0, BLOCK_KB)
    row_ok = rows < N
    col_ok = byte_cols < K_BYTES
    mask = row_ok[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)
    packed = tl.load(packed_ptr + rows64[:, None] * K_BYTES + byte_cols[None, :], mask=mask, other=0).to(tl.int32)  # [BN, BKB]
    block = tl.load(scale_ptr + rows64[:, None] * (K_BYTES // 8) + (byte_cols // 8)[None, :], mask=mask, other=0.0).to(tl.float32)
    if ROW_SCALES:  # block scale times tensor scale, times 2^14: `_decode_e2m1` gives E2M1 * 2^-14
        block = block * (tl.load(scale_2_ptr + rows, mask=row_ok, other=0.0) * 16384.0)[:, None]
    else:
        block = block * (tl.load(scale_2_ptr) * 16384.0)
    low = _decode_e2m1(packed & 0xF) * block
    high = _decode_e2m1(packed >> 4) * block
    values = tl.reshape(tl.join(low, high), (BLOCK_N, 2 * BLOCK_KB))  # element 2j: low nibble, 2j + 1: high nibble
    cols = 2 * tl.program_id(1) * BLOCK_KB + tl.arange(0, 2 * BLOCK_KB)
    out_mask = row_ok[:, None] & (cols < 2 * K_BYTES)[None, :]
    tl.store(out_ptr + rows64[:, None] * (2 * K_BYTES) + cols[None, :], values.to(out_ptr.dtype.element_ty), mask=out_mask)


def launch_dequant(weight_packed: torch.Tensor, weight_scale: torch.Tensor, scale_2: torch.Tensor, out: torch.Tensor) -> None:
    """Checked, contiguous inputs; `scale_2` one float32 value or [N] (one per row); `out [N, K]` contiguous."""
    rows, k_bytes = weight_packed.shape
    row_scales = scale_2.numel() == rows and rows > 1
    buffer = staging_buffer(out)
    grid = (cdiv(rows, BLOCK_N), cdiv(k_bytes, BLOCK_KB))
    _dequant_kernel[grid](weight_packed, weight_scale, scale_2.reshape(-1), buffer, rows, k_bytes,
                          ROW_SCALES=row_scales, BLOCK_N=BLOCK_N, BLOCK_KB=BLOCK_KB, num_warps=NUM_WARPS)  # fmt: skip
    finish(buffer, out)


@satisfies("quantization/nvfp4-dequantize", major=1, devices=("cuda",), backend="triton")
def dequantize_nvfp4_into(weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor, out: torch.Tensor) -> None:
    """`out [N, K] = e2m1(codes) * weight_scale * weight_scale_2` in out's dtype; the signature of `quant.nvfp4.dequantize_nvfp4_into`."""
    _check_quantized(weight_packed, weight_scale, weight_scale_2)
    expected = (*weight_packed.shape[:-1], weight_packed.shape[-1] * 2)
    if weight_packed.dim() != 2 or tuple(out.shape) != expected:
        raise ValueError(f"out must have shape {expected} for weight_packed {tuple(weight_packed.shape)} (2-D), got {tuple(out.shape)}")
    if out.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"out must be float32, bfloat16 or float16, got {out.dtype}")
    scale_2 = torch.as_tensor(weight_scale_2, dtype=torch.float32, device=weight_packed.device).reshape(())
    require_launchable(weight_packed, weight_scale, scale_2, out)
    target = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype, device=out.device)
    launch_dequant(weight_packed.contiguous(), weight_scale.contiguous(), scale_2, target)
    if target is not out:
        out.copy_(target)


CACHE = False  # keep each weight's copy for the next prefill (the tuning file may set it; see `_cached_copy`)
CACHE_HEADROOM_BYTES = 1 << 30  # a copy is kept only while this much device memory stays free after it
_COPIES: dict[tuple[int, int, torch.dtype], tuple[weakref.ref, weakref.ref, object, torch.Tensor]] = {}


def _cached_copy(weight_packed: torch.Tensor, weight_scale: torch.Tensor, scale_2, dtype: torch.dtype) -> torch.Tensor | None:
    """The kept copy of this weight in `dtype`, made now if there is room; None when caching is off, during a CUDA
    graph capture with no copy yet (memory allocated there belongs to the graph), or when device memory is short.
    One copy per (codes, block scales, dtype), by identity: the model's weights never change in place after loading.
    The copy holds its tensor scale(s) folded in, so it serves only the `scale_2` object it was made with (held, so its
    id cannot be reused); another one replaces it. A copy is dropped with its packed tensor. At the real size the dense
    NVFP4 linears are about 1.4 G weights: 2.8 GB of bfloat16 copies."""
    if not CACHE:
        return None
    key = (id(weight_packed), id(weight_scale), dtype)
    entry = _COPIES.pop(key, None)
    if entry is not None:
        packed_ref, scale_ref, held_scale_2, copy = entry
        if packed_ref() is weight_packed and scale_ref() is weight_scale and held_scale_2 is scale_2:
            _COPIES[key] = entry
            return copy
        del copy, entry  # an id reused by a new tensor, or another scale_2: made again below
    device = weight_packed.device
    rows, cols = weight_packed.shape[0], 2 * weight_packed.shape[1]
    if device.type == "cuda":  # (on the CPU: the interpreter's tests)
        if torch.cuda.is_current_stream_capturing():
            return None
        if torch.cuda.mem_get_info(device)[0] < rows * cols * dtype.itemsize + CACHE_HEADROOM_BYTES:
            return None
    copy = torch.empty(rows, cols, dtype=dtype, device=device)
    _dequant_into(weight_packed, weight_scale, scale_2, copy)
    _COPIES[key] = (weakref.ref(weight_packed), weakref.ref(weight_scale), scale_2, copy)
    weakref.finalize(weight_packed, _COPIES.pop, key, None)
    return copy


def _dequant_into(weight_packed: torch.Tensor, weight_scale: torch.Tensor, scale_2, weight: torch.Tensor) -> None:
    scale_2 = torch.as_tensor(scale_2, dtype=torch.float32, device=weight.device)
    launch_dequant(weight_packed.contiguous(), weight_scale.contiguous(), scale_2.contiguous(), weight)


def dequant_matmul(x2d: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, scale_2, out2d: torch.Tensor) -> None:
    """`out2d [M, N] = x2d [M, K] @ dequant(W)^T` through a copy of W in x's dtype and torch.mm; inputs as
    `nvfp4_gemv._apply` passes them (one tensor scale or one per row; out2d contiguous). With `CACHE` the copy
    is made once per weight and kept (`_cached_copy`)."""
    weight = _cached_copy(weight_packed, weight_scale, scale_2, x2d.dtype)
    if weight is None:
        weight = torch.empty(weight_packed.shape[0], 2 * weight_packed.shape[1], dtype=x2d.dtype, device=x2d.device)
        _dequant_into(weight_packed, weight_scale, scale_2, weight)
    torch.mm(x2d, weight.t(), out=out2d)


def applies(x2d: torch.Tensor) -> bool:
    """Whether `nvfp4_gemv` sends this call to `dequant_matmul`: 16-bit activations, at least MIN_TOKENS rows."""
    return MIN_TOKENS is not None and x2d.shape[0] >= MIN_TOKENS and x2d.dtype in (torch.bfloat16, torch.float16)
