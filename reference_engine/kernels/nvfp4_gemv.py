"""W4A16 NVFP4 linear for decode-sized M (contract quantization/w4a16-linear), Triton.

`out [M, N] = x [M, K] @ W^T`, W = e2m1 * weight_scale * weight_scale_2 (ModelOpt multiplier
convention, element 2j in the low nibble). Per program: BLOCK_N output rows, BLOCK_M tokens and
a slice of K (split-K when the row blocks alone would not fill the GPU's multiprocessors). Each
step loads a [BLOCK_N, BLOCK_KB] tile of packed bytes (64 or 128 contiguous bytes per row, vector
loads; x is loaded contiguously and split into even and odd elements in registers), splits the two nibbles in registers and decodes E2M1 by bit placement, not by a
table: the 3 magnitude bits go to bits 11..9 of a float16 (exponent low bits and the top mantissa
bit), the sign to bit 15, which is the E2M1 value times 2^-14 (subnormal codes included); the
2^14 is folded into the tensor scale. The E4M3 block scale is loaded as float8 and converted to
float32. Products and sums run in float32; the result is written in x's dtype. Split-K partial
sums go to a float32 workspace reduced by a second tiny kernel (deterministic, no atomics).
For M > 64 (prefill) the wrappers call the tensor-core GEMM of `nvfp4_gemm.w4a16_gemm`, or from
`nvfp4_dequant.MIN_TOKENS` 16-bit tokens a bfloat16 copy of the weight and cuBLAS (`nvfp4_dequant.dequant_matmul`).
With `WORDS` 2 a single bfloat16 token runs `nvfp4_half_dot._w4a16_gemv_half_kernel` instead (products in
packed float16 pairs; its split-K is summed inside the kernel by the last program of a row block).
With `TILED_COPIES` (tuning key `gemv_tiled`) that kernel reads a tile-major copy of the weight made for its tuned tile
(`register_tiled_copy`; each K step's [BLOCK_N, BLOCK_B] tile contiguous, the same bits): run76 (H100) 0.81 to 0.95 of
the row-major time at the three per-layer shapes. The registry keeps copies per (weight, tile), so the decode-batch
GEMM's copies (`nvfp4_gemm.register_tiled_copies`) live beside them, each freed with its weight.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from reference_engine.kernels import gemv_pairs, pdl
from reference_engine.kernels.launch import (
    cdiv,
    finish,
    interpreting,
    next_power_of_2,
    require_launchable,
    staging_buffer,
    ticket_counters,
)
from reference_engine.ops.registry import satisfies
from reference_engine.ops.tiled_experts import tile_major
from reference_engine.quant.linear import _check_linear, _check_row_scales

MAX_GEMV_TOKENS = 64
E2M1_FROM_HALF_BITS = 16384.0  # 2^14: float16 with the E2M1 bits placed at 11..9 is value * 2^-14
_SM_COUNT_DEFAULT = 132
TUNED: dict[tuple[int, int, int], tuple[int, ...]] = {}  # (tokens, rows, k_bytes) -> measured config (kernels/tuning.py)
LOOP = 0  # the K loop: 0 plain, 1 unrolled (tl.static_range), n >= 2 pipelined n stages (tl.range); benchmarks/kernels/ compares
WORDS = 0  # weight reads: 0 bytes (nibbles split per byte), 1 int32 words (two codes decoded per shift-and-mask; `_e2m1_word_pair`),
# 2 (one bfloat16 token; otherwise 1): int64 scale blocks, products in packed float16 pairs (`nvfp4_half_dot`),
# 3: as 2 with the codes widened through `cvt.rn.f16x2.e4m3x2` (`nvfp4_half_dot`'s E4M3 decode, FP8 on)
GEMM_MIN_TOKENS = MAX_GEMV_TOKENS + 1  # from this many tokens the tensor-core GEMM runs instead of the GEMV (tuning may lower it)
TILED_COPIES = False  # the engine registers tile-major copies of the batch-1 GEMVs' weights (tuning key `gemv_tiled`)


@dataclass(frozen=True)
class _TiledCopy:
    """A weight's tile-major copy (`tiled_gemv_weight`), valid while `weight` is the very tensor it was made from."""

    weight: weakref.ref  # the codes tensor the copy was made from
    words: torch.Tensor
    scales: torch.Tensor
    block_n: int
    block_b: int


