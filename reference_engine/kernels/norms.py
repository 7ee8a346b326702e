"""RMSNorm kernels (contracts norms-and-activations/rmsnorm, fused-add-rmsnorm, gated-rmsnorm), Triton.

One program per row of `[..., D]` (D up to a few thousand fits one block), or per `rows_per_program` rows when
the rows are short (`ROW_ELEMENTS`), float32 inside, rounded once into the output:
- `rms_norm`: x * rsqrt(mean(x^2) + eps) * (1 + w) (zero-centred weight);
- `fused_add_rms_norm`: residual_out = x + residual rounded to x's dtype, then rms_norm of that
  rounded value (as the model adds in its dtype), both written by the same program;
- `gated_rms_norm`: w * norm(x) * silu(z) (plain weight).
The bf16 rounding of the residual sum is done in the kernel by integer arithmetic on the float32
bits (round to nearest even), identical on the GPU and in the Triton interpreter (whose float32 ->
bfloat16 conversion truncates).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_engine.kernels import gemv_pairs, pdl
from reference_engine.kernels.launch import (
    finish,
    next_power_of_2,
    require_launchable,
    staging_buffer,
)
from reference_engine.ops.norms import _check_norm_inputs, _check_same
from reference_engine.ops.registry import satisfies

PLAIN, FUSED_ADD, GATED = 0, 1, 2


@triton.jit
def _round_to_bf16(values):
    """float32 -> the nearest bfloat16 value (ties to even), still float32 (finite inputs)."""
    bits = values.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return rounded.to(tl.float32, bitcast=True)


@triton.jit
def _step_column(n):
    """Column n (natural order) -> its column in `moe_prefill_gluon.permute_steps` order (128-element steps)."""
    r = n % 128
    return (n - r) + (((r >> 3) & 3) << 5) + (((r >> 1) & 1) << 4) + ((r & 1) << 3) + ((r >> 5) << 1) + ((r >> 2) & 1)


@triton.jit
def _pair_columns(words, FP8: tl.constexpr):
    """Word w of a row's float16 pairs -> the columns of its low and high half (`nvfp4_half_dot.x_half_pairs` order)."""
    base = (words >> 3) * 16
    t = words & 7
    if FP8:
        low = base + (t & 1) * 4 + ((t >> 1) & 1) + (t >> 2) * 8
        return low, low + 2
    low = base + (t & 3) + (t >> 2) * 8
    return low, low + 4


