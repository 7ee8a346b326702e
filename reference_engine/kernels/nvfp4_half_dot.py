"""Batch-1 NVFP4 dot products in packed float16 pairs: the decode-bound inner loop with fewer instructions.

The word-read GEMV (`nvfp4_gemv`, WORDS 1) widens every decoded code to float32: one quarter-rate
conversion per weight, and one multiply-add per weight. Here the 16 codes of one scale block are
read as one int64 and, in one piece of PTX per block:
- decoded two at a time into a float16x2 register (codes j and j + 4 of each 32-bit word sit 16 bits
  apart, so one shift and mask place both magnitudes at bits 9..11, another both signs at 15 and 31:
  the E2M1 values times 2^-14, subnormal codes included);
- multiplied by 2^10 (`mul.rn.f16x2`, exact) so that products with ordinary activations stay in
  float16's normal range;
- multiplied into an x pair (x[j], x[j + 4] of the same word, float16x2) and accumulated with
  `fma.rn.f16x2`: 8 packed multiply-adds for the 16 products;
- the two halves added and widened once: one float32 partial sum per scale block, which the caller
  multiplies by the block scale times the tensor scale times 2^4.
The x pairs are built once per K step from x read as int32 (two bfloat16 each), converted with
`cvt.rn.f16x2.f32`, and shared by every row a thread holds.

Numerics: products and the 8-term sums run in float16 (11-bit significand, relative error about 2^-11
per operation), block sums and everything after in float32. Activations must fit float16 (|x| < 65504;
the 8-term sums overflow from |x| of about 2e4); the model's linears see normed activations far below
that. The interpreter runs the same decode as integers and the products in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_engine.kernels import pdl
from reference_engine.kernels.nvfp4_gemv import _e2m1_word_pair

HALF_RESTORE = 1024.0  # 2^10: decoded float16 codes are E2M1 * 2^-14; times this they are E2M1 * 2^-4
BLOCK_SUM_SCALE = 16.0  # 2^4: a block sum times this (and the block and tensor scales) is the dot product

_PAIR_DECODE = (  # (shift placing the magnitudes at 9..11 and 25..27, shift placing the signs at 15 and 31) for j = 0..3
    ("shl.b32 m, {w}, 9;", "shl.b32 s, {w}, 12;"),
    ("shl.b32 m, {w}, 5;", "shl.b32 s, {w}, 8;"),
    ("shl.b32 m, {w}, 1;", "shl.b32 s, {w}, 4;"),
    ("shr.b32 m, {w}, 3;", "mov.b32 s, {w};"),
)


def _block_dot_asm() -> str:
    """PTX: $1 the int64 block (16 codes), $2..$9 the x pairs (float16x2) of pairs 0..3 of word 0 and of
    word 1 -> $0 float32 sum of the 16 products (codes times 2^-4)."""
    lines = ["{ .reg .b32 w0, w1, m, s, p, c, acc; .reg .b16 l, h;", "mov.b64 {w0, w1}, $1;", "mov.b32 c, 0x64006400;"]
    operand = 2
    for word in ("w0", "w1"):
        for mag, sign in _PAIR_DECODE:
            lines += [mag.format(w=word), "and.b32 m, m, 0x0E000E00;", sign.format(w=word), "and.b32 s, s, 0x80008000;", "or.b32 p, m, s;", "mul.rn.f16x2 p, p, c;"]
            lines.append(f"mul.rn.f16x2 acc, p, ${operand};" if operand == 2 else f"fma.rn.f16x2 acc, p, ${operand}, acc;")
            operand += 1
    lines += ["mov.b32 {l, h}, acc;", "add.rn.f16 l, l, h;", "cvt.f32.f16 $0, l; }"]
    return " ".join(lines)


BLOCK_DOT_ASM = tl.constexpr(_block_dot_asm())

E4M3_FROM_E2M1 = 64.0  # 2^6: an E2M1 code's bits placed in an E4M3 byte (magnitude at 2..4, sign at 7) read E2M1 * 2^-6
X_PREMULTIPLY = 4.0  # 2^2: x pairs of the E4M3 decode carry this, so its products are E2M1 * 2^-4 * x like the bit-placement decode's

# The E4M3 decode (FP8 on): byte b of a code word holds codes 2b (bits 0..3) and 2b + 1 (bits 4..7). One shift and mask
# per half places the four even codes' magnitudes at bits 2..4 of each byte, another their signs at bit 7; the odd
# codes take a right shift (magnitudes) and no shift (signs). `cvt.rn.f16x2.e4m3x2` widens two such bytes to a float16
# pair: codes (0, 2), (4, 6) from the even word, (1, 3), (5, 7) from the odd one. The x pairs follow that order.
_E4M3_WORDS = (
    ("shl.b32 t, {w}, 2;", "shl.b32 u, {w}, 4;"),  # even codes: magnitude bits 0..2 -> 2..4, sign bit 3 -> 7
    ("shr.b32 t, {w}, 2;", "mov.b32 u, {w};"),  # odd codes: magnitude bits 4..6 -> 2..4, sign already at bit 7
)


def _block_dot_e4m3_asm() -> str:
    """PTX: $1 the int64 block (16 codes), $2..$9 the x pairs (float16x2, times `X_PREMULTIPLY`) in the E4M3 decode's
    order -> $0 float32 sum of the 16 products (codes times 2^-4)."""
    lines = ["{ .reg .b32 w0, w1, t, u, e, d; .reg .b32 acc; .reg .b16 l, h;", "mov.b64 {w0, w1}, $1;"]
    operand = 2
    for word in ("w0", "w1"):
        for mag, sign in _E4M3_WORDS:
            lines += [mag.format(w=word), "and.b32 t, t, 0x1C1C1C1C;", sign.format(w=word), "and.b32 u, u, 0x80808080;", "or.b32 e, t, u;",
                      "mov.b32 {l, h}, e;"]
            for half in ("l", "h"):
                lines.append(f"cvt.rn.f16x2.e4m3x2 d, {half};")
                lines.append(f"mul.rn.f16x2 acc, d, ${operand};" if operand == 2 else f"fma.rn.f16x2 acc, d, ${operand}, acc;")
                operand += 1
    lines += ["mov.b32 {l, h}, acc;", "add.rn.f16 l, l, h;", "cvt.f32.f16 $0, l; }"]
    return " ".join(lines)


BLOCK_DOT_E4M3_ASM = tl.constexpr(_block_dot_e4m3_asm())


@triton.jit
def _half_pair(low_f32, high_f32, ASM: tl.constexpr):
    """Two float32 tensors -> int32 float16x2 (low half `low_f32`, high half `high_f32`), rounded to nearest."""
    if ASM:
        pair = tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f", [high_f32, low_f32], dtype=tl.int32, is_pure=True, pack=1)
    else:
        low = low_f32.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        high = high_f32.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
        pair = low | (high << 16)
    return pair


@triton.jit
def _half_pair_times_4(low_f32, high_f32, ASM: tl.constexpr):
    """`_half_pair` of the values times `X_PREMULTIPLY` (on the GPU: rounded to float16, then one packed multiply by 4,
    exact in float16's normal range)."""
    if ASM:
        pair = tl.inline_asm_elementwise(
            "{ .reg .b32 c; mov.b32 c, 0x44004400; cvt.rn.f16x2.f32 $0, $1, $2; mul.rn.f16x2 $0, $0, c; }",
            "=r,f,f", [high_f32, low_f32], dtype=tl.int32, is_pure=True, pack=1,
        )
    else:
        pair = _half_pair(low_f32 * 4.0, high_f32 * 4.0, False)
    return pair


@triton.jit
def _rows_half_pairs(values, BN: tl.constexpr, ASM: tl.constexpr, FP8: tl.constexpr):
    """float32 values [BN] of BN consecutive elements from a multiple of 8 (BN a multiple of 8) -> int32 [BN / 8, 4]:
    rounded to bfloat16 (nearest even), then the float16 pairs `x_half_pairs` builds from that bfloat16 row, in its word
    order (each 8-element group is half a scale block: 4 consecutive words). A producer that stores these words spares
    its consumer the conversion of x (the batch-1 MoE activation, the grouped kernels' activation)."""
    bits = values.to(tl.int32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)  # bfloat16, round to nearest even
    if FP8:  # element 8w + 4a + 2b + c: pair 2c + a of word w, half b (pairs (0, 2), (4, 6), (1, 3), (5, 7)), times 4
        lo, hi = tl.split(tl.reshape(tl.permute(tl.reshape(rounded, (BN // 8, 2, 2, 2)), (0, 3, 1, 2)), (BN // 8, 4, 2)))
        return _half_pair_times_4(lo, hi, ASM)
    lo, hi = tl.split(tl.permute(tl.reshape(rounded, (BN // 8, 2, 4)), (0, 2, 1)))  # [BN/8, 4]: elements 8w + j, 8w + 4 + j
    return _half_pair(lo, hi, ASM)


@triton.jit
def _store_rows_half_pairs(row32_ptr, row_block, values, valid, N: tl.constexpr, BN: tl.constexpr, ASM: tl.constexpr, FP8: tl.constexpr):
    """`_rows_half_pairs` of elements row_block * BN.. of a row of N (int32 words from `row32_ptr`, N / 2 of them),
    stored where `valid` and inside the row."""
    groups = row_block * (BN // 8) + tl.arange(0, BN // 8)
    offsets = groups[:, None] * 4 + tl.arange(0, 4)[None, :]
    tl.store(row32_ptr + offsets, _rows_half_pairs(values, BN, ASM, FP8), mask=valid & (groups < N // 8)[:, None])


@triton.jit
def _bf16_low(words):
    """int32 holding two bfloat16 -> float32 of the low one (exact)."""
    return (words << 16).to(tl.float32, bitcast=True)


@triton.jit
def _bf16_high(words):
    """int32 holding two bfloat16 -> float32 of the high one (exact)."""
    return (words & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _block_words(words_ptr, blocks, ok, CG: tl.constexpr = False):
    """The 8 int32 words of each scale block `blocks` [BB] (16 16-bit elements per block) of a row read as int32.
    CG: read from L2 (`.cg`), for values that other programs of the same launch wrote."""
    base = words_ptr + blocks * 8
    if CG:
        x0 = tl.load(base + 0, mask=ok, other=0, cache_modifier=".cg")
        x1 = tl.load(base + 1, mask=ok, other=0, cache_modifier=".cg")
        x2 = tl.load(base + 2, mask=ok, other=0, cache_modifier=".cg")
        x3 = tl.load(base + 3, mask=ok, other=0, cache_modifier=".cg")
        x4 = tl.load(base + 4, mask=ok, other=0, cache_modifier=".cg")
        x5 = tl.load(base + 5, mask=ok, other=0, cache_modifier=".cg")
        x6 = tl.load(base + 6, mask=ok, other=0, cache_modifier=".cg")
        x7 = tl.load(base + 7, mask=ok, other=0, cache_modifier=".cg")
    else:
        x0 = tl.load(base + 0, mask=ok, other=0)
        x1 = tl.load(base + 1, mask=ok, other=0)
        x2 = tl.load(base + 2, mask=ok, other=0)
        x3 = tl.load(base + 3, mask=ok, other=0)
        x4 = tl.load(base + 4, mask=ok, other=0)
        x5 = tl.load(base + 5, mask=ok, other=0)
        x6 = tl.load(base + 6, mask=ok, other=0)
        x7 = tl.load(base + 7, mask=ok, other=0)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _pair_words(pairs_ptr, blocks, ok, BB: tl.constexpr):
    """`_block_words` read as one [BB, 8] tile (each block's 8 words contiguous), then split into the 8 words."""
    tile = tl.load(pairs_ptr + blocks[:, None] * 8 + tl.arange(0, 8)[None, :], mask=ok[:, None], other=0)
    even, odd = tl.split(tl.reshape(tile, (BB, 2, 2, 2)))  # word j = 4a + 2b + c: c = 0, then c = 1
    w0_4, w2_6 = tl.split(even)
    w1_5, w3_7 = tl.split(odd)
    x0, x4 = tl.split(w0_4)
    x2, x6 = tl.split(w2_6)
    x1, x5 = tl.split(w1_5)
    x3, x7 = tl.split(w3_7)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _x_half_pairs(x32_ptr, blocks, ok, ASM: tl.constexpr, FP8: tl.constexpr = False, CG: tl.constexpr = False):
    """x read as int32 (bfloat16 pairs), at scale blocks `blocks` [BB] (16 elements each) -> the 8 float16x2
    pairs the block dot takes: word 0's (x[16b + j], x[16b + j + 4]) for j = 0..3, then word 1's (+8).
    FP8 (the E4M3 decode's order, times `X_PREMULTIPLY`): (x0, x2), (x4, x6), (x1, x3), (x5, x7), then the same 8 further.
    Any shape: `x32_ptr` may be a tensor of row pointers that broadcasts against `blocks`. CG: read x from L2."""
    x0, x1, x2, x3, x4, x5, x6, x7 = _block_words(x32_ptr, blocks, ok, CG)
    if FP8:
        p0 = _half_pair_times_4(_bf16_low(x0), _bf16_low(x1), ASM)  # elements 0, 2
        p1 = _half_pair_times_4(_bf16_low(x2), _bf16_low(x3), ASM)  # 4, 6
        p2 = _half_pair_times_4(_bf16_high(x0), _bf16_high(x1), ASM)  # 1, 3
        p3 = _half_pair_times_4(_bf16_high(x2), _bf16_high(x3), ASM)  # 5, 7
        p4 = _half_pair_times_4(_bf16_low(x4), _bf16_low(x5), ASM)  # 8, 10
        p5 = _half_pair_times_4(_bf16_low(x6), _bf16_low(x7), ASM)  # 12, 14
        p6 = _half_pair_times_4(_bf16_high(x4), _bf16_high(x5), ASM)  # 9, 11
        p7 = _half_pair_times_4(_bf16_high(x6), _bf16_high(x7), ASM)  # 13, 15
        return p0, p1, p2, p3, p4, p5, p6, p7
    p0 = _half_pair(_bf16_low(x0), _bf16_low(x2), ASM)  # elements 0, 4
    p1 = _half_pair(_bf16_high(x0), _bf16_high(x2), ASM)  # 1, 5
    p2 = _half_pair(_bf16_low(x1), _bf16_low(x3), ASM)  # 2, 6
    p3 = _half_pair(_bf16_high(x1), _bf16_high(x3), ASM)  # 3, 7
    p4 = _half_pair(_bf16_low(x4), _bf16_low(x6), ASM)  # 8, 12
    p5 = _half_pair(_bf16_high(x4), _bf16_high(x6), ASM)  # 9, 13
    p6 = _half_pair(_bf16_low(x5), _bf16_low(x7), ASM)  # 10, 14
    p7 = _half_pair(_bf16_high(x5), _bf16_high(x7), ASM)  # 11, 15
    return p0, p1, p2, p3, p4, p5, p6, p7


@triton.jit
def _pair_products(word, J: tl.constexpr, pair):
    """Interpreter form of one packed multiply: decoded codes (J, J + 4) of `word` times 2^10, times the
    float16x2 x pair, as float32 (lo product + hi product)."""
    lo, hi = _e2m1_word_pair(word, J, False)
    x_lo = (pair & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    x_hi = (pair >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo * 1024.0 * x_lo + hi * 1024.0 * x_hi


@triton.jit
def _e4m3_bytes(word, ODD: tl.constexpr):
    """Interpreter form of the E4M3 placement: int32 words of 8 codes -> the float32 values of the 4 bytes (codes
    0, 2, 4, 6, or with ODD 1, 3, 5, 7), each the E2M1 value times 2^-6, read through float8e4nv as the GPU's cvt does."""
    if ODD:
        placed = ((word >> 2) & 0x1C1C1C1C) | (word & -2139062144)  # 0x80808080 as int32
    else:
        placed = ((word << 2) & 0x1C1C1C1C) | ((word << 4) & -2139062144)
    b0 = (placed & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    b1 = ((placed >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    b2 = ((placed >> 16) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    b3 = ((placed >> 24) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return b0, b1, b2, b3


@triton.jit
def _half_lo(pair):
    """float32 of the low float16 of int32 pairs."""
    return (pair & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _half_hi(pair):
    """float32 of the high float16 of int32 pairs."""
    return (pair >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _e4m3_word_products(word, pe0, pe1, po0, po1):
    """Interpreter form of one word's 8 products in the E4M3 decode: float32 sum."""
    e0, e1, e2, e3 = _e4m3_bytes(word, False)
    o0, o1, o2, o3 = _e4m3_bytes(word, True)
    total = e0 * _half_lo(pe0) + e1 * _half_hi(pe0) + e2 * _half_lo(pe1) + e3 * _half_hi(pe1)
    return total + o0 * _half_lo(po0) + o1 * _half_hi(po0) + o2 * _half_lo(po1) + o3 * _half_hi(po1)


@triton.jit
def _block_dot_full(block, p0, p1, p2, p3, p4, p5, p6, p7, ASM: tl.constexpr, FP8: tl.constexpr = False):
    """int64 scale blocks (16 codes each, little-endian) and x pairs of the same shape -> float32 of that shape: each
    block's 16 products, codes taken as E2M1 * 2^-4 (times `BLOCK_SUM_SCALE` and the scales outside).
    FP8: the E4M3 decode (x pairs from `_x_half_pairs` with FP8)."""
    if FP8:
        if ASM:
            total = tl.inline_asm_elementwise(
                BLOCK_DOT_E4M3_ASM, "=f,l,r,r,r,r,r,r,r,r", [block, p0, p1, p2, p3, p4, p5, p6, p7], dtype=tl.float32, is_pure=True, pack=1,
            )  # fmt: skip
        else:
            w0 = (block & 0xFFFFFFFF).to(tl.int32)
            w1 = (block >> 32).to(tl.int32)
            total = _e4m3_word_products(w0, p0, p1, p2, p3)
            total += _e4m3_word_products(w1, p4, p5, p6, p7)
    elif ASM:
        total = tl.inline_asm_elementwise(
            BLOCK_DOT_ASM, "=f,l,r,r,r,r,r,r,r,r", [block, p0, p1, p2, p3, p4, p5, p6, p7], dtype=tl.float32, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        w0 = (block & 0xFFFFFFFF).to(tl.int32)
        w1 = (block >> 32).to(tl.int32)
        total = _pair_products(w0, 0, p0) + _pair_products(w0, 1, p1)
        total += _pair_products(w0, 2, p2) + _pair_products(w0, 3, p3)
        total += _pair_products(w1, 0, p4) + _pair_products(w1, 1, p5)
        total += _pair_products(w1, 2, p6) + _pair_products(w1, 3, p7)
    return total


@triton.jit
def _block_dot(block, p0, p1, p2, p3, p4, p5, p6, p7, BN: tl.constexpr, BB: tl.constexpr, ASM: tl.constexpr, FP8: tl.constexpr = False):
    """int64 scale blocks [BN, BB] and the x pairs [BB] -> float32 [BN, BB] (`_block_dot_full`, x shared by the rows)."""
    shape: tl.constexpr = (BN, BB)
    return _block_dot_full(block, tl.broadcast_to(p0[None, :], shape), tl.broadcast_to(p1[None, :], shape), tl.broadcast_to(p2[None, :], shape),
                           tl.broadcast_to(p3[None, :], shape), tl.broadcast_to(p4[None, :], shape), tl.broadcast_to(p5[None, :], shape),
                           tl.broadcast_to(p6[None, :], shape), tl.broadcast_to(p7[None, :], shape), ASM, FP8)  # fmt: skip


@triton.jit
def _half_rows_dot(blocks_ptr, scale_ptr, rows, row_ok, x32_ptr, K_BLOCKS, block0, BN: tl.constexpr, BB: tl.constexpr, ASM: tl.constexpr,
                   FP8: tl.constexpr = False, tile_base=0, TILED: tl.constexpr = False, X_PAIRS: tl.constexpr = 0):
    """Scale blocks block0..block0+BB of rows `rows` [BN] (int64) against x: float32 [BN, BB], each block's
    sum times its block scale and 2^-4 (the caller sums, and multiplies by `BLOCK_SUM_SCALE` and the tensor scale).
    FP8: the E4M3 decode. TILED: codes and scales in tile-major order (`ops.tiled_experts.tile_major` with one part:
    each [BN rows, BB blocks] step stored contiguously), this row tile from word `tile_base`; block0 a multiple of BB.
    X_PAIRS 1 or 2: `x32_ptr` holds x already as the block dot's float16 pairs (`x_half_pairs`: 8 int32 words a block,
    in `_x_half_pairs`'s order for this FP8 setting), loaded instead of converted here: 1 as 8 word loads a block, 2 as
    one [BB, 8] tile split in registers (16-byte loads; sm_90 SASS: fewer instructions at 256-row tiles, more at 64)."""
    cols = block0 + tl.arange(0, BB)
    ok = cols < K_BLOCKS
    tile_ok = row_ok[:, None] & ok[None, :]
    if TILED:
        offsets = tile_base + block0 * BN + tl.arange(0, BN)[:, None] * BB + tl.arange(0, BB)[None, :]
    else:
        offsets = rows[:, None] * K_BLOCKS + cols[None, :]
    block = tl.load(blocks_ptr + offsets, mask=tile_ok, other=0)  # [BN, BB] int64
    scale = tl.load(scale_ptr + offsets, mask=tile_ok, other=0.0).to(tl.float32)  # one E4M3 scale per block
    if X_PAIRS == 2:
        p0, p1, p2, p3, p4, p5, p6, p7 = _pair_words(x32_ptr, cols, ok, BB)
    elif X_PAIRS == 1:
        p0, p1, p2, p3, p4, p5, p6, p7 = _block_words(x32_ptr, cols, ok)
    else:
        p0, p1, p2, p3, p4, p5, p6, p7 = _x_half_pairs(x32_ptr, cols, ok, ASM, FP8)
    return _block_dot(block, p0, p1, p2, p3, p4, p5, p6, p7, BN, BB, ASM, FP8) * scale


@triton.jit
def _w4a16_gemv_half_kernel(
    x32_ptr, blocks_ptr, scale_ptr, scale_2_ptr, out_ptr, workspace_ptr, counter_ptr, N, K_BLOCKS,
    STEPS_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
    ROW_SCALES: tl.constexpr, LOOP: tl.constexpr, ASM: tl.constexpr, FP8: tl.constexpr = False, TILED: tl.constexpr = False,
    X_PAIRS: tl.constexpr = 0, PDL: tl.constexpr = 0,
):
    """One token: out[n] = sum_k x[k] W[n, k]. Grid (cdiv(N, BLOCK_N), SPLIT_K); BLOCK_B scale blocks
    (16 elements, 8 bytes) per row per step. TILED: `blocks_ptr` and `scale_ptr` hold a tile-major copy for
    (BLOCK_N, BLOCK_B) (whole row tiles and steps only; the caller checks). X_PAIRS 1 or 2: `x32_ptr` is x as float16
    pairs (`x_half_pairs`; `_half_rows_dot` says how each form loads them), so no program converts x (sm_90 SASS of the
    GDN in_proj tile: 2,079 instructions a thread converting, 1,566 and 1,460 with the pairs given).

    Split-K without a second launch: each program stores its float32 partial sums in `workspace [SPLIT_K, N]`,
    then takes a ticket from its row block's counter (`counter_ptr [cdiv(N, BLOCK_N)]` int32, zero between
    calls). The program that draws the last ticket sums the SPLIT_K partials in split order (the result does
    not depend on which program finishes last), writes `out` and puts the counter back to zero. PDL: `kernels/pdl.py`."""
    pdl.pdl_wait(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows64 = rows.to(tl.int64)
    if ROW_SCALES:
        scale_2 = tl.load(scale_2_ptr + rows, mask=row_ok, other=0.0) * 16.0
    else:
        scale_2 = tl.load(scale_2_ptr) * 16.0
    acc = tl.zeros((BLOCK_N, BLOCK_B), dtype=tl.float32)  # summed over K once, after the loop
    tile_base = pid_n.to(tl.int64) * BLOCK_N * K_BLOCKS  # TILED: this row tile's first word
    if LOOP == 1:  # unrolled: every step's loads may be issued before the first block dot
        for step in tl.static_range(STEPS_PER_SPLIT):
            acc += _half_rows_dot(blocks_ptr, scale_ptr, rows64, row_ok, x32_ptr, K_BLOCKS, (pid_k * STEPS_PER_SPLIT + step) * BLOCK_B, BLOCK_N, BLOCK_B, ASM, FP8,
                                  tile_base, TILED, X_PAIRS)
    elif LOOP > 1:
        for step in tl.range(STEPS_PER_SPLIT, num_stages=LOOP):
            acc += _half_rows_dot(blocks_ptr, scale_ptr, rows64, row_ok, x32_ptr, K_BLOCKS, (pid_k * STEPS_PER_SPLIT + step) * BLOCK_B, BLOCK_N, BLOCK_B, ASM, FP8,
                                  tile_base, TILED, X_PAIRS)
    else:
        for step in range(STEPS_PER_SPLIT):
            acc += _half_rows_dot(blocks_ptr, scale_ptr, rows64, row_ok, x32_ptr, K_BLOCKS, (pid_k * STEPS_PER_SPLIT + step) * BLOCK_B, BLOCK_N, BLOCK_B, ASM, FP8,
                                  tile_base, TILED, X_PAIRS)
    acc = tl.sum(acc, axis=1) * scale_2
    pdl.pdl_release(PDL)
    if SPLIT_K == 1:
        tl.store(out_ptr + rows, acc.to(out_ptr.dtype.element_ty), mask=row_ok)
    else:
        tl.store(workspace_ptr + pid_k * N + rows, acc, mask=row_ok)
        tl.debug_barrier()  # every thread's partials are stored before the ticket is taken (release, GPU scope)
        ticket = tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:  # the last program of this row block: all partials are visible (acquire)
            total = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for split in range(SPLIT_K):
                total += tl.load(workspace_ptr + split * N + rows, mask=row_ok, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=row_ok)
            tl.store(counter_ptr + pid_n, 0)


def x_half_pairs(x: torch.Tensor, fp8: bool) -> torch.Tensor:
    """bfloat16 x [M, K] (K a multiple of 16) -> int32 [M, K / 2]: per 16-element block the 8 float16x2 words the block
    dot takes (`_x_half_pairs`'s order; with `fp8` the E4M3 decode's order, each value rounded to float16 and then
    multiplied by 4 in float16, as `_half_pair_times_4` does on the GPU). The same bits the kernels build in registers."""
    if x.dtype != torch.bfloat16 or x.shape[-1] % 16:
        raise ValueError(f"x_half_pairs takes bfloat16 x with a multiple of 16 columns, got {x.dtype} {tuple(x.shape)}")
    blocks = x.reshape(*x.shape[:-1], -1, 16).to(torch.float16)  # bf16 -> f16 rounds to nearest, as cvt.rn.f16x2.f32 of the exact f32
    if fp8:
        blocks = blocks * 4  # a float16 multiply by a power of two (exact in the normal range; IEEE rounding elsewhere)
        low = blocks[..., [0, 4, 1, 5, 8, 12, 9, 13]]
        high = blocks[..., [2, 6, 3, 7, 10, 14, 11, 15]]
    else:
        low = blocks[..., [0, 1, 2, 3, 8, 9, 10, 11]]
        high = blocks[..., [4, 5, 6, 7, 12, 13, 14, 15]]
    words = low.view(torch.int16).to(torch.int32) & 0xFFFF | high.view(torch.int16).to(torch.int32) << 16
    return words.reshape(*x.shape[:-1], x.shape[-1] // 2).contiguous()