_COPIES: dict[tuple[int, int, int], _TiledCopy] = {}  # (id(weight_packed), block_n, block_b) -> its copy; identity checked through the weak reference


def register_tiled_copy(weight_packed: torch.Tensor, weight_scale: torch.Tensor, tile: tuple[int, int] | None = None) -> int:
    """Make and keep a tile-major copy of this weight for `tile` (rows, scale blocks per K step): by default the tuned
    tile of the batch-1 packed-float16 GEMV (`TUNED` entry at one token with WORDS 2 or 3); the decode-batch GEMM
    passes its own (`nvfp4_gemm.register_tiled_copies`). Returns the bytes held (0: no copy, for want of a tuned tile,
    of whole row tiles and K steps, or of a contiguous 8-byte aligned weight). The weights must not change afterwards:
    the copy is made once (the engine calls this at start)."""
    rows, k_bytes = weight_packed.shape
    if tile is None:
        config = TUNED.get((1, rows, k_bytes))
        if config is None or len(config) < 7 or config[6] not in (2, 3):
            return 0
        tile = (config[1], config[2] // 8)
    block_n, block_b = tile
    if not weight_packed.is_contiguous() or weight_packed.storage_offset() % 8 or rows % block_n or (k_bytes // 8) % block_b:
        return 0
    key = (id(weight_packed), block_n, block_b)
    if key in _COPIES and _COPIES[key].weight() is weight_packed:
        return 0  # already held
    words, scales = tiled_gemv_weight(weight_packed, weight_scale, block_n, block_b)
    _COPIES[key] = _TiledCopy(weakref.ref(weight_packed, lambda ref, key=key: _drop(ref, key)), words, scales, block_n, block_b)
    return words.numel() * words.element_size() + scales.numel() * scales.element_size()


def _drop(ref: weakref.ref, key: tuple[int, int, int]) -> None:
    """A registered weight died: free its copy (unless the key already holds another weight's copy)."""
    entry = _COPIES.get(key)
    if entry is not None and entry.weight is ref:
        del _COPIES[key]


def clear_tiled_copies() -> None:
    _COPIES.clear()


def tiled_copy(weight_packed: torch.Tensor, block_n: int, block_b: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The registered copy of this very tensor for this tile, else None (then the row-major weight is read)."""
    copy = _COPIES.get((id(weight_packed), block_n, block_b))
    if copy is None or copy.weight() is not weight_packed:
        return None
    return copy.words, copy.scales


def _tiled_copy(weight_packed: torch.Tensor, block_n: int, block_b: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The batch-1 GEMV's copy: `tiled_copy` while `TILED_COPIES` is on."""
    return tiled_copy(weight_packed, block_n, block_b) if TILED_COPIES else None


@triton.jit
def _decode_e2m1(codes):
    """uint8 codes 0..15 -> float32 E2M1 value times 2^-14."""
    c = codes.to(tl.int16)
    bits = ((c & 7) << 9) | ((c & 8) << 12)
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _gemv_step(x_ptr, packed_ptr, scale_ptr, scale_2, byte0, rows, row_ok, tokens, token_ok, K_BYTES, k_blocks, stride_xm,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr):
    """One K step: [BM, BN] partial products of BLOCK_KB packed bytes (2 * BLOCK_KB elements) per row."""
    byte_cols = tl.arange(0, BLOCK_KB)  # [KB] bytes = 2 * KB elements
    block_cols = tl.arange(0, BLOCK_KB // 8)  # [KB/8] scale blocks of 16 elements
    bytes_ok = (byte0 + byte_cols) < K_BYTES
    packed = tl.load(
        packed_ptr + rows[:, None].to(tl.int64) * K_BYTES + (byte0 + byte_cols)[None, :],
        mask=row_ok[:, None] & bytes_ok[None, :], other=0,
    )  # [BN, KB] uint8
    blocks_ok = (byte0 // 8 + block_cols) < k_blocks
    scale = tl.load(
        scale_ptr + rows[:, None].to(tl.int64) * k_blocks + (byte0 // 8 + block_cols)[None, :],
        mask=row_ok[:, None] & blocks_ok[None, :], other=0.0,
    ).to(tl.float32) * scale_2  # [BN, KB/8]
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (BLOCK_N, BLOCK_KB // 8, 8)), (BLOCK_N, BLOCK_KB))
    w_even = _decode_e2m1(packed & 0xF) * scale  # elements 2j   [BN, KB]
    w_odd = _decode_e2m1(packed >> 4) * scale  # elements 2j+1 [BN, KB]
    elements = 2 * byte0 + tl.arange(0, 2 * BLOCK_KB)  # contiguous x, split into even / odd in registers
    x_pairs = tl.load(
        x_ptr + tokens[:, None] * stride_xm + elements[None, :], mask=token_ok[:, None] & (elements < 2 * K_BYTES)[None, :], other=0.0,
    ).to(tl.float32)  # [BM, 2 KB]
    x_even, x_odd = tl.split(tl.reshape(x_pairs, (BLOCK_M, BLOCK_KB, 2)))  # [BM, KB] each
    return tl.sum(x_even[:, None, :] * w_even[None, :, :] + x_odd[:, None, :] * w_odd[None, :, :], axis=2)


@triton.jit
def _e2m1_word_pair(words, J: tl.constexpr, ASM: tl.constexpr):
    """int32 words of 8 E2M1 codes (code i in bits 4i..4i+3, the packed bytes read little-endian) ->
    float32 (code J, code J + 4), each the E2M1 value times 2^-14. One shift and mask place the magnitude
    bits of both codes at bits 9..11 and 25..27, another the signs at 15 and 31: the word is then two
    float16 values (codes J and J + 4 are 16 bits apart), split and widened. ASM: the same in PTX
    (two halves of one register, no integer extraction); the interpreter runs the integer form."""
    if ASM:
        if J == 0:
            lo, hi = tl.inline_asm_elementwise(
                "{ .reg .b32 m, s; .reg .b16 l, h; shl.b32 m, $2, 9; and.b32 m, m, 0x0E000E00; shl.b32 s, $2, 12; and.b32 s, s, 0x80008000;"
                " or.b32 m, m, s; mov.b32 {l, h}, m; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
                "=r,=r,r", [words], dtype=(tl.float32, tl.float32), is_pure=True, pack=1,
            )  # fmt: skip
        elif J == 1:
            lo, hi = tl.inline_asm_elementwise(
                "{ .reg .b32 m, s; .reg .b16 l, h; shl.b32 m, $2, 5; and.b32 m, m, 0x0E000E00; shl.b32 s, $2, 8; and.b32 s, s, 0x80008000;"
                " or.b32 m, m, s; mov.b32 {l, h}, m; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
                "=r,=r,r", [words], dtype=(tl.float32, tl.float32), is_pure=True, pack=1,
            )  # fmt: skip
        elif J == 2:
            lo, hi = tl.inline_asm_elementwise(
                "{ .reg .b32 m, s; .reg .b16 l, h; shl.b32 m, $2, 1; and.b32 m, m, 0x0E000E00; shl.b32 s, $2, 4; and.b32 s, s, 0x80008000;"
                " or.b32 m, m, s; mov.b32 {l, h}, m; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
                "=r,=r,r", [words], dtype=(tl.float32, tl.float32), is_pure=True, pack=1,
            )  # fmt: skip
        else:
            lo, hi = tl.inline_asm_elementwise(
                "{ .reg .b32 m, s; .reg .b16 l, h; shr.b32 m, $2, 3; and.b32 m, m, 0x0E000E00; and.b32 s, $2, 0x80008000;"
                " or.b32 m, m, s; mov.b32 {l, h}, m; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
                "=r,=r,r", [words], dtype=(tl.float32, tl.float32), is_pure=True, pack=1,
            )  # fmt: skip
    else:
        if J == 3:
            mag = (words >> 3) & 0x0E000E00
        else:
            mag = (words << (9 - 4 * J)) & 0x0E000E00
        signs = (words << (12 - 4 * J)) & -2147450880  # 0x80008000 as int32
        both = mag | signs
        lo = (both & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (both >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _gemv_words_step(x_ptr, words_ptr, scale_ptr, scale_2, word0, rows, row_ok, tokens, token_ok, K_WORDS, stride_xm,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, ASM: tl.constexpr):
    """One K step over BLOCK_W int32 words (8 elements each) per row: [BM, BN] partial products. The
    block scale (one per two words) multiplies each word's partial sum; x is read at the elements each
    decoded pair needs (strided loads from cache), so no tile changes layout."""
    wcols = word0 + tl.arange(0, BLOCK_W)  # [BW]
    words_ok = wcols < K_WORDS
    tile_ok = row_ok[:, None] & words_ok[None, :]
    words = tl.load(words_ptr + rows[:, None].to(tl.int64) * K_WORDS + wcols[None, :], mask=tile_ok, other=0)  # [BN, BW]
    scale = tl.load(scale_ptr + rows[:, None].to(tl.int64) * (K_WORDS // 2) + (wcols // 2)[None, :], mask=tile_ok, other=0.0).to(tl.float32) * scale_2
    x_rows = x_ptr + tokens[:, None] * stride_xm + wcols[None, :] * 8  # [BM, BW]: element 8w of each word
    x_ok = token_ok[:, None] & words_ok[None, :]
    part = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_W), dtype=tl.float32)
    for j in tl.static_range(4):
        lo, hi = _e2m1_word_pair(words, j, ASM)  # codes j and j + 4 of every word, [BN, BW]
        x_lo = tl.load(x_rows + j, mask=x_ok, other=0.0).to(tl.float32)
        x_hi = tl.load(x_rows + (j + 4), mask=x_ok, other=0.0).to(tl.float32)
        part += x_lo[:, None, :] * lo[None, :, :] + x_hi[:, None, :] * hi[None, :, :]
    return tl.sum(part * scale[None, :, :], axis=2)


@triton.jit
def _any_step(x_ptr, packed_ptr, scale_ptr, scale_2, byte0, rows, row_ok, tokens, token_ok, K_BYTES, k_blocks, stride_xm,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr, WORDS: tl.constexpr, ASM: tl.constexpr):
    if WORDS:  # packed_ptr is the int32 view of the codes
        part = _gemv_words_step(x_ptr, packed_ptr, scale_ptr, scale_2, byte0 // 4, rows, row_ok, tokens, token_ok, K_BYTES // 4, stride_xm,
                                BLOCK_M, BLOCK_N, BLOCK_KB // 4, ASM)  # fmt: skip
    else:
        part = _gemv_step(x_ptr, packed_ptr, scale_ptr, scale_2, byte0, rows, row_ok, tokens, token_ok, K_BYTES, k_blocks, stride_xm,
                          BLOCK_M, BLOCK_N, BLOCK_KB)  # fmt: skip
    return part


@triton.jit
def _w4a16_gemv_kernel(
    x_ptr, packed_ptr, scale_ptr, scale_2_ptr, out_ptr,
    M, N, K_BYTES,
    stride_xm, stride_om,
    STEPS_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr,
    ROW_SCALES: tl.constexpr, LOOP: tl.constexpr, WORDS: tl.constexpr = False, ASM: tl.constexpr = False,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] output features
    tokens = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    row_ok = rows < N
    token_ok = tokens < M
    if ROW_SCALES:  # stacked linears: one tensor scale per output row [N]
        scale_2 = tl.load(scale_2_ptr + rows, mask=row_ok, other=0.0)[:, None] * 16384.0  # [BN, 1]
    else:
        scale_2 = tl.load(scale_2_ptr) * 16384.0
    k_blocks = K_BYTES // 8
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if LOOP == 1:  # unrolled: every step's loads may be issued before the first product
        for step in tl.static_range(STEPS_PER_SPLIT):
            acc += _any_step(x_ptr, packed_ptr, scale_ptr, scale_2, (pid_k * STEPS_PER_SPLIT + step) * BLOCK_KB, rows, row_ok, tokens, token_ok,
                             K_BYTES, k_blocks, stride_xm, BLOCK_M, BLOCK_N, BLOCK_KB, WORDS, ASM)  # fmt: skip
    elif LOOP > 1:  # software-pipelined: LOOP iterations' loads in flight
        for step in tl.range(STEPS_PER_SPLIT, num_stages=LOOP):
            acc += _any_step(x_ptr, packed_ptr, scale_ptr, scale_2, (pid_k * STEPS_PER_SPLIT + step) * BLOCK_KB, rows, row_ok, tokens, token_ok,
                             K_BYTES, k_blocks, stride_xm, BLOCK_M, BLOCK_N, BLOCK_KB, WORDS, ASM)  # fmt: skip
    else:
        for step in range(STEPS_PER_SPLIT):
            acc += _any_step(x_ptr, packed_ptr, scale_ptr, scale_2, (pid_k * STEPS_PER_SPLIT + step) * BLOCK_KB, rows, row_ok, tokens, token_ok,
                             K_BYTES, k_blocks, stride_xm, BLOCK_M, BLOCK_N, BLOCK_KB, WORDS, ASM)  # fmt: skip
    out_mask = token_ok[:, None] & row_ok[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptr + tokens[:, None] * stride_om + rows[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:  # workspace [SPLIT_K, M, N] float32
        tl.store(out_ptr + (pid_k * M + tokens[:, None]) * N + rows[None, :], acc, mask=out_mask)


@triton.jit
def _split_k_reduce_kernel(workspace_ptr, out_ptr, M, N, stride_om, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in range(SPLIT_K):
        total += tl.load(workspace_ptr + (split * M + token) * N + cols, mask=ok, other=0.0)
    tl.store(out_ptr + token * stride_om + cols, total.to(out_ptr.dtype.element_ty), mask=ok)


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNT_DEFAULT


def plan(tokens: int, rows: int, k_bytes: int, sm_count: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_KB, SPLIT_K) for a [tokens, 2 * k_bytes] x [rows, 2 * k_bytes]^T product."""
    block_m = 1 if tokens == 1 else 2 if tokens == 2 else 4
    block_n = 16
    block_kb = min(128 if tokens <= 2 else 64, next_power_of_2(k_bytes))  # 16 bytes per thread at BLOCK_N 16
    programs = cdiv(rows, block_n) * cdiv(tokens, block_m)
    steps = cdiv(k_bytes, block_kb)
    split_k = 1
    while programs * split_k < 2 * sm_count and split_k * 2 <= steps and split_k < 16:
        split_k *= 2
    return block_m, block_n, block_kb, split_k


def launch_w4a16_gemv(
    x2d: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor, out2d: torch.Tensor,
    config: tuple[int, ...] | None = None,
) -> None:
    """x2d [M, K] (unit stride along K), out2d [M, N] (unit stride along N); weight_scale_2 one value or
    float32 [N] (one per row: stacked linears); no validation. `config` (BLOCK_M, BLOCK_N, BLOCK_KB, SPLIT_K,
    num_warps[, LOOP[, WORDS]]) overrides `plan` (the tuning sweep in benchmarks/kernels/ uses it)."""
    tokens, rows, k_bytes = x2d.shape[0], weight_packed.shape[0], weight_packed.shape[1]
    if config is None:
        config = TUNED.get((tokens, rows, k_bytes))
    if config is None:
        block_m, block_n, block_kb, split_k = plan(tokens, rows, k_bytes, _sm_count(x2d.device))
        num_warps, loop, words = 4, LOOP, WORDS
    else:
        block_m, block_n, block_kb, split_k, num_warps, *rest = config
        loop = int(rest[0]) if rest else LOOP
        words = int(rest[1]) if len(rest) > 1 else WORDS
    if words in (2, 3) and _half_path_ok(x2d, weight_packed, block_kb):
        x_pairs = gemv_pairs.lookup(x2d, words == 3)  # x as float16 pairs, when its producer wrote them (`gemv_pairs.given`)
        _launch_half(x2d, weight_packed, weight_scale, weight_scale_2, out2d, block_n, block_kb // 8, split_k, num_warps, loop, fp8=words == 3,
                     tiled=_tiled_copy(weight_packed, block_n, block_kb // 8), x_pairs=x_pairs, pair_loads=gemv_pairs.X_PAIRS or 1)  # fmt: skip
        return
    words = min(words, 1)
    codes = weight_packed
    if words and block_kb % 8 == 0 and k_bytes % 8 == 0 and weight_packed.storage_offset() % 4 == 0 and weight_packed.is_contiguous():
        codes = weight_packed.view(torch.int32)  # [N, K/8] words, read little-endian: code i of a word in bits 4i..4i+3
    else:
        words = 0
    steps = cdiv(k_bytes, block_kb)
    steps_per_split = cdiv(steps, split_k)
    row_scales = torch.as_tensor(weight_scale_2).numel() == rows and rows > 1
    scale_2 = torch.as_tensor(weight_scale_2, dtype=torch.float32, device=x2d.device).reshape(-1)
    grid = (cdiv(rows, block_n), cdiv(tokens, block_m), split_k)
    target = out2d if split_k == 1 else torch.empty((split_k, tokens, rows), dtype=torch.float32, device=x2d.device)
    _w4a16_gemv_kernel[grid](
        x2d, codes, weight_scale, scale_2, target,
        tokens, rows, k_bytes, x2d.stride(0), out2d.stride(0),
        STEPS_PER_SPLIT=steps_per_split, SPLIT_K=split_k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_KB=block_kb,
        ROW_SCALES=row_scales, LOOP=loop, WORDS=bool(words), ASM=bool(words) and not interpreting(), num_warps=num_warps,
    )
    if split_k > 1:
        block = 256
        _split_k_reduce_kernel[(cdiv(rows, block), tokens)](target, out2d, tokens, rows, out2d.stride(0), SPLIT_K=split_k, BLOCK=block)


def _half_path_ok(x2d: torch.Tensor, weight_packed: torch.Tensor, block_kb: int) -> bool:
    """The packed-float16 batch-1 kernel (`nvfp4_half_dot`) takes one bfloat16 token, whole scale blocks
    read as int64 (8-byte aligned rows) and x read as int32."""
    k_bytes = weight_packed.shape[1]
    return (
        x2d.shape[0] == 1 and x2d.dtype == torch.bfloat16 and x2d.is_contiguous() and x2d.data_ptr() % 4 == 0
        and block_kb % 8 == 0 and k_bytes % 8 == 0 and weight_packed.is_contiguous() and weight_packed.storage_offset() % 8 == 0
    )  # fmt: skip


def tiled_gemv_weight(weight_packed: torch.Tensor, weight_scale: torch.Tensor, block_n: int, block_b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K/2] codes and [N, K/16] scales -> their tile-major copy for the packed-float16 GEMV's (BLOCK_N, BLOCK_B)
    tile (int64 words and E4M3 scales, flat): each K step's [block_n rows, block_b blocks] stored contiguously."""
    words = weight_packed.contiguous().view(torch.int64)
    return tile_major(words[None], 1, block_n, block_b), tile_major(weight_scale.contiguous()[None], 1, block_n, block_b)


def _launch_half(x2d, weight_packed, weight_scale, weight_scale_2, out2d, block_n: int, block_b: int, split_k: int, num_warps: int, loop: int,
                 fp8: bool = False, tiled: tuple[torch.Tensor, torch.Tensor] | None = None, x_pairs: torch.Tensor | None = None,
                 pair_loads: int = 1) -> None:
    """The packed-float16 GEMV; `tiled`: (words, scales) from `tiled_gemv_weight` for this (block_n, block_b), read
    instead of the row-major codes and scales (the same bits out). `x_pairs`: x2d already as the block dot's float16
    pairs (`nvfp4_half_dot.x_half_pairs(x2d, fp8)`, the same fp8 setting), read instead of converting x in every
    program (the same bits out); `pair_loads` 1 or 2: how the kernel loads them (`nvfp4_half_dot._half_rows_dot`)."""
    from reference_engine.kernels.nvfp4_half_dot import _w4a16_gemv_half_kernel

    rows, k_blocks = weight_packed.shape[0], weight_packed.shape[1] // 8
    if tiled is not None and (rows % block_n or k_blocks % block_b or tiled[0].numel() != rows * k_blocks):
        raise ValueError(f"a tile-major GEMV copy needs whole tiles: N={rows} by {block_n} rows, {k_blocks} blocks by {block_b}, "
                         f"and {rows * k_blocks} words (got {tiled[0].numel()})")  # fmt: skip
    steps_per_split = cdiv(cdiv(k_blocks, block_b), split_k)
    row_scales = torch.as_tensor(weight_scale_2).numel() == rows and rows > 1
    scale_2 = torch.as_tensor(weight_scale_2, dtype=torch.float32, device=x2d.device).reshape(-1)
    row_blocks = cdiv(rows, block_n)
    workspace, counters = out2d, out2d  # unused without split-K
    if split_k > 1:
        workspace = torch.empty((split_k, rows), dtype=torch.float32, device=x2d.device)
        counters = ticket_counters(x2d.device, row_blocks)
    blocks, scales = (weight_packed.view(torch.int64), weight_scale) if tiled is None else tiled
    if pair_loads not in (1, 2):
        raise ValueError(f"pair_loads must be 1 or 2, got {pair_loads}")
    if x_pairs is not None and (x_pairs.dtype != torch.int32 or x_pairs.shape != (x2d.shape[0], x2d.shape[1] // 2) or not x_pairs.is_contiguous()):
        raise ValueError(f"x_pairs must be contiguous int32 [{x2d.shape[0]}, {x2d.shape[1] // 2}] (x_half_pairs), got {x_pairs.dtype} {tuple(x_pairs.shape)}")
    _w4a16_gemv_half_kernel[(row_blocks, split_k)](
        x2d.view(torch.int32) if x_pairs is None else x_pairs, blocks, scales, scale_2, out2d, workspace, counters, rows, k_blocks,
        STEPS_PER_SPLIT=steps_per_split, SPLIT_K=split_k, BLOCK_N=block_n, BLOCK_B=block_b, ROW_SCALES=row_scales, LOOP=loop,
        ASM=not interpreting(), FP8=fp8, TILED=tiled is not None, X_PAIRS=0 if x_pairs is None else pair_loads, num_warps=num_warps,
        **pdl.launch_args(),
    )



def _apply(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, scale_2: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Checked inputs -> the GEMV (up to 64 tokens) or the tensor-core GEMM (prefill); scale_2 one value or [N]."""
    x2d = x.reshape(-1, x.shape[-1])
    if x2d.shape[0] >= min(GEMM_MIN_TOKENS, MAX_GEMV_TOKENS + 1):  # prefill (and batches the tuning gives it): the tensor-core GEMM
        from reference_engine.kernels import nvfp4_dequant
        from reference_engine.kernels.nvfp4_gemm import w4a16_gemm

        out2d = out.view(-1, out.shape[-1]) if out.is_contiguous() else torch.empty((x2d.shape[0], out.shape[-1]), dtype=out.dtype, device=out.device)
        if nvfp4_dequant.applies(x2d):  # long prefills: weights decoded once into bfloat16, then cuBLAS
            nvfp4_dequant.dequant_matmul(x2d, weight_packed, weight_scale, scale_2, out2d)
        else:
            w4a16_gemm(x2d, weight_packed, weight_scale, scale_2, out2d)
        if not out.is_contiguous():
            out.copy_(out2d.view(out.shape))
        return out
    if x2d.shape[0] == 0:
        return out
    x2d = x2d.contiguous()
    buffer = staging_buffer(out)
    out2d = buffer.view(-1, buffer.shape[-1]) if buffer.is_contiguous() else torch.empty((x2d.shape[0], weight_packed.shape[0]), dtype=buffer.dtype, device=x.device)
    scale_2 = scale_2.contiguous() if isinstance(scale_2, torch.Tensor) else scale_2
    launch_w4a16_gemv(x2d, weight_packed.contiguous(), weight_scale.contiguous(), scale_2, out2d)
    if out2d.data_ptr() != buffer.data_ptr():
        buffer.copy_(out2d.view(buffer.shape))
    finish(buffer, out)
    return out


@satisfies("quantization/w4a16-linear", major=1, devices=("cuda",), backend="triton")
def w4a16_linear(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`out [..., N] = x [..., K] @ dequant(W)^T`; Triton GEMV for up to 64 tokens, the tensor-core GEMM above."""
    _check_linear(x, weight_packed, weight_scale, weight_scale_2, out)
    require_launchable(x, weight_packed, weight_scale, out)
    return _apply(x, weight_packed, weight_scale, weight_scale_2, out)


def w4a16_linear_rows(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, row_scale_2: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Stacked NVFP4 linears (`row_scale_2 [N]`, one tensor scale per output row) in one launch;
    the signature of `quant.linear.w4a16_linear_rows`."""
    _check_linear(x, weight_packed, weight_scale, torch.ones((), dtype=torch.float32), out)
    _check_row_scales(weight_packed, row_scale_2)
    require_launchable(x, weight_packed, weight_scale, row_scale_2, out)
    return _apply(x, weight_packed, weight_scale, row_scale_2, out)
