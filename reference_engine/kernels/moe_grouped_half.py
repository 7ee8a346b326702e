"""Routed experts plus the shared expert for decode batches, grouped by expert, products in packed float16 on CUDA cores.

The per-pair kernels (`moe_decode`, packed float16 path) decode an expert's NVFP4 weights once per (token, slot) pair
that chose it: at batch 32 each touched expert about 1.6 times, the shared expert 32 times, and they are bound by the
instructions they issue (run21), most of them the decode. Here one program decodes a [rows, scale blocks] weight tile
once and applies it to up to four tokens of the same expert:

- per 16-code scale block, one piece of PTX decodes the 8 float16 pairs (the decode of `nvfp4_half_dot`: shift, mask,
  sign, times 2^10), and one more piece per token takes them with that token's 8 x pairs: 8 packed multiply-adds, the
  two halves added and widened (the same operations, in the same order, as `nvfp4_half_dot`'s block dot);
- a chunk of 1, 2 or 4 tokens is compiled separately and picked per chunk at run time, so a group of one pair (most of
  them at batch 32) pays for one token's products, and 3 tokens run as 4 with the fourth's output not stored.

Four launches (five with plan `pairs` 1), no sort, no atomics, deterministic:
1. `moe_grouped_decode._groups`: per expert the pairs p = t * (top_k + 1) + j that chose it, in pair order.
   (`pairs` 1: `_pairs_kernel` converts x once into float16 pairs in the block dot's order; with `pairs` 0 every
   program builds them from the bfloat16 words it reads, which at small tiles nothing shares: run32 measured the
   whole block 11% faster at 32 tokens and 14% at 64 with `pairs` 1, bit-identical.)
2. `_gate_up_kernel`, grid (S + E, cdiv(I, BLOCK_N)): programs 0..S-1 take the shared expert for tokens 4c..4c+3 (one
   chunk each, so its T tokens do not queue in one program); program S + e loops over expert e's pairs in chunks of
   four (none for an expert no token chose). act[p] = silu(gate) * up, rounded to x's dtype (`pairs` 1: rounded to
   bfloat16, nearest even, and stored as float16 pairs in the block dot's order, int32 [P, I / 2]).
3. `_down_kernel`, grid (S + E, cdiv(H, BLOCK_N)): the same chunks over act; y[p] = pair weight * (down rows @ act[p]),
   float32.
4. `nvfp4_gemm.slot_sum`: out[t] = the token's slots of y summed in slot order, rounded once.

Numerics are those of the per-pair packed float16 path (products and 16-term block sums in float16, the rest float32),
float32 sums in another order. bfloat16 x only (the x pairs are built from bfloat16 words); `MIN_TOKENS` / `MAX_TOKENS`
(tuning key `moe_grouped_half`) pick the batches `moe_decode.moe_block_decode` sends here.

Measured and removed: the K loop with the next step's weight blocks and scales loaded before this step's products, and
the loop handed to Triton's pipeliner (plan field `loop`, commits 68a1339 to be266b6). On an H200 (run68) the first was
4 to 7% slower at 16 to 64 tokens and the second 1.6 to 2x slower, with the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from reference_engine.kernels.launch import cdiv, interpreting, next_power_of_2
from reference_engine.kernels.moe_grouped_decode import (
    _groups,
    _scratch,
    grouped_inputs,
)
from reference_engine.kernels.nvfp4_gemm import slot_sum
from reference_engine.kernels.nvfp4_gemv import _e2m1_word_pair
from reference_engine.kernels.nvfp4_half_dot import (
    _E4M3_WORDS,
    _PAIR_DECODE,
    _block_words,
    _e4m3_bytes,
    _half_pair,
    _store_rows_half_pairs,
    _x_half_pairs,
)
from reference_engine.ops.moe import _require
from reference_engine.ops.static_moe import (
    SharedNvfp4Expert,
    StackedNvfp4Experts,
)
from reference_engine.ops.tiled_experts import TiledWeights, tiled_weights

CHUNK = 4  # the most tokens one program applies a decoded tile to
PAIRS_BLOCK_B = 32  # scale blocks per program of the x conversion (`_pairs_kernel`)


@dataclass(frozen=True)
class HalfGroupedPlan:
    """Tiles of the two expert kernels (set from the tuning file's `moe_grouped_half`)."""

    gate_up_block_n: int = 32  # gate rows (and as many up rows) per program
    gate_up_block_b: int = 8  # scale blocks (16 codes, 8 bytes) per row per K step
    down_block_n: int = 32  # output rows per program
    down_block_b: int = 8
    num_warps: int = 4
    pairs: int = 0  # 1: x and the activation are converted once into float16 pairs in the block dot's order (one launch for x;
    # the gate/up kernel writes the activation so), 0: each program converts the bfloat16 words it reads
    fp8: int = 0  # 1: codes widened through E4M3 (`nvfp4_half_dot`'s FP8 decode; x pairs in its order, times 4)
    tiled: int = 0  # 1: the engine gives the stacks tile-major copies (`wants_tiled`, `tile_experts`) that the kernels read


def wants_tiled(max_batch: int) -> bool:
    """Whether an engine decoding up to `max_batch` rows on CUDA should attach tile-major copies (`tile_experts`): the
    plan asks for them and some batch runs these kernels."""
    return bool(PLAN.tiled) and MIN_TOKENS is not None and max_batch >= MIN_TOKENS


def tiles_for(plan: HalfGroupedPlan | None, hidden: int, inter: int) -> tuple[int, int, int, int]:
    """The (rows, blocks per K step) the kernels run with under `plan` (default `PLAN`) at this shape, gate/up then
    down: the tiles a tile-major copy must be ordered for to serve that plan."""
    p = plan if plan is not None else PLAN
    return (min(p.gate_up_block_n, next_power_of_2(inter)), _steps(p.gate_up_block_b, hidden // 16),
            min(p.down_block_n, next_power_of_2(hidden)), _steps(p.down_block_b, inter // 16))  # fmt: skip


def tile_experts(experts: StackedNvfp4Experts, shared: SharedNvfp4Expert, plan: HalfGroupedPlan | None = None) -> tuple[TiledWeights, TiledWeights]:
    """The routed stack's and the shared expert's tile-major copies for `plan`'s tiles (default `PLAN`); the copies they
    already carry when those were ordered for the same tiles."""
    tiles = tiles_for(plan, experts.gate_up_packed.shape[2] * 2, experts.gate_up_packed.shape[1] // 2)
    if experts.tiled is not None and shared.tiled is not None and experts.tiled.tiles == tiles == shared.tiled.tiles:
        return experts.tiled, shared.tiled
    return (tiled_weights(experts.gate_up_packed, experts.gate_up_scale, experts.down_packed, experts.down_scale, tiles),
            tiled_weights(shared.gate_up_packed, shared.gate_up_scale, shared.down_packed, shared.down_scale, tiles))  # fmt: skip


PLAN = HalfGroupedPlan()
MIN_TOKENS: int | None = None  # `moe_decode.moe_block_decode` runs these kernels for batches MIN_TOKENS..MAX_TOKENS (None: never)
MAX_TOKENS: int | None = None  # None: no upper bound
POISON_SCRATCH = False  # tests: act and y start as NaN, so a pair the kernels never write shows up in the output


def _decode_asm() -> str:
    """PTX: $8 the int64 block (16 codes) -> $0..$7 the float16x2 pairs (codes j, j + 4 of word 0 for j = 0..3, then
    of word 1), each code its E2M1 value times 2^-4 (as `nvfp4_half_dot`'s block dot decodes them)."""
    lines = ["{ .reg .b32 w0, w1, m, s, c;", "mov.b64 {w0, w1}, $8;", "mov.b32 c, 0x64006400;"]
    out = 0
    for word in ("w0", "w1"):
        for mag, sign in _PAIR_DECODE:
            lines += [mag.format(w=word), "and.b32 m, m, 0x0E000E00;", sign.format(w=word), "and.b32 s, s, 0x80008000;", "or.b32 m, m, s;"]
            lines.append(f"mul.rn.f16x2 ${out}, m, c;")
            out += 1
    return " ".join([*lines, "}"])


def _token_dot_asm() -> str:
    """PTX: $1..$8 decoded pairs, $9..$16 the token's x pairs -> $0 float32 sum of the 16 products (the block dot's
    multiply-adds in its order: the first pair multiplied, the other seven added, halves added in float16, widened)."""
    lines = ["{ .reg .b32 acc; .reg .b16 l, h;", "mul.rn.f16x2 acc, $1, $9;"]
    lines += [f"fma.rn.f16x2 acc, ${1 + j}, ${9 + j}, acc;" for j in range(1, 8)]
    lines += ["mov.b32 {l, h}, acc;", "add.rn.f16 l, l, h;", "cvt.f32.f16 $0, l; }"]
    return " ".join(lines)


def _decode_e4m3_asm() -> str:
    """PTX: $8 the int64 block -> $0..$7 the float16x2 pairs of the E4M3 decode (codes (0, 2), (4, 6), (1, 3), (5, 7) of
    word 0, then of word 1), each code its E2M1 value times 2^-6 (x pairs carry the other 2^2)."""
    lines = ["{ .reg .b32 w0, w1, t, u, e; .reg .b16 l, h;", "mov.b64 {w0, w1}, $8;"]
    out = 0
    for word in ("w0", "w1"):
        for mag, sign in _E4M3_WORDS:
            lines += [mag.format(w=word), "and.b32 t, t, 0x1C1C1C1C;", sign.format(w=word), "and.b32 u, u, 0x80808080;", "or.b32 e, t, u;",
                      "mov.b32 {l, h}, e;", f"cvt.rn.f16x2.e4m3x2 ${out}, l;", f"cvt.rn.f16x2.e4m3x2 ${out + 1}, h;"]
            out += 2
    return " ".join([*lines, "}"])


DECODE_ASM = tl.constexpr(_decode_asm())
DECODE_E4M3_ASM = tl.constexpr(_decode_e4m3_asm())
TOKEN_DOT_ASM = tl.constexpr(_token_dot_asm())


@triton.jit
def _code_pair(word, J: tl.constexpr):
    """Interpreter form of one decoded pair: codes (J, J + 4) of `word` as float16x2 bits, E2M1 times 2^-4 (exact)."""
    lo, hi = _e2m1_word_pair(word, J, False)
    return _half_pair(lo * 1024.0, hi * 1024.0, False)


@triton.jit
def _e4m3_pairs(word):
    """Interpreter form of one word's 4 pairs in the E4M3 decode: float16x2 bits of codes (0, 2), (4, 6), (1, 3), (5, 7)."""
    e0, e1, e2, e3 = _e4m3_bytes(word, False)
    o0, o1, o2, o3 = _e4m3_bytes(word, True)
    return _half_pair(e0, e1, False), _half_pair(e2, e3, False), _half_pair(o0, o1, False), _half_pair(o2, o3, False)


@triton.jit
def _decoded(block, ASM: tl.constexpr, FP8: tl.constexpr = False):
    """int64 scale blocks [BN, BB] -> 8 int32 [BN, BB] float16x2 pairs (word 0's pairs j = 0..3, then word 1's;
    FP8: the E4M3 decode's pairs and order)."""
    if FP8:
        if ASM:
            c0, c1, c2, c3, c4, c5, c6, c7 = tl.inline_asm_elementwise(
                DECODE_E4M3_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,l", [block], dtype=(tl.int32,) * 8, is_pure=True, pack=1
            )
        else:
            c0, c1, c2, c3 = _e4m3_pairs((block & 0xFFFFFFFF).to(tl.int32))
            c4, c5, c6, c7 = _e4m3_pairs((block >> 32).to(tl.int32))
    elif ASM:
        c0, c1, c2, c3, c4, c5, c6, c7 = tl.inline_asm_elementwise(
            DECODE_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,l", [block], dtype=(tl.int32,) * 8, is_pure=True, pack=1
        )
    else:
        w0 = (block & 0xFFFFFFFF).to(tl.int32)
        w1 = (block >> 32).to(tl.int32)
        c0, c1, c2, c3 = _code_pair(w0, 0), _code_pair(w0, 1), _code_pair(w0, 2), _code_pair(w0, 3)
        c4, c5, c6, c7 = _code_pair(w1, 0), _code_pair(w1, 1), _code_pair(w1, 2), _code_pair(w1, 3)
    return c0, c1, c2, c3, c4, c5, c6, c7


@triton.jit
def _pair_product(code, x):
    """Interpreter form: float32 (lo code * lo x + hi code * hi x) of two float16x2 words."""
    c_lo = (code & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    c_hi = (code >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    x_lo = (x & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    x_hi = (x >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return c_lo * x_lo + c_hi * x_hi


@triton.jit
def _token_dot(c0, c1, c2, c3, c4, c5, c6, c7, x0, x1, x2, x3, x4, x5, x6, x7, BN: tl.constexpr, BB: tl.constexpr, ASM: tl.constexpr):
    """Decoded pairs [BN, BB] and one token's x pairs [BB] -> float32 [BN, BB]: each block's 16 products summed."""
    shape: tl.constexpr = (BN, BB)
    if ASM:
        total = tl.inline_asm_elementwise(
            TOKEN_DOT_ASM, "=f,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r",
            [c0, c1, c2, c3, c4, c5, c6, c7,
             tl.broadcast_to(x0[None, :], shape), tl.broadcast_to(x1[None, :], shape), tl.broadcast_to(x2[None, :], shape), tl.broadcast_to(x3[None, :], shape),
             tl.broadcast_to(x4[None, :], shape), tl.broadcast_to(x5[None, :], shape), tl.broadcast_to(x6[None, :], shape), tl.broadcast_to(x7[None, :], shape)],
            dtype=tl.float32, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        total = _pair_product(c0, x0[None, :]) + _pair_product(c1, x1[None, :])
        total += _pair_product(c2, x2[None, :]) + _pair_product(c3, x3[None, :])
        total += _pair_product(c4, x4[None, :]) + _pair_product(c5, x5[None, :])
        total += _pair_product(c6, x6[None, :]) + _pair_product(c7, x7[None, :])
    return total


@triton.jit
def _token_sums(row32_ptr, cols, ok, c0, c1, c2, c3, c4, c5, c6, c7, BN: tl.constexpr, BB: tl.constexpr, ASM: tl.constexpr, PAIRS: tl.constexpr,
                FP8: tl.constexpr = False):
    """The decoded tile against the token whose row starts at `row32_ptr` (int32 words: bfloat16 pairs, or with PAIRS
    float16 pairs in the block dot's order): float32 [BN, BB]."""
    if PAIRS:
        x0, x1, x2, x3, x4, x5, x6, x7 = _block_words(row32_ptr, cols, ok)  # already pairs (`_pairs_kernel`)
    else:
        x0, x1, x2, x3, x4, x5, x6, x7 = _x_half_pairs(row32_ptr, cols, ok, ASM, FP8)
    return _token_dot(c0, c1, c2, c3, c4, c5, c6, c7, x0, x1, x2, x3, x4, x5, x6, x7, BN, BB, ASM)


@triton.jit
def _pairs_kernel(x32_ptr, out_ptr, WORDS: tl.constexpr, K_BLOCKS: tl.constexpr, BLOCK_B: tl.constexpr, ASM: tl.constexpr, FP8: tl.constexpr = False):
    """Grid (T, cdiv(K_BLOCKS, BLOCK_B)): bfloat16 rows (int32 words, WORDS per row) -> the same rows as float16 pairs
    in the block dot's order (per 16-element block: (x[j], x[j + 4]) for j = 0..3, then the same 8 further)."""
    row = tl.program_id(0).to(tl.int64) * WORDS
    blocks = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    ok = blocks < K_BLOCKS
    x0, x1, x2, x3, x4, x5, x6, x7 = _x_half_pairs(x32_ptr + row, blocks, ok, ASM, FP8)
    base = out_ptr + row + blocks * 8
    tl.store(base + 0, x0, mask=ok)
    tl.store(base + 1, x1, mask=ok)
    tl.store(base + 2, x2, mask=ok)
    tl.store(base + 3, x3, mask=ok)
    tl.store(base + 4, x4, mask=ok)
    tl.store(base + 5, x5, mask=ok)
    tl.store(base + 6, x6, mask=ok)
    tl.store(base + 7, x7, mask=ok)


@triton.jit
def _gate_up_chunk(
    x32_ptr, t0, t1, t2, t3, p0, p1, p2, p3, n, blocks_ptr, scale_ptr, gate_rows, rows, gate_s2, up_s2, act_ptr,
    I: tl.constexpr, H_WORDS: tl.constexpr, K_BLOCKS: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, TC: tl.constexpr, ASM: tl.constexpr,
    PAIRS: tl.constexpr, FP8: tl.constexpr, tile_base=0, TILED: tl.constexpr = False,
):
    """Gate and up rows `gate_rows` [BN] (int64, up rows I further) against TC tokens t0.. (pairs p0.., the first n real):
    act[p_i, rows] = silu(gate) * up. TILED: the codes and scales are in tile-major order (`ops.tiled_experts.tile_major`) and this
    program's tile starts at word `tile_base`; each K step reads one contiguous run, gate then up."""
    g0 = tl.zeros((BN, BB), dtype=tl.float32)
    u0 = tl.zeros((BN, BB), dtype=tl.float32)
    g1 = g0
    u1 = g0
    g2 = g0
    u2 = g0
    g3 = g0
    u3 = g0
    for block0 in range(0, K_BLOCKS, BB):
        cols = block0 + tl.arange(0, BB)
        ok = cols < K_BLOCKS
        tile_ok = ok[None, :]  # rows are clamped in range; only the last K step can run past a row
        if TILED:
            gate_offsets = tile_base + (block0 // BB) * (2 * BN * BB) + tl.arange(0, BN)[:, None] * BB + tl.arange(0, BB)[None, :]
            up_offsets = gate_offsets + BN * BB
        else:
            gate_offsets = gate_rows[:, None] * K_BLOCKS + cols[None, :]
            up_offsets = gate_offsets + I * K_BLOCKS
        gate_scale = tl.load(scale_ptr + gate_offsets, mask=tile_ok, other=0.0).to(tl.float32)
        up_scale = tl.load(scale_ptr + up_offsets, mask=tile_ok, other=0.0).to(tl.float32)
        a0, a1, a2, a3, a4, a5, a6, a7 = _decoded(tl.load(blocks_ptr + gate_offsets, mask=tile_ok, other=0), ASM, FP8)
        b0, b1, b2, b3, b4, b5, b6, b7 = _decoded(tl.load(blocks_ptr + up_offsets, mask=tile_ok, other=0), ASM, FP8)
        row = x32_ptr + t0 * H_WORDS
        g0 += _token_sums(row, cols, ok, a0, a1, a2, a3, a4, a5, a6, a7, BN, BB, ASM, PAIRS, FP8) * gate_scale
        u0 += _token_sums(row, cols, ok, b0, b1, b2, b3, b4, b5, b6, b7, BN, BB, ASM, PAIRS, FP8) * up_scale
        if TC >= 2:
            row = x32_ptr + t1 * H_WORDS
            g1 += _token_sums(row, cols, ok, a0, a1, a2, a3, a4, a5, a6, a7, BN, BB, ASM, PAIRS, FP8) * gate_scale
            u1 += _token_sums(row, cols, ok, b0, b1, b2, b3, b4, b5, b6, b7, BN, BB, ASM, PAIRS, FP8) * up_scale
        if TC >= 4:
            row = x32_ptr + t2 * H_WORDS
            g2 += _token_sums(row, cols, ok, a0, a1, a2, a3, a4, a5, a6, a7, BN, BB, ASM, PAIRS, FP8) * gate_scale
            u2 += _token_sums(row, cols, ok, b0, b1, b2, b3, b4, b5, b6, b7, BN, BB, ASM, PAIRS, FP8) * up_scale
            row = x32_ptr + t3 * H_WORDS
            g3 += _token_sums(row, cols, ok, a0, a1, a2, a3, a4, a5, a6, a7, BN, BB, ASM, PAIRS, FP8) * gate_scale
            u3 += _token_sums(row, cols, ok, b0, b1, b2, b3, b4, b5, b6, b7, BN, BB, ASM, PAIRS, FP8) * up_scale
    _store_act(act_ptr, p0, rows, n > 0, g0, u0, gate_s2, up_s2, I, BN, ASM, PAIRS, FP8)
    if TC >= 2:
        _store_act(act_ptr, p1, rows, n > 1, g1, u1, gate_s2, up_s2, I, BN, ASM, PAIRS, FP8)
    if TC >= 4:
        _store_act(act_ptr, p2, rows, n > 2, g2, u2, gate_s2, up_s2, I, BN, ASM, PAIRS, FP8)
        _store_act(act_ptr, p3, rows, n > 3, g3, u3, gate_s2, up_s2, I, BN, ASM, PAIRS, FP8)


@triton.jit
def _store_act(act_ptr, pair, rows, valid, gate_acc, up_acc, gate_s2, up_s2, I: tl.constexpr, BN: tl.constexpr, ASM: tl.constexpr, PAIRS: tl.constexpr,
               FP8: tl.constexpr):
    """act = silu(gate) * up for rows `rows` [BN] (consecutive, from a multiple of BN) of pair `pair` (stored if `valid`):
    bfloat16 at act[pair, rows], or with PAIRS rounded to bfloat16 (nearest even) and stored as float16 pairs in the
    block dot's order, int32 act[pair, rows / 2]."""
    gate = tl.sum(gate_acc, axis=1) * gate_s2
    up = tl.sum(up_acc, axis=1) * up_s2
    act = gate * tl.sigmoid(gate) * up
    if PAIRS:
        _store_rows_half_pairs(act_ptr + pair.to(tl.int64) * (I // 2), tl.program_id(1), act, valid, I, BN, ASM, FP8)
    else:
        tl.store(act_ptr + pair.to(tl.int64) * I + rows, act.to(act_ptr.dtype.element_ty), mask=valid & (rows < I))


@triton.jit
def _gate_up_chunks(
    x32_ptr, t0, t1, t2, t3, p0, p1, p2, p3, n, blocks_ptr, scale_ptr, gate_rows, rows, gate_s2, up_s2, act_ptr,
    I: tl.constexpr, H_WORDS: tl.constexpr, K_BLOCKS: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, ASM: tl.constexpr, PAIRS: tl.constexpr,
    FP8: tl.constexpr, tile_base=0, TILED: tl.constexpr = False,
):
    """One chunk of n (1..4) tokens, with the products for 1, 2 or 4 of them."""
    if n == 1:
        _gate_up_chunk(x32_ptr, t0, t1, t2, t3, p0, p1, p2, p3, n, blocks_ptr, scale_ptr, gate_rows, rows, gate_s2, up_s2, act_ptr, I, H_WORDS, K_BLOCKS, BN, BB, 1, ASM, PAIRS, FP8, tile_base, TILED)
    elif n == 2:
        _gate_up_chunk(x32_ptr, t0, t1, t2, t3, p0, p1, p2, p3, n, blocks_ptr, scale_ptr, gate_rows, rows, gate_s2, up_s2, act_ptr, I, H_WORDS, K_BLOCKS, BN, BB, 2, ASM, PAIRS, FP8, tile_base, TILED)
    else:
        _gate_up_chunk(x32_ptr, t0, t1, t2, t3, p0, p1, p2, p3, n, blocks_ptr, scale_ptr, gate_rows, rows, gate_s2, up_s2, act_ptr, I, H_WORDS, K_BLOCKS, BN, BB, 4, ASM, PAIRS, FP8, tile_base, TILED)


@triton.jit
def _chunk_pairs(pairs_ptr, m0, n):
    """Pairs m0..m0+3 of a group list (the first n real; the others repeat the first, their outputs are not stored)."""
    p0 = tl.load(pairs_ptr + m0)
    p1 = tl.where(n > 1, tl.load(pairs_ptr + m0 + 1, mask=n > 1, other=0), p0)
    p2 = tl.where(n > 2, tl.load(pairs_ptr + m0 + 2, mask=n > 2, other=0), p0)
    p3 = tl.where(n > 3, tl.load(pairs_ptr + m0 + 3, mask=n > 3, other=0), p0)
    return p0, p1, p2, p3


@triton.jit
def _shared_chunk_pairs(chunk, T, SLOTS: tl.constexpr):
    """Shared-expert chunk `chunk`: its token count and the pairs (t * SLOTS + SLOTS - 1) of tokens 4c..4c+3."""
    m0 = chunk * 4
    n = tl.minimum(T - m0, 4)
    p0 = m0 * SLOTS + SLOTS - 1
    p1 = tl.where(n > 1, p0 + SLOTS, p0)
    p2 = tl.where(n > 2, p0 + 2 * SLOTS, p0)
    p3 = tl.where(n > 3, p0 + 3 * SLOTS, p0)
    return n, p0, p1, p2, p3


@triton.jit
def _gate_up_kernel(
    x32_ptr, counts_ptr, pairs_ptr, P, T, w_ptr, s_ptr, s2_ptr, shared_w_ptr, shared_s_ptr, shared_s2_ptr, act_ptr,
    I: tl.constexpr, H_WORDS: tl.constexpr, K_BLOCKS: tl.constexpr, SLOTS: tl.constexpr, SHARED_CHUNKS: tl.constexpr,
    BN: tl.constexpr, BB: tl.constexpr, ASM: tl.constexpr, PAIRS: tl.constexpr = 0, FP8: tl.constexpr = False, TILED: tl.constexpr = False,
):
    pid = tl.program_id(0)
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    clamped = tl.minimum(rows, I - 1).to(tl.int64)  # clamped rows: in-range loads, masked stores
    TILE_WORDS: tl.constexpr = 2 * BN * K_BLOCKS  # TILED: one row tile's gate and up words
    if pid < SHARED_CHUNKS:
        n, p0, p1, p2, p3 = _shared_chunk_pairs(pid, T, SLOTS)
        gate_s2 = tl.load(shared_s2_ptr) * 16.0
        up_s2 = tl.load(shared_s2_ptr + 1) * 16.0
        _gate_up_chunks(x32_ptr, p0 // SLOTS, p1 // SLOTS, p2 // SLOTS, p3 // SLOTS, p0, p1, p2, p3, n, shared_w_ptr, shared_s_ptr, clamped, rows,
                        gate_s2, up_s2, act_ptr, I, H_WORDS, K_BLOCKS, BN, BB, ASM, PAIRS, FP8, tl.program_id(1).to(tl.int64) * TILE_WORDS, TILED)  # fmt: skip
    else:
        group = pid - SHARED_CHUNKS + 1  # group lists: 0 the shared expert (unused here), 1 + e expert e
        count = tl.load(counts_ptr + group)
        expert = (group - 1).to(tl.int64)
        gate_s2 = tl.load(s2_ptr + 2 * expert) * 16.0
        up_s2 = tl.load(s2_ptr + 2 * expert + 1) * 16.0
        gate_rows = expert * (2 * I) + clamped
        tile_base = (expert * (I // BN) + tl.program_id(1)) * TILE_WORDS
        group_pairs = pairs_ptr + group.to(tl.int64) * P
        m0 = 0
        while m0 < count:  # a while loop: the Triton 3.6 interpreter cannot take a loaded scalar as a range bound
            n = tl.minimum(count - m0, 4)
            p0, p1, p2, p3 = _chunk_pairs(group_pairs, m0, n)
            _gate_up_chunks(x32_ptr, p0 // SLOTS, p1 // SLOTS, p2 // SLOTS, p3 // SLOTS, p0, p1, p2, p3, n, w_ptr, s_ptr, gate_rows, rows,
                            gate_s2, up_s2, act_ptr, I, H_WORDS, K_BLOCKS, BN, BB, ASM, PAIRS, FP8, tile_base, TILED)  # fmt: skip
            m0 += 4


@triton.jit
def _down_chunk(
    act32_ptr, p0, p1, p2, p3, n, blocks_ptr, scale_ptr, down_rows, rows, s2, weights_ptr, y_ptr,
    H: tl.constexpr, I_WORDS: tl.constexpr, K_BLOCKS: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, TC: tl.constexpr, ASM: tl.constexpr,
    PAIRS: tl.constexpr, FP8: tl.constexpr, tile_base=0, TILED: tl.constexpr = False,
):
    """Down rows `down_rows` [BN] (int64) against the activations of TC pairs p0..: y[p_i, rows] = weight * (rows @ act).
    TILED: tile-major codes and scales, this program's tile from word `tile_base` (as in `_gate_up_chunk`)."""
    a0 = tl.zeros((BN, BB), dtype=tl.float32)
    a1 = a0
    a2 = a0
    a3 = a0
    for block0 in range(0, K_BLOCKS, BB):
        cols = block0 + tl.arange(0, BB)
        ok = cols < K_BLOCKS
        tile_ok = ok[None, :]  # rows are clamped in range
        if TILED:
            offsets = tile_base + (block0 // BB) * (BN * BB) + tl.arange(0, BN)[:, None] * BB + tl.arange(0, BB)[None, :]
        else:
            offsets = down_rows[:, None] * K_BLOCKS + cols[None, :]
        scale = tl.load(scale_ptr + offsets, mask=tile_ok, other=0.0).to(tl.float32)
        c0, c1, c2, c3, c4, c5, c6, c7 = _decoded(tl.load(blocks_ptr + offsets, mask=tile_ok, other=0), ASM, FP8)
        a0 += _token_sums(act32_ptr + p0.to(tl.int64) * I_WORDS, cols, ok, c0, c1, c2, c3, c4, c5, c6, c7, BN, BB, ASM, PAIRS, FP8) * scale
        if TC >= 2:
            a1 += _token_sums(act32_ptr + p1.to(tl.int64) * I_WORDS, cols, ok, c0, c1, c2, c3, c4, c5, c6, c7, BN, BB, ASM, PAIRS, FP8) * scale
        if TC >= 4:
            a2 += _token_sums(act32_ptr + p2.to(tl.int64) * I_WORDS, cols, ok, c0, c1, c2, c3, c4, c5, c6, c7, BN, BB, ASM, PAIRS, FP8) * scale
            a3 += _token_sums(act32_ptr + p3.to(tl.int64) * I_WORDS, cols, ok, c0, c1, c2, c3, c4, c5, c6, c7, BN, BB, ASM, PAIRS, FP8) * scale
    row_ok = rows < H
    _store_y(y_ptr, weights_ptr, p0, rows, row_ok, a0, s2, H)
    if TC >= 2:
        _store_y(y_ptr, weights_ptr, p1, rows, row_ok & (n > 1), a1, s2, H)
    if TC >= 4:
        _store_y(y_ptr, weights_ptr, p2, rows, row_ok & (n > 2), a2, s2, H)
        _store_y(y_ptr, weights_ptr, p3, rows, row_ok & (n > 3), a3, s2, H)


@triton.jit
def _store_y(y_ptr, weights_ptr, pair, rows, mask, acc, s2, H: tl.constexpr):
    y = tl.load(weights_ptr + pair) * (tl.sum(acc, axis=1) * s2)
    tl.store(y_ptr + pair.to(tl.int64) * H + rows, y, mask=mask)


@triton.jit
def _down_chunks(
    act32_ptr, p0, p1, p2, p3, n, blocks_ptr, scale_ptr, down_rows, rows, s2, weights_ptr, y_ptr,
    H: tl.constexpr, I_WORDS: tl.constexpr, K_BLOCKS: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, ASM: tl.constexpr, PAIRS: tl.constexpr,
    FP8: tl.constexpr, tile_base=0, TILED: tl.constexpr = False,
):
    if n == 1:
        _down_chunk(act32_ptr, p0, p1, p2, p3, n, blocks_ptr, scale_ptr, down_rows, rows, s2, weights_ptr, y_ptr, H, I_WORDS, K_BLOCKS, BN, BB, 1, ASM, PAIRS, FP8, tile_base, TILED)
    elif n == 2:
        _down_chunk(act32_ptr, p0, p1, p2, p3, n, blocks_ptr, scale_ptr, down_rows, rows, s2, weights_ptr, y_ptr, H, I_WORDS, K_BLOCKS, BN, BB, 2, ASM, PAIRS, FP8, tile_base, TILED)
    else:
        _down_chunk(act32_ptr, p0, p1, p2, p3, n, blocks_ptr, scale_ptr, down_rows, rows, s2, weights_ptr, y_ptr, H, I_WORDS, K_BLOCKS, BN, BB, 4, ASM, PAIRS, FP8, tile_base, TILED)


@triton.jit
def _down_kernel(
    act32_ptr, weights_ptr, counts_ptr, pairs_ptr, P, T, w_ptr, s_ptr, s2_ptr, shared_w_ptr, shared_s_ptr, shared_s2_ptr, y_ptr,
    H: tl.constexpr, I_WORDS: tl.constexpr, K_BLOCKS: tl.constexpr, SLOTS: tl.constexpr, SHARED_CHUNKS: tl.constexpr,
    BN: tl.constexpr, BB: tl.constexpr, ASM: tl.constexpr, PAIRS: tl.constexpr = 0, FP8: tl.constexpr = False, TILED: tl.constexpr = False,
):
    pid = tl.program_id(0)
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    clamped = tl.minimum(rows, H - 1).to(tl.int64)
    TILE_WORDS: tl.constexpr = BN * K_BLOCKS
    if pid < SHARED_CHUNKS:
        n, p0, p1, p2, p3 = _shared_chunk_pairs(pid, T, SLOTS)
        s2 = tl.load(shared_s2_ptr) * 16.0
        _down_chunks(act32_ptr, p0, p1, p2, p3, n, shared_w_ptr, shared_s_ptr, clamped, rows, s2, weights_ptr, y_ptr, H, I_WORDS, K_BLOCKS, BN, BB, ASM, PAIRS, FP8,
                     tl.program_id(1).to(tl.int64) * TILE_WORDS, TILED)  # fmt: skip
    else:
        group = pid - SHARED_CHUNKS + 1
        count = tl.load(counts_ptr + group)
        expert = (group - 1).to(tl.int64)
        s2 = tl.load(s2_ptr + expert) * 16.0
        down_rows = expert * H + clamped
        tile_base = (expert * (H // BN) + tl.program_id(1)) * TILE_WORDS
        group_pairs = pairs_ptr + group.to(tl.int64) * P
        m0 = 0
        while m0 < count:
            n = tl.minimum(count - m0, 4)
            p0, p1, p2, p3 = _chunk_pairs(group_pairs, m0, n)
            _down_chunks(act32_ptr, p0, p1, p2, p3, n, w_ptr, s_ptr, down_rows, rows, s2, weights_ptr, y_ptr, H, I_WORDS, K_BLOCKS, BN, BB, ASM, PAIRS, FP8,
                         tile_base, TILED)  # fmt: skip
            m0 += 4


def _steps(block_b: int, k_blocks: int) -> int:
    """Scale blocks per K step: the plan's, no more than a row holds."""
    return max(1, min(block_b, next_power_of_2(k_blocks)))


def runs(num_tokens: int, dtype: torch.dtype) -> bool:
    """Whether `moe_decode.moe_block_decode` sends this batch here (the tuned range, bfloat16 x)."""
    if MIN_TOKENS is None or dtype != torch.bfloat16 or num_tokens < MIN_TOKENS:
        return False
    return MAX_TOKENS is None or num_tokens <= MAX_TOKENS


def half_grouped_experts_with_shared(
    x: torch.Tensor,  # [T, H] bfloat16
    topk_weights: torch.Tensor,  # [T, top_k + 1] float32; column top_k: sigmoid(shared gate logit)
    topk_ids: torch.Tensor,  # [T, top_k + 1] int32; column top_k: not read (the shared slot is told by position)
    experts: StackedNvfp4Experts,
    shared: SharedNvfp4Expert,
    out: torch.Tensor,  # [T, H] bfloat16
    plan: HalfGroupedPlan | None = None,
    check_ids: bool = True,
    tiled: tuple[TiledWeights, TiledWeights] | None = None,
) -> None:
    """Routed experts plus the weighted shared expert (module docstring); the signature of
    `ops.static_moe.nvfp4_experts_with_shared`, bfloat16 x only. `plan`: tiles other than `PLAN`.
    `check_ids=False` skips the expert-id range check (a host sync; the router's ids are in range).
    `tiled`: the routed and shared experts' tile-major copies (`tile_experts`, for this plan's tiles); the kernels then
    read those instead of the row-major codes and scales (the same values, so the same bits out). Without it, the copies
    the stacks carry (`experts.tiled`, `shared.tiled`, attached by `SparseMoeBlock.attach_tiled`) are read when they were ordered for
    this plan's tiles."""
    _require(x.dtype == torch.bfloat16, f"the packed float16 grouped experts take bfloat16 x, got {x.dtype}")
    tokens, hidden, top_k, inter, routed, shared_tensors = grouped_inputs(x, topk_weights, topk_ids, experts, shared, out, check_ids)
    if tokens == 0:
        return
    p = plan if plan is not None else PLAN
    slots, num_experts = top_k + 1, experts.num_experts
    pairs = tokens * slots
    counts, group_pairs = _groups(topk_ids.contiguous(), num_experts + 1, top_k)
    gu_packed, gu_scale, gu_scale_2, down_packed, down_scale, down_scale_2 = routed
    s_gu_packed, s_gu_scale, s_gu_scale_2, s_down_packed, s_down_scale, s_down_scale_2 = shared_tensors
    asm = not interpreting()
    want = tiles_for(p, hidden, inter)
    carried = getattr(experts, "tiled", None), getattr(shared, "tiled", None)  # the contracts' own stacks carry none
    if tiled is None and None not in carried and carried[0].tiles == want == carried[1].tiles:
        tiled = carried
    if tiled is not None:
        _require(tiled[0].tiles == want and tiled[1].tiles == want, f"tiled copies ordered for tiles {tiled[0].tiles} / {tiled[1].tiles}, the plan runs {want}")
        gu_packed, gu_scale, down_packed, down_scale = tiled[0].gate_up_words, tiled[0].gate_up_scale, tiled[0].down_words, tiled[0].down_scale
        s_gu_packed, s_gu_scale, s_down_packed, s_down_scale = tiled[1].gate_up_words, tiled[1].gate_up_scale, tiled[1].down_words, tiled[1].down_scale
    shared_chunks = cdiv(tokens, CHUNK)
    grid_groups = shared_chunks + num_experts
    x32 = x.contiguous().view(torch.int32)
    block_n = min(p.gate_up_block_n, next_power_of_2(inter))
    if p.pairs:  # x once into float16 pairs; the gate/up kernel writes the activation in the same form
        _require(block_n % 8 == 0, f"pairs 1 needs gate/up rows per program in multiples of 8, got {block_n}")
        source = torch.empty_like(x32)
        _pairs_kernel[(tokens, cdiv(hidden // 16, PAIRS_BLOCK_B))](x32, source, WORDS=hidden // 2, K_BLOCKS=hidden // 16, BLOCK_B=PAIRS_BLOCK_B, ASM=asm,
                                                                   FP8=bool(p.fp8))  # fmt: skip
        act = torch.full((pairs, inter // 2), 0x7E007E00, dtype=torch.int32, device=x.device) if POISON_SCRATCH else torch.empty(pairs, inter // 2, dtype=torch.int32, device=x.device)
    else:
        source = x32
        act = _scratch((pairs, inter), torch.bfloat16 if asm else torch.float32, x.device, POISON_SCRATCH)  # the interpreter truncates float32 -> bf16; torch rounds
    _gate_up_kernel[(grid_groups, cdiv(inter, block_n))](
        source, counts, group_pairs, pairs, tokens,
        gu_packed.view(torch.int64), gu_scale, gu_scale_2, s_gu_packed.view(torch.int64), s_gu_scale, s_gu_scale_2, act,
        I=inter, H_WORDS=hidden // 2, K_BLOCKS=hidden // 16, SLOTS=slots, SHARED_CHUNKS=shared_chunks,
        BN=block_n, BB=_steps(p.gate_up_block_b, hidden // 16), ASM=asm, PAIRS=p.pairs, FP8=bool(p.fp8), TILED=tiled is not None, num_warps=p.num_warps,
    )
    if act.dtype == torch.float32:
        act = act.to(torch.bfloat16)
    y = _scratch((pairs, hidden), torch.float32, x.device, POISON_SCRATCH)  # [P, H] weighted expert outputs
    block_n = min(p.down_block_n, next_power_of_2(hidden))
    _down_kernel[(grid_groups, cdiv(hidden, block_n))](
        act.view(torch.int32), topk_weights.contiguous(), counts, group_pairs, pairs, tokens,
        down_packed.view(torch.int64), down_scale, down_scale_2, s_down_packed.view(torch.int64), s_down_scale, s_down_scale_2, y,
        H=hidden, I_WORDS=inter // 2, K_BLOCKS=inter // 16, SLOTS=slots, SHARED_CHUNKS=shared_chunks,
        BN=block_n, BB=_steps(p.down_block_b, inter // 16), ASM=asm, PAIRS=p.pairs, FP8=bool(p.fp8), TILED=tiled is not None, num_warps=p.num_warps,
    )
    slot_sum(y, out, slots)