@triton.jit
def _pair_half(values, FP8: tl.constexpr):
    """Stored output values (in float32) rounded to bfloat16 (a no-op for a bfloat16 buffer; the interpreter's
    staging buffer is float32) -> float16 bits in the low 16 of an int32 (times 4 in float16 with FP8)."""
    half = _round_to_bf16(values).to(tl.float16)
    if FP8:
        half = half * 4
    return half.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _store_pairs(row_ptr, dest_ptr, words, word_ok, FP8: tl.constexpr):
    """The stored row's float16 pairs (`nvfp4_half_dot.x_half_pairs` order for FP8) -> int32 words at `dest_ptr`."""
    low, high = _pair_columns(words, FP8)
    low_values = tl.load(row_ptr + low, mask=word_ok, other=0.0).to(tl.float32)
    high_values = tl.load(row_ptr + high, mask=word_ok, other=0.0).to(tl.float32)
    tl.store(dest_ptr + words, _pair_half(low_values, FP8) | (_pair_half(high_values, FP8) << 16), mask=word_ok)


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, z_ptr, weight_ptr, out_ptr, residual_out_ptr, steps_ptr, pairs_ptr, n_rows, D, eps, z_heads, stride_zt,
                     MODE: tl.constexpr, BF16: tl.constexpr, BLOCK_D: tl.constexpr, STEPS: tl.constexpr, ROWS: tl.constexpr,
                     PAIRS: tl.constexpr = 0, PDL: tl.constexpr = 0):
    pdl.pdl_wait(PDL)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]  # [ROWS, 1]
    cols = tl.arange(0, BLOCK_D)[None, :]  # [1, BLOCK_D]
    ok = (cols < D) & (rows < n_rows)
    at = rows * D + cols
    x = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
    if MODE == 1:
        x = x + tl.load(residual_ptr + at, mask=ok, other=0.0).to(tl.float32)
        if BF16:
            x = _round_to_bf16(x)
        else:
            x = x.to(residual_out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(residual_out_ptr + at, x.to(residual_out_ptr.dtype.element_ty), mask=ok)
    weight = tl.load(weight_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    normed = x * tl.rsqrt(tl.sum(x * x, axis=1)[:, None] / D + eps)
    if MODE == 2:
        z_row = (rows // z_heads) * stride_zt + (rows % z_heads) * D  # z [T, heads, D] with any token stride
        z = tl.load(z_ptr + z_row + cols, mask=ok, other=0.0).to(tl.float32)
        y = weight * normed * (z * tl.sigmoid(z))
    else:
        y = normed * (1.0 + weight)
    pdl.pdl_release(PDL)
    tl.store(out_ptr + at, y.to(out_ptr.dtype.element_ty), mask=ok)
    if STEPS:  # the same values again, each 128-column step permuted (D a multiple of 128)
        tl.store(steps_ptr + rows * D + _step_column(cols), y.to(steps_ptr.dtype.element_ty), mask=ok)
    if PAIRS:  # the stored bfloat16 row again as the batch-1 GEMV's float16 pairs, D % 16 == 0
        tl.debug_barrier()  # this program's stores of `out` are visible to all its threads
        words = tl.arange(0, BLOCK_D // 2)[None, :]
        word_ok = (words < D // 2) & (rows < n_rows)
        if PAIRS == 3:  # both orders: [rows, 2, D / 2], plain then E4M3
            _store_pairs(out_ptr + rows * D, pairs_ptr + rows * D, words, word_ok, False)
            _store_pairs(out_ptr + rows * D, pairs_ptr + rows * D + D // 2, words, word_ok, True)
        else:
            _store_pairs(out_ptr + rows * D, pairs_ptr + rows * (D // 2), words, word_ok, PAIRS == 2)


# Elements per program: a program normalises max(1, ROW_ELEMENTS // BLOCK_D) rows (tuning key `norm_row_elements`).
# With 1 every row is its own program, as before; the Gated DeltaNet output norm has rows of 128 (32 per token), so a
# 1024-token prefill launches 32,768 programs of 128 elements each (`benchmarks/kernels/time_norm_rows.py`).
ROW_ELEMENTS = 1


def rows_per_program(width: int, row_elements: int | None = None) -> int:
    """Rows one program normalises for rows of `width` (a power of two, at most 64)."""
    block = next_power_of_2(width)
    rows = max(1, (ROW_ELEMENTS if row_elements is None else row_elements) // block)
    return min(64, next_power_of_2(rows))


def _launch(mode: int, x, weight, out, eps, residual=None, z=None, residual_out=None, steps_out=None, pairs_out=None, pairs_fp8=False) -> None:
    width = x.shape[-1]
    rows = x.numel() // width
    if rows == 0:
        return
    buffer = staging_buffer(out)
    target = buffer if buffer.is_contiguous() else torch.empty(buffer.shape, dtype=buffer.dtype, device=buffer.device)
    residual_target = None
    if residual_out is not None:
        residual_target = residual_out if residual_out.is_contiguous() else torch.empty_like(residual_out, memory_format=torch.contiguous_format)
    steps = None if steps_out is None else staging_buffer(steps_out)  # contiguous (checked by the caller)
    x_c = x.contiguous()
    z_c, z_heads, stride_zt = x_c, rows, 0  # rows of z at row * D (contiguous)
    if z is not None:
        z_c, z_heads, stride_zt = _token_strided(z)
    per_program = rows_per_program(width)
    _rms_norm_kernel[(triton.cdiv(rows, per_program),)](
        x_c, residual.contiguous() if residual is not None else x_c, z_c,
        weight.contiguous(), target, residual_target if residual_target is not None else target,
        steps if steps is not None else target, pairs_out if pairs_out is not None else target, rows, width, float(eps), z_heads, stride_zt,
        MODE=mode, BF16=x.dtype == torch.bfloat16, BLOCK_D=next_power_of_2(width), STEPS=int(steps_out is not None),
        ROWS=per_program, PAIRS=0 if pairs_out is None else 3 if pairs_fp8 is None else 1 + bool(pairs_fp8), **pdl.launch_args(),
    )
    if residual_target is not None and residual_target is not residual_out:
        residual_out.copy_(residual_target)
    if target is not buffer:
        buffer.copy_(target)
    finish(buffer, out)
    if steps is not None:
        finish(steps, steps_out)


def _token_strided(z: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(z, heads, token stride) for a gate z [T, heads, D] whose heads are contiguous within a token but whose
    tokens may sit at any stride (a view of a stacked projection's output: no copy); other layouts: a contiguous copy."""
    if z.dim() == 3 and z.stride(2) == 1 and z.stride(1) == z.shape[2]:
        return z, z.shape[1], z.stride(0)
    z = z.contiguous()
    rows = z.numel() // z.shape[-1]
    return z, max(rows, 1), 0


@satisfies("norms-and-activations/rmsnorm", major=1, devices=("cuda",), backend="triton")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float = 1e-6, pairs_out: torch.Tensor | None = None,
             pairs_fp8: bool | None = False) -> torch.Tensor:
    """out = x * rsqrt(mean(x^2, -1) + eps) * (1 + weight), float32 inside, over the last dim of x [..., D].

    `pairs_out` (kernel only, optional): contiguous int32 [..., D / 2] that also receives out as the batch-1 GEMV's
    float16 pairs (`nvfp4_half_dot.x_half_pairs(out, pairs_fp8)`, the same bits), so no GEMV program converts x; with
    `pairs_fp8` None, int32 [..., 2, D / 2] with both orders (plain, then E4M3: `gemv_pairs.pairs_buffer`)."""
    _check_norm_inputs(x, weight, eps)
    _check_same("out", out, x, "x")
    if pairs_out is not None:
        gemv_pairs.check_pairs_out(pairs_out, out, out.shape[-1], both=pairs_fp8 is None)
    require_launchable(x, weight, out, *(() if pairs_out is None else (pairs_out,)))
    _launch(PLAIN, x, weight, out, eps, pairs_out=pairs_out, pairs_fp8=pairs_fp8)
    return out


@satisfies("norms-and-activations/gated-rmsnorm", major=1, devices=("cuda",), backend="triton")
def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """out = weight * norm(x) * silu(z), float32 inside; the weight is NOT zero-centred. x, z, out [..., D]."""
    _check_norm_inputs(x, weight, eps)
    _check_same("z", z, x, "x")
    _check_same("out", out, x, "x")
    require_launchable(x, z, weight, out)
    _launch(GATED, x, weight, out, eps, z=z)
    return out


@satisfies("norms-and-activations/fused-add-rmsnorm", major=1, devices=("cuda",), backend="triton")
def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    residual_out: torch.Tensor,
    eps: float = 1e-6,
    steps_out: torch.Tensor | None = None,
    pairs_out: torch.Tensor | None = None,
    pairs_fp8: bool | None = False,
) -> torch.Tensor:
    """residual_out = x + residual (rounded to x.dtype); out = rms_norm(residual_out). All [..., D].

    `steps_out` (kernel only, optional): a contiguous [..., D] buffer (D a multiple of 128) that also receives out's
    values with each 128-column step in `moe_prefill_gluon.permute_steps` order, the operand order of the Gluon
    experts' gate/up launch (`nvfp4_gemm.nvfp4_moe_prefill(x_steps=)`), so the prefill needs no copy launch.
    `pairs_out`, `pairs_fp8` (kernel only, optional): out again as float16 pairs, as in `rms_norm`."""
    _check_norm_inputs(x, weight, eps)
    _check_same("residual", residual, x, "x")
    _check_same("out", out, x, "x")
    _check_same("residual_out", residual_out, x, "x")
    if steps_out is not None:
        _check_same("steps_out", steps_out, x, "x")
        if not steps_out.is_contiguous() or x.shape[-1] % 128:
            raise ValueError(f"steps_out must be contiguous with a last dim that is a multiple of 128, got shape {list(steps_out.shape)} "
                             f"(contiguous: {steps_out.is_contiguous()})")  # fmt: skip
    if pairs_out is not None:
        gemv_pairs.check_pairs_out(pairs_out, out, out.shape[-1], both=pairs_fp8 is None)
    extra = tuple(buffer for buffer in (steps_out, pairs_out) if buffer is not None)
    require_launchable(x, residual, weight, out, residual_out, *extra)
    _launch(FUSED_ADD, x, weight, out, eps, residual=residual, residual_out=residual_out, steps_out=steps_out, pairs_out=pairs_out,
            pairs_fp8=pairs_fp8)
    return out
