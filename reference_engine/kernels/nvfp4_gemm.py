"""NVFP4 W4A16 GEMMs on tensor cores for prefill: plain linears and grouped routed experts, Triton.

Weights (ModelOpt multiplier convention): codes `[N, K/2]` uint8 with element 2j in the low nibble,
E4M3 block scales `[N, K/16]` (one per 16 elements along K), a float32 tensor scale (one value, or one
per output row for stacked linears / per expert for the MoE). `W = e2m1 * float(block_scale) * scale_2`.

Decoding (in registers, once per weight tile and program): the 3 magnitude bits of a code go to bits
11..9 of a float16 and its sign to bit 15, which is the E2M1 value times 2^-14 (0.5 becomes a float16
subnormal, still exact); the E4M3 block scale is converted to float16 and multiplied in float16. Every
such product is exact in float16 and in bfloat16 (an E2M1 significand has 2 bits, an E4M3 one 4, and
all products are multiples of 2^-24 below 0.17), so the dot operand is `e2m1 * block_scale * 2^-14`
without rounding; the tensor scale and the 2^14 are applied to the float32 accumulator in the epilogue.
The even and odd elements of a packed byte are interleaved back with `tl.join` so one `tl.dot` covers
a K step of 2 * BLOCK_KB elements against a contiguous [BLOCK_M, 2 * BLOCK_KB] tile of x.

Dot dtype: x's dtype on CUDA (bfloat16 / float16 tensor cores, float32 accumulation); float32 inputs
run an IEEE float32 dot. Under TRITON_INTERPRET=1 every dot is an IEEE float32 dot, because the Triton
3.6 interpreter computes bf16 x bf16 dots wrongly (see kernels/paged_decode.py); the operands hold the
same values, so the interpreter checks the same arithmetic up to summation order.

`w4a16_gemm`: grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)), token blocks on the fast grid axis so the
programs running together share one weight tile through L2. Out-of-range rows and tokens are clamped
to a valid index for the loads (unmasked, vectorised) and masked only at the store.

`nvfp4_moe_prefill`: the T * top_k (token, slot) pairs are sorted by expert (stable), each expert's
group is cut into blocks of BLOCK_M pairs, and two launches run over the blocks:
  A. (block, gate/up column block): gathered x rows x the expert's gate rows and the matching up rows
     (two accumulators, one x tile), act = silu(gate) * up in float32, rounded to x's dtype, written
     at the pairs' sorted positions [T * top_k, I];
  B. (block, H column block): act rows x the expert's down rows, times the tensor scale and the pair's
     routing weight, written in float32 at the pair's own index t * top_k + j of [T * top_k, H].
Then `_slot_sum_kernel` sums the top_k slots of every token in slot order and rounds once into out
(deterministic; no atomics); given `shared` (the shared expert's output and gate logit) it adds
s_t * sigmoid(logit_t) to that float32 sum first, so the MoE block's output leaves in the same launch. The block table is built
by a counting sort in three small launches (`block_table`) on the device, no host sync; the grid is
sized by an upper bound on the block count (floor(P / BLOCK_M) + min(E, P), at most P, for P pairs),
and blocks past the real count return at once. The only host sync is the expert-id range check,
skipped while a CUDA graph is being captured.

Tile sizes (`plan`; sm_90: 132 SMs, 64K registers and 228 KB shared memory per SM). The weight tile is
decoded in registers, so BLOCK_N x K-step sets the register pressure; the choices below were compiled
for sm_90 ahead of time (Triton 3.6, bundled ptxas) and use wgmma without register spills:
- K step 64 elements (32 packed bytes a row: two 16-byte loads), num_stages 3 (x tiles through shared
  memory, 16..32 KB).
- linear: BLOCK_N 128 rows, BLOCK_M 64 tokens, num_warps 8 (168 registers); BLOCK_M 128 (244 registers)
  when M is large enough that 128-token tiles still give at least one program per SM: it halves the
  E2M1 decode work per MAC, the main cost next to the tensor cores. Small N (the 32-row GDN
  projections) or small M shrink the tile to the next power of two (at least 16).
- MoE: BLOCK_M covers about twice the mean group size, 16..`MOE_BLOCK_M_MAX` (64 at T=1024, top-8, 256 experts:
  most experts fit one block, so each expert's weights are decoded about once per column block; below
  64 the dot is mma.sync). Kernel A: `MOE_GATE_UP_BLOCK_N` gate + as many up rows (two [BLOCK_M, n]
  accumulators; 64 by default, 128 on the H200 tuning file), kernel B: 128 H rows; num_warps 8 at BLOCK_M 64,
  else 4. H200, 1024 tokens, whole op (run27): 64-token blocks with 64 rows 522.2 us, 32-token blocks 492.3,
  64-token blocks with 128 rows 474.5, and with the one-step-ahead loads (`PREFETCH_MOE`) 466.8.
- float32 activations (IEEE FMA dots, no tensor cores; not the model's dtype): halved tiles.

Options the tuning file switches (each measured on the H200, `benchmarks/NOTES.md`, tenth session):
- `swap` (`SWAP_LINEAR` / `SWAP_MOE`): `W x^T` instead of `x W^T` (`_mma`), the tokens as the dot's N, which wgmma allows
  from 8, so a decode batch no longer pads M to 64 (run34: linears at 8..128 tokens 246.6 -> 232.3 us summed, on for
  the linears; the experts' 64-token tiles gained nothing, off).
- `fused` (`FUSE_GATE_UP`): the experts' gate/up launch as one dot over interleaved gate and up rows, split after
  (run37: 476 to 502 us against 475, off).
- decode 2 (`DECODE_MOE`): the experts' GEMMs decode straight into wgmma's register operand (`_register_products`;
  run36: 2.4 to 4.9 times slower, off).
- `gluon` (`GLUON_GATE_UP`, `GLUON_DOWN`): the experts' gate/up and down launches as the Gluon kernels of
  `moe_prefill_gluon` (the decoded weights as wgmma's register operand; `max_registers` / `GLUON_MAX_REGISTERS` caps
  their registers, `split_m` / `GLUON_SPLIT_M` runs blocks with few tokens in a narrower launch). run49: the whole
  experts op at 1024 tokens 378.7 us with both (64 tokens, 64 gate/up rows) against 475.8 for the Triton launches at
  the session's start; on in the H200 tuning file, with the 32-token class since run54 (run51: 377.9 -> 366.9 us).
- `gemm_tiled` (`TILED_SMALL_M`): decode batches read tile-major copies of the linears (`register_tiled_copies`, each
  K step's [BLOCK_N, BLOCK_KB] tile contiguous; `TILED` in `_w4a16_gemm_kernel`, same bits). run76 (H100): 1.14 to
  1.20x slower at 32 tokens, 0.95 to 1.00 at 8 and 64; off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from reference_engine.kernels.launch import (
    cdiv,
    finish,
    interpreting,
    next_power_of_2,
    require_launchable,
    staging_buffer,
    ticket_counters,
)

if TYPE_CHECKING:
    from reference_engine.ops.static_moe import StackedNvfp4Experts

_HALF_TO_E2M1 = 16384.0  # 2^14: the decoded operand is the E2M1 value times 2^-14
_SM_COUNT_DEFAULT = 132
_ACTIVATION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DOT_FLOAT32, DOT_BFLOAT16, DOT_FLOAT16 = 0, 1, 2


@dataclass(frozen=True)
class GemmPlan:
    """Tile of one launch: BLOCK_M tokens x BLOCK_N weight rows, K step 2 * block_kb elements."""

    block_m: int
    block_n: int
    block_kb: int  # packed bytes per weight row per K step (a multiple of 8: whole scale blocks)
    num_warps: int
    num_stages: int
    split_k: int = 1  # K slices reduced in the kernel (last ticket of a tile sums them in order)
    decode: int = -1  # weight decode: 0 bytes, 1 int32 words (see `_weight_tile_words`), 2 register operand (routed experts only, `_register_products`); -1: the module's `DECODE`
    prefetch: int = -1  # 1: the next K step's x tile and block scales loaded a step ahead; -1: the module's `PREFETCH_*`
    swap: int = -1  # 1: the weight tile is the dot's first operand (`_mma`); -1: the module's `SWAP_*`
    fused: int = -1  # routed experts' gate/up launch: 1 one dot over interleaved gate and up rows; -1: the module's `FUSE_GATE_UP`
    gluon: int = -1  # routed experts' launch of this plan: 1 its Gluon kernel where it applies (`_gluon_moe`); -1: the module's `GLUON_GATE_UP` / `GLUON_DOWN`
    max_registers: int = -1  # that Gluon launch's register cap (ptxas maxnreg; 0 none); -1: the module's `GLUON_MAX_REGISTERS`
    split_m: int = -1  # that Gluon launch: blocks of at most split_m tokens in a launch of that width (`_token_classes`; 0 none); -1: `GLUON_SPLIT_M`


DECODE = 0  # the weight decode of every plan that does not name one (the tuning file may set 1)
PREFETCH_LINEAR = 0  # `prefetch` of the linears' plans that do not name one (the tuning file may set 1)
PREFETCH_MOE = 0  # the same for the routed experts' two launches
SWAP_LINEAR = 0  # `swap` of the linears' plans that do not name one (the tuning file may set 1)
SWAP_MOE = 0  # the same for the routed experts' two launches
FUSE_GATE_UP = 0  # `fused` of the gate/up plans that do not name one (the tuning file may set 1)


def _decode(p: GemmPlan) -> int:
    return DECODE if p.decode < 0 else p.decode


def _prefetch(p: GemmPlan, moe: bool) -> int:
    if p.prefetch >= 0:
        return p.prefetch
    return PREFETCH_MOE if moe else PREFETCH_LINEAR


def _swap(p: GemmPlan, moe: bool) -> int:
    if p.swap >= 0:
        return p.swap
    return SWAP_MOE if moe else SWAP_LINEAR


def _packed_operand(packed: torch.Tensor, decode: int) -> torch.Tensor:
    """The packed codes as the kernel reads them: bytes, or int32 words (rows are whole words: K is a multiple of 16)."""
    return packed.view(torch.int32) if decode >= 1 else packed


def _pow2_between(value: int, low: int, high: int) -> int:
    return max(low, min(high, next_power_of_2(max(int(value), 1))))


def plan(kind: str, tokens: int, rows: int, k: int, sm_count: int = _SM_COUNT_DEFAULT, num_experts: int = 1, float32: bool = False) -> GemmPlan:
    """Tile sizes (see the module docstring) for `kind`:
    "linear" (tokens x rows x k), "moe_gate_up" (rows = I, k = H) or "moe_down" (rows = H, k = I);
    for the MoE kinds `tokens` is the number of (token, slot) pairs and both kinds get the same BLOCK_M.
    `float32`: float32 activations (IEEE FMA dots without tensor cores: smaller tiles, no spills)."""
    if kind not in ("linear", "moe_gate_up", "moe_down"):
        raise ValueError(f"plan kind must be 'linear', 'moe_gate_up' or 'moe_down', got {kind!r}")
    block_kb = _pow2_between(k, 16, 32 if float32 else 64) // 2  # K step 64 elements (32 for float32)
    if kind == "linear":
        if float32:
            return GemmPlan(_pow2_between(tokens, 16, 64), _pow2_between(rows, 16, 64), block_kb, 8, 3)
        if tokens <= SMALL_M_TOKENS:  # decode batches: narrower tiles and split-K, so the grid covers the SMs
            return _small_m_plan(tokens, rows, k, block_kb, sm_count)
        block_n = _pow2_between(rows, 16, 128)
        big = tokens >= 512 and cdiv(tokens, 128) * cdiv(rows, block_n) >= sm_count
        block_m = 128 if big else _pow2_between(tokens, 16, 64)
        return GemmPlan(block_m, block_n, block_kb, 8, 3)
    mean_group = cdiv(max(tokens, 1), max(num_experts, 1))
    block_m = _pow2_between(2 * mean_group, 16, min(MOE_BLOCK_M_MAX, 32 if float32 else 64))
    warps = 8 if block_m >= 64 else 4
    register = DECODE_MOE == 2 and not float32  # DECODE 2: 64-byte K steps, no pipelining stages (see `_register_products`)
    decode, stages, block_kb = (2, 1, 64) if register else (-1, 3, block_kb)
    if kind == "moe_gate_up":
        return GemmPlan(block_m, _pow2_between(rows, 16, 32 if float32 else MOE_GATE_UP_BLOCK_N), block_kb, warps, stages, decode=decode)
    return GemmPlan(block_m, _pow2_between(rows, 16, 64 if float32 else 128), block_kb, warps, stages, decode=decode)


DECODE_MOE = -1  # 2: the routed experts' prefill GEMMs decode into the register operand (`_register_products`); -1: `DECODE`
GLUON_GATE_UP = 0  # 1: the routed experts' gate/up launch runs `moe_prefill_gluon` where it applies (`_gluon_moe`; on in the H200 tuning file since run47)
GLUON_DOWN = 0  # the same for their down launch
GLUON_MAX_REGISTERS = 0  # both Gluon launches' register cap (ptxas maxnreg), 0: none
GLUON_SPLIT_M = 0  # both Gluon launches: blocks of at most this many tokens run a launch of that width, 0: one launch
MOE_BLOCK_M_MAX = 64  # the routed experts' largest token block (16, 32 or 64; the tuning file may lower it)
MOE_GATE_UP_BLOCK_N = 64  # gate rows (and as many up rows) per program of the routed experts' first launch (64 or 128)
SMALL_M_TOKENS = 64  # up to this many tokens a linear gets `_small_m_plan`
SMALL_M_TUNED: dict[tuple[int, int, int], tuple[int, int, int]] = {}  # (block_m, rows, k) -> (block_n, num_warps, split_k), from the tuning file
TILED_SMALL_M = False  # tuning key `gemm_tiled`: decode batches read tile-major copies of the linears (`register_tiled_copies`)


def small_m_tiles(rows: int, k: int, max_tokens: int) -> set[tuple[int, int]]:
    """The (rows, scale blocks per K step) tiles the decode-batch GEMM runs a [rows, k] bfloat16 linear with, for every
    token block from the GEMM's first batch up to `max_tokens` (`_small_m_plan`, tuned entries included)."""
    from reference_engine.kernels.nvfp4_gemv import GEMM_MIN_TOKENS

    tiles = set()
    for tokens in range(max(1, GEMM_MIN_TOKENS), min(max_tokens, SMALL_M_TOKENS) + 1):
        p = plan("linear", tokens, rows, k)
        tiles.add((p.block_n, p.block_kb // 8))
    return tiles


def register_tiled_copies(weight_packed: torch.Tensor, weight_scale: torch.Tensor, max_tokens: int) -> int:
    """Tile-major copies of one NVFP4 linear for the decode-batch GEMM's tiles up to `max_tokens` (`small_m_tiles`),
    kept with the GEMV's (`nvfp4_gemv.register_tiled_copy`, freed with the weight). Returns the bytes added."""
    from reference_engine.kernels.nvfp4_gemv import register_tiled_copy

    rows, k_bytes = weight_packed.shape
    return sum(register_tiled_copy(weight_packed, weight_scale, tile) for tile in sorted(small_m_tiles(rows, 2 * k_bytes, max_tokens)))


def _token_classes(p: GemmPlan) -> list[tuple[int, int]]:
    """(BLOCK_M, ROWS_ABOVE) of each Gluon launch over the plan's block table (`moe_prefill_gluon._takes_block`): one
    launch of block_m tokens, or with `split_m` (else `GLUON_SPLIT_M`) below block_m, a split_m-wide launch for the
    blocks holding at most split_m tokens and a block_m-wide one for the rest (less MMA padding: at 1024 tokens an
    expert gets about 32 pairs)."""
    split = GLUON_SPLIT_M if p.split_m < 0 else p.split_m
    if 0 < split < p.block_m:
        return [(split, 0), (p.block_m, split)]
    return [(p.block_m, 0)]


def _register_cap(p: GemmPlan) -> dict:
    """The launch option capping a Gluon launch's registers per thread, if any (`max_registers`, else `GLUON_MAX_REGISTERS`)."""
    cap = GLUON_MAX_REGISTERS if p.max_registers < 0 else p.max_registers
    return {"maxnreg": cap} if cap > 0 else {}


def _small_m_plan(tokens: int, rows: int, k: int, block_kb: int, sm_count: int) -> GemmPlan:
    """A decode batch (<= SMALL_M_TOKENS tokens) through the tensor-core GEMM: one token block, 64-row weight
    tiles, and K split in powers of two until the grid holds two programs per SM (each slice keeps at least
    4 K steps); a tuned entry for the shape wins."""
    block_m = _pow2_between(tokens, 16, 64)
    tuned = SMALL_M_TUNED.get((block_m, rows, k))
    if tuned is not None:
        block_n, warps, split = tuned
        return GemmPlan(block_m, block_n, block_kb, warps, 3, split)
    block_n = _pow2_between(rows, 16, 64)
    programs = cdiv(tokens, block_m) * cdiv(rows, block_n)
    steps = cdiv(k, 2 * block_kb)
    split = 1
    while programs * split < 2 * sm_count and split < 16 and steps >= 8 * split:
        split *= 2
    return GemmPlan(block_m, block_n, block_kb, 4, 3, split)


def _gluon_moe(a: torch.Tensor, p: GemmPlan, register: bool, k: int, switch: int) -> bool:
    """Whether one of the experts' launches runs its Gluon kernel (`moe_prefill_gluon`, the decoded weights as wgmma's
    register operand): switched on (`p.gluon`, else `switch`: `GLUON_GATE_UP` or `GLUON_DOWN`), its activation `a`
    [rows, k] bfloat16 on CUDA with unit column stride and 16-byte aligned rows, not decode 2, 32- or 64-token blocks,
    64 or 128 weight rows per program (`block_n`; the launch takes block_n / 16 warps, whatever `num_warps`, and
    `num_stages` (at least 2) shared-memory stages), k a multiple of 128."""
    return bool(
        (switch if p.gluon < 0 else p.gluon) and a.is_cuda and not interpreting() and a.dtype == torch.bfloat16 and not register
        and p.block_m in (32, 64) and p.block_n in (64, 128) and k % 128 == 0
        and a.stride(1) == 1 and a.stride(0) % 8 == 0 and a.storage_offset() % 8 == 0
    )


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNT_DEFAULT


def _dot_kind(dtype: torch.dtype) -> int:
    if interpreting() or dtype == torch.float32:
        return DOT_FLOAT32
    return DOT_BFLOAT16 if dtype == torch.bfloat16 else DOT_FLOAT16


@triton.jit
def _e2m1_times_2_pow_m14(codes):
    """uint8 codes 0..15 -> float16 holding the E2M1 value times 2^-14 (bit placement, no table)."""
    c = codes.to(tl.int16)
    return (((c & 7) << 9) | ((c & 8) << 12)).to(tl.float16, bitcast=True)


@triton.jit
def _to_dot(values, DOT_KIND: tl.constexpr):
    if DOT_KIND == 1:
        result = values.to(tl.bfloat16)
    elif DOT_KIND == 2:
        result = values.to(tl.float16)
    else:
        result = values.to(tl.float32)
    return result


@triton.jit
def _dot(a, b, acc, DOT_KIND: tl.constexpr):
    """acc + a [BM, BK] @ b [BK, BN], float32 accumulation (IEEE for float32 operands)."""
    if DOT_KIND == 0:
        result = tl.dot(a, b, acc, input_precision="ieee")
    else:
        result = tl.dot(a, b, acc)
    return result


@triton.jit
def _mma(x, w, acc, DOT_KIND: tl.constexpr, SWAP: tl.constexpr):
    """acc + x [BM, BK] @ w [BN, BK]^T; SWAP: acc [BN, BM] + w @ x^T instead (the decoded weight tile is the
    first operand, which wgmma reads from registers, and the tokens are the dot's N: see `_acc`)."""
    if SWAP:
        result = _dot(w, tl.trans(x), acc, DOT_KIND)
    else:
        result = _dot(x, tl.trans(w), acc, DOT_KIND)
    return result


@triton.jit
def _acc(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP: tl.constexpr):
    """A zero float32 accumulator: [BLOCK_M, BLOCK_N], or [BLOCK_N, BLOCK_M] when SWAP (`_mma`)."""
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    return acc


@triton.jit
def _unswap(acc, SWAP: tl.constexpr):
    """The accumulator as [BLOCK_M, BLOCK_N]."""
    if SWAP:
        acc = tl.trans(acc)
    return acc


@triton.jit
def _scale_tile(scale_ptr, rows, K_BYTES: tl.constexpr, byte0, BLOCK_KB: tl.constexpr, EVEN_K: tl.constexpr):
    """The E4M3 block scales [BLOCK_N, BLOCK_KB / 8] of rows `rows` for the K step at packed byte byte0 (zero past K)."""
    block_cols = byte0 // 8 + tl.arange(0, BLOCK_KB // 8)
    scale_ptrs = scale_ptr + rows[:, None] * (K_BYTES // 8) + block_cols[None, :]
    if EVEN_K:
        scale = tl.load(scale_ptrs)
    else:
        scale = tl.load(scale_ptrs, mask=(block_cols < K_BYTES // 8)[None, :], other=0.0)
    return scale


@triton.jit
def _weight_tile(packed_ptr, scale, rows, K_BYTES: tl.constexpr, byte0,
                 BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr, EVEN_K: tl.constexpr, DOT_KIND: tl.constexpr):
    """Rows `rows` [BLOCK_N] (int64, all valid) of an NVFP4 matrix, K elements 2*byte0 .. 2*(byte0+BLOCK_KB), with
    their block scales `scale` (`_scale_tile`) -> [BLOCK_N, 2 * BLOCK_KB] e2m1 * block_scale * 2^-14 in the dot
    dtype (zero past K)."""
    byte_cols = byte0 + tl.arange(0, BLOCK_KB)
    packed_ptrs = packed_ptr + rows[:, None] * K_BYTES + byte_cols[None, :]
    if EVEN_K:
        packed = tl.load(packed_ptrs)  # [BN, KB] uint8
    else:
        packed = tl.load(packed_ptrs, mask=(byte_cols < K_BYTES)[None, :], other=0)
    scale = scale.to(tl.float16)
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (BLOCK_N, BLOCK_KB // 8, 8)), (BLOCK_N, BLOCK_KB))
    low = _e2m1_times_2_pow_m14(packed & 0xF) * scale  # elements 2j   (exact in float16)
    high = _e2m1_times_2_pow_m14(packed >> 4) * scale  # elements 2j+1
    return _to_dot(tl.reshape(tl.join(low, high), (BLOCK_N, 2 * BLOCK_KB)), DOT_KIND)


# DECODE 1 (words): the packed codes are read as int32 words (8 codes, element 8w + j in bits 4j..4j+3) and
# decoded straight to bfloat16 pairs in PTX: a code's 3 magnitude bits placed at bits 6..8 of a bfloat16 and its
# sign at bit 15 are the E2M1 value times 2^-126 (0.5 becomes a bfloat16 subnormal, exact); one mul.rn.bf16x2 by
# the block scale times 2^119 (exact: 448 * 2^119 < the bfloat16 maximum) gives e2m1 * scale * 2^-7 exactly (at
# most 6 significant bits, far from both ends of the range). Pairs (j, j + 4) share one 32-bit register: the
# same shifts move nibble j of the low half and nibble j + 4 of the high half. About 2.5 instructions per weight,
# against about 11 for DECODE 0 (bytes, float16, converted to bfloat16; sm_90 SASS of the loop, 128 x 64 tiles).
WORD_SCALE_SHIFT = tl.constexpr(2.0**119)  # the block scale's factor in DECODE 1


def _bf16_pairs_asm() -> str:
    """PTX: int32 word $8 (8 codes) and bf16 scale $9 -> $0..$7 = codes (0, 4), (1, 5), (2, 6), (3, 7) as bf16,
    each pair from one register: magnitude bits of code j shifted to bits 6..8 (and 22..24 for code j + 4),
    sign bits to 15 and 31, then one mul.rn.bf16x2 by the scale."""
    lines = ["{", ".reg .b32 s2, m, g, v;", "mov.b32 s2, {$9, $9};"]
    for j in range(4):
        magnitude, sign = 6 - 4 * j, 12 - 4 * j  # left shifts (negative: right) for code j's bits 4j..4j+2 and 4j+3
        lines.append(f"shl.b32 m, $8, {magnitude};" if magnitude >= 0 else f"shr.b32 m, $8, {-magnitude};")
        lines.append(f"shl.b32 g, $8, {sign};")
        lines += ["and.b32 m, m, 0x01C001C0;", "and.b32 g, g, 0x80008000;", "or.b32 v, m, g;", "mul.rn.bf16x2 v, v, s2;", f"mov.b32 {{${2 * j}, ${2 * j + 1}}}, v;"]
    return "\n".join([*lines, "}"])


_BF16_PAIRS_ASM = tl.constexpr(_bf16_pairs_asm())


@triton.jit
def _code_times_scale(words, j: tl.constexpr, scale_f32):
    """Element j of each word as e2m1 * scale * 2^-7 in float32 (the portable form of the PTX decode)."""
    return _e2m1_times_2_pow_m14(((words >> (4 * j)) & 0xF).to(tl.uint8)).to(tl.float32) * (scale_f32 * 128.0)


@triton.jit
def _word_elements(words, scale, DOT_KIND: tl.constexpr, ASM: tl.constexpr):
    """int32 words [BN, KW] (8 codes each) and one float32 block scale per word -> 8 tiles [BN, KW] in the dot dtype,
    tile j holding code j of every word as e2m1 * scale * 2^-7 (PTX bfloat16 pairs when ASM, else the portable form)."""
    if ASM:
        e0, e4, e1, e5, e2, e6, e3, e7 = tl.inline_asm_elementwise(
            _BF16_PAIRS_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [words, (scale * WORD_SCALE_SHIFT).to(tl.bfloat16)],
            dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        e0, e1, e2, e3 = (_to_dot(_code_times_scale(words, 0, scale), DOT_KIND), _to_dot(_code_times_scale(words, 1, scale), DOT_KIND),
                          _to_dot(_code_times_scale(words, 2, scale), DOT_KIND), _to_dot(_code_times_scale(words, 3, scale), DOT_KIND))  # fmt: skip
        e4, e5, e6, e7 = (_to_dot(_code_times_scale(words, 4, scale), DOT_KIND), _to_dot(_code_times_scale(words, 5, scale), DOT_KIND),
                          _to_dot(_code_times_scale(words, 6, scale), DOT_KIND), _to_dot(_code_times_scale(words, 7, scale), DOT_KIND))  # fmt: skip
    return e0, e1, e2, e3, e4, e5, e6, e7


@triton.jit
def _weight_tile_words(words_ptr, scale, rows, K_BYTES: tl.constexpr, byte0,
                       BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr, EVEN_K: tl.constexpr, DOT_KIND: tl.constexpr, ASM: tl.constexpr):
    """`_weight_tile` reading int32 words: the same [BLOCK_N, 2 * BLOCK_KB] tile as e2m1 * block_scale * 2^-7."""
    KW: tl.constexpr = BLOCK_KB // 4
    word_cols = byte0 // 4 + tl.arange(0, KW)
    word_ptrs = words_ptr + rows[:, None] * (K_BYTES // 4) + word_cols[None, :]
    if EVEN_K:
        words = tl.load(word_ptrs)  # [BN, KW] int32
    else:
        words = tl.load(word_ptrs, mask=(word_cols < K_BYTES // 4)[None, :], other=0)
    scale = tl.reshape(tl.broadcast_to(scale.to(tl.float32)[:, :, None], (BLOCK_N, BLOCK_KB // 8, 2)), (BLOCK_N, KW))  # one per word
    e0, e1, e2, e3, e4, e5, e6, e7 = _word_elements(words, scale, DOT_KIND, ASM)
    # each join adds an innermost axis, so joining on bit 2 of j first, then bit 1, then bit 0 flattens to j
    pairs = tl.join(tl.join(tl.join(e0, e4), tl.join(e2, e6)), tl.join(tl.join(e1, e5), tl.join(e3, e7)))  # [BN, KW, 2, 2, 2]
    return tl.reshape(pairs, (BLOCK_N, 2 * BLOCK_KB))


# DECODE 2 (register operand; the routed experts' prefill GEMMs): each K step covers 128 elements, 16 int32 words per
# weight row, and splits into 8 dots of K 16, dot j taking code j of every word (element 8w + j of the step) against
# columns 16j .. 16j + 15 of the step in a K-permuted x (`permute_k`: column 16j + w holds element 8w + j). No tile is
# interleaved back into K order, so Triton (3.6, loops without pipelining stages) decodes straight into wgmma's
# register operand layout (weights first, tokens as N): only the code words and block scales pass through shared
# memory, against the whole decoded bfloat16 tile for DECODE 0 and 1 (run35: ncu had the 1024-token gate/up launch at
# 73% shared-memory/L1 busy and 25% DRAM). Same products, another summation order. Measured slower (run36, H200, 1024
# tokens, whole op: 1155 to 2332 us against 476): without pipelining stages every K step waits for its loads, and a
# by-hand prefetch of the next words (loop-carried registers) sends the decoded tiles back through shared memory.
# Kept as a tuning option (`gemm_decode_moe`, off) for a Triton that pipelines into register layouts.
REGISTER_K_WORDS = tl.constexpr(16)  # int32 words per weight row and K step in DECODE 2 (128 elements)


def permute_k(x: torch.Tensor) -> torch.Tensor:
    """x [T, K] (K a multiple of 128) -> a K-permuted copy for DECODE 2: in every block of 128 columns, column
    16j + w holds column 8w + j."""
    tokens, k = x.shape
    return x.reshape(tokens, k // 128, 16, 8).transpose(2, 3).reshape(tokens, k)


@triton.jit
def _permuted_columns(cols):
    """Natural column indices -> their positions in the K-permuted layout of `permute_k`."""
    return (cols // 128) * 128 + (cols % 8) * 16 + (cols % 128) // 8


@triton.jit
def _word_codes(words_ptr, scale_ptr, rows, K_BYTES: tl.constexpr, byte0, DOT_KIND: tl.constexpr, ASM: tl.constexpr):
    """Rows `rows` [BN], the REGISTER_K_WORDS words from packed byte byte0: 8 tiles [BN, KW] in the dot dtype, tile j
    holding code j of every word (e2m1 * block_scale * 2^-7, as `_weight_tile_words`)."""
    KW: tl.constexpr = REGISTER_K_WORDS
    word_cols = byte0 // 4 + tl.arange(0, KW)
    words = tl.load(words_ptr + rows[:, None] * (K_BYTES // 4) + word_cols[None, :])  # [BN, KW] int32
    scale = tl.load(scale_ptr + rows[:, None] * (K_BYTES // 8) + (word_cols // 2)[None, :]).to(tl.float32)  # two words per block
    return _word_elements(words, scale, DOT_KIND, ASM)


@triton.jit
def _x_slice(x_ptr, row_offsets, byte0, J: tl.constexpr, DOT_KIND: tl.constexpr):
    """[BM, KW]: columns 2 * byte0 + 16J .. + 15 of the K-permuted rows at element offsets row_offsets."""
    KW: tl.constexpr = REGISTER_K_WORDS
    cols = 2 * byte0 + J * KW + tl.arange(0, KW)
    return _to_dot(tl.load(x_ptr + row_offsets[:, None] + cols[None, :]), DOT_KIND)


@triton.jit
def _codes_dot(acc, x_ptr, x_rows, byte0, e0, e1, e2, e3, e4, e5, e6, e7, DOT_KIND: tl.constexpr):
    """acc [BN, BM] + the 8 code tiles times their x slices (transposed)."""
    acc = _dot(e0, tl.trans(_x_slice(x_ptr, x_rows, byte0, 0, DOT_KIND)), acc, DOT_KIND)
    acc = _dot(e1, tl.trans(_x_slice(x_ptr, x_rows, byte0, 1, DOT_KIND)), acc, DOT_KIND)
    acc = _dot(e2, tl.trans(_x_slice(x_ptr, x_rows, byte0, 2, DOT_KIND)), acc, DOT_KIND)
    acc = _dot(e3, tl.trans(_x_slice(x_ptr, x_rows, byte0, 3, DOT_KIND)), acc, DOT_KIND)
    acc = _dot(e4, tl.trans(_x_slice(x_ptr, x_rows, byte0, 4, DOT_KIND)), acc, DOT_KIND)
    acc = _dot(e5, tl.trans(_x_slice(x_ptr, x_rows, byte0, 5, DOT_KIND)), acc, DOT_KIND)
    acc = _dot(e6, tl.trans(_x_slice(x_ptr, x_rows, byte0, 6, DOT_KIND)), acc, DOT_KIND)
    return _dot(e7, tl.trans(_x_slice(x_ptr, x_rows, byte0, 7, DOT_KIND)), acc, DOT_KIND)


@triton.jit
def _register_products(x_ptr, x_rows, w_ptr, s_ptr, rows_a, rows_b, K_BYTES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       DOT_KIND: tl.constexpr, TWO: tl.constexpr):
    """DECODE 2: [BLOCK_M, BLOCK_N] float32 products of the K-permuted x rows with the NVFP4 rows rows_a (and rows_b
    when TWO, sharing the x slices), before the tensor scales; K a multiple of 128."""
    ASM: tl.constexpr = DOT_KIND == 1
    acc_a = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for byte0 in range(0, K_BYTES, 4 * REGISTER_K_WORDS):
        a0, a1, a2, a3, a4, a5, a6, a7 = _word_codes(w_ptr, s_ptr, rows_a, K_BYTES, byte0, DOT_KIND, ASM)
        acc_a = _codes_dot(acc_a, x_ptr, x_rows, byte0, a0, a1, a2, a3, a4, a5, a6, a7, DOT_KIND)
        if TWO:
            b0, b1, b2, b3, b4, b5, b6, b7 = _word_codes(w_ptr, s_ptr, rows_b, K_BYTES, byte0, DOT_KIND, ASM)
            acc_b = _codes_dot(acc_b, x_ptr, x_rows, byte0, b0, b1, b2, b3, b4, b5, b6, b7, DOT_KIND)
    return tl.trans(acc_a), tl.trans(acc_b)


@triton.jit
def _tile(packed_ptr, scale_ptr, rows, K_BYTES: tl.constexpr, byte0,
          BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr, EVEN_K: tl.constexpr, DOT_KIND: tl.constexpr, DECODE: tl.constexpr):
    """The weight tile in DECODE 0 (bytes, float16 products: e2m1 * scale * 2^-14) or 1 (words: e2m1 * scale * 2^-7)."""
    scale = _scale_tile(scale_ptr, rows, K_BYTES, byte0, BLOCK_KB, EVEN_K)
    return _scaled_tile(packed_ptr, scale, rows, K_BYTES, byte0, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE)


@triton.jit
def _scaled_tile(packed_ptr, scale, rows, K_BYTES: tl.constexpr, byte0,
                 BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr, EVEN_K: tl.constexpr, DOT_KIND: tl.constexpr, DECODE: tl.constexpr):
    """`_tile` with its block scales already loaded (`_scale_tile`)."""
    if DECODE == 1:
        tile = _weight_tile_words(packed_ptr, scale, rows, K_BYTES, byte0, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DOT_KIND == 1)
    else:
        tile = _weight_tile(packed_ptr, scale, rows, K_BYTES, byte0, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND)
    return tile


@triton.jit
def _x_tile(x_ptr, row_offsets, K_BYTES: tl.constexpr, byte0, BLOCK_KB: tl.constexpr, EVEN_K: tl.constexpr, DOT_KIND: tl.constexpr):
    """x rows at element offsets row_offsets [BM] (int64), elements 2*byte0 .. 2*(byte0+BLOCK_KB) -> dot dtype."""
    cols = 2 * byte0 + tl.arange(0, 2 * BLOCK_KB)
    ptrs = x_ptr + row_offsets[:, None] + cols[None, :]
    if EVEN_K:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=(cols < 2 * K_BYTES)[None, :], other=0.0)
    return _to_dot(x, DOT_KIND)


@triton.jit
def _step_scales(scale_ptr, w_rows, pid_n, K_BYTES: tl.constexpr, byte0, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr,
                 EVEN_K: tl.constexpr, TILED: tl.constexpr):
    """The K step's block scales of the program's rows: `_scale_tile` of the row-major scales, or (TILED) the step's
    contiguous [BLOCK_N, BLOCK_KB / 8] tile of the tile-major copy, read as a row-major matrix BLOCK_KB / 8 wide."""
    if TILED:
        tile = pid_n.to(tl.int64) * (K_BYTES // BLOCK_KB) + byte0 // BLOCK_KB
        local = tl.arange(0, BLOCK_N).to(tl.int64)
        return _scale_tile(scale_ptr + tile * (BLOCK_N * (BLOCK_KB // 8)), local, BLOCK_KB, 0, BLOCK_KB, True)
    return _scale_tile(scale_ptr, w_rows, K_BYTES, byte0, BLOCK_KB, EVEN_K)


@triton.jit
def _step_weights(packed_ptr, scale, w_rows, pid_n, K_BYTES: tl.constexpr, byte0, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr,
                  EVEN_K: tl.constexpr, DOT_KIND: tl.constexpr, DECODE: tl.constexpr, TILED: tl.constexpr):
    """The K step's decoded weight tile (`_scaled_tile`), from the row-major codes or (TILED) from the step's contiguous
    [BLOCK_N, BLOCK_KB] tile of the tile-major copy (bytes, or int32 words with DECODE 1)."""
    if TILED:
        UNIT: tl.constexpr = 4 if DECODE == 1 else 1  # bytes per element of packed_ptr
        tile = pid_n.to(tl.int64) * (K_BYTES // BLOCK_KB) + byte0 // BLOCK_KB
        local = tl.arange(0, BLOCK_N).to(tl.int64)
        return _scaled_tile(packed_ptr + tile * (BLOCK_N * BLOCK_KB // UNIT), scale, local, BLOCK_KB, 0, BLOCK_N, BLOCK_KB, True, DOT_KIND, DECODE)
    return _scaled_tile(packed_ptr, scale, w_rows, K_BYTES, byte0, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE)


@triton.jit
def _w4a16_gemm_kernel(
    x_ptr, packed_ptr, scale_ptr, scale_2_ptr, out_ptr, workspace_ptr, counter_ptr,
    M, N, stride_xm, stride_om,
    K_BYTES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr,
    EVEN_K: tl.constexpr, ROW_SCALES: tl.constexpr, DOT_KIND: tl.constexpr, SPLIT_K: tl.constexpr, SPLIT_BYTES: tl.constexpr,
    DECODE: tl.constexpr = 0, PREFETCH: tl.constexpr = 0, SWAP: tl.constexpr = 0, TILED: tl.constexpr = 0,
):
    """TILED: packed_ptr and scale_ptr are a tile-major copy (`tiled_gemm_weight`) for (BLOCK_N, BLOCK_KB); the launch
    guarantees whole row tiles and K steps."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    tokens = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    x_rows = tl.minimum(tokens, M - 1).to(tl.int64) * stride_xm  # clamped: loads need no mask
    w_rows = tl.minimum(rows, N - 1).to(tl.int64)
    acc = _acc(BLOCK_M, BLOCK_N, SWAP)
    if PREFETCH:  # x and the block scales of the next K step loaded before this step's decode and dot
        LAST: tl.constexpr = (SPLIT_BYTES - 1) // BLOCK_KB * BLOCK_KB  # the slice's last step (SPLIT_BYTES = K_BYTES without split-K)
        x_next = _x_tile(x_ptr, x_rows, K_BYTES, pid_k * SPLIT_BYTES, BLOCK_KB, EVEN_K, DOT_KIND)
        s_next = _step_scales(scale_ptr, w_rows, pid_n, K_BYTES, pid_k * SPLIT_BYTES, BLOCK_N, BLOCK_KB, EVEN_K, TILED)
        for step in range(0, SPLIT_BYTES, BLOCK_KB):
            byte0 = tl.multiple_of(pid_k * SPLIT_BYTES + step, BLOCK_KB)
            ahead = tl.multiple_of(pid_k * SPLIT_BYTES + tl.minimum(step + BLOCK_KB, LAST), BLOCK_KB)  # the last step reloads itself
            x, s = x_next, s_next
            x_next = _x_tile(x_ptr, x_rows, K_BYTES, ahead, BLOCK_KB, EVEN_K, DOT_KIND)
            s_next = _step_scales(scale_ptr, w_rows, pid_n, K_BYTES, ahead, BLOCK_N, BLOCK_KB, EVEN_K, TILED)
            w = _step_weights(packed_ptr, s, w_rows, pid_n, K_BYTES, byte0, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE, TILED)
            acc = _mma(x, w, acc, DOT_KIND, SWAP)
    else:
        for step in range(0, SPLIT_BYTES, BLOCK_KB):  # this program's K slice (all of K without split-K)
            byte0 = tl.multiple_of(pid_k * SPLIT_BYTES + step, BLOCK_KB)
            x = _x_tile(x_ptr, x_rows, K_BYTES, byte0, BLOCK_KB, EVEN_K, DOT_KIND)
            s = _step_scales(scale_ptr, w_rows, pid_n, K_BYTES, byte0, BLOCK_N, BLOCK_KB, EVEN_K, TILED)
            w = _step_weights(packed_ptr, s, w_rows, pid_n, K_BYTES, byte0, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE, TILED)
            acc = _mma(x, w, acc, DOT_KIND, SWAP)
    acc = _unswap(acc, SWAP)
    in_range = (tokens < M)[:, None] & (rows < N)[None, :]
    if SPLIT_K > 1:  # partial sums to a float32 workspace; the program drawing the tile's last ticket adds them in split order
        tile = pid_m * tl.num_programs(1) + pid_n
        local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tile_base = tile.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
        tl.store(workspace_ptr + tile_base + pid_k * (BLOCK_M * BLOCK_N) + local, acc)
        tl.debug_barrier()  # every thread's partial is stored before the ticket is taken (release, GPU scope)
        ticket = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for split in range(SPLIT_K):
                acc += tl.load(workspace_ptr + tile_base + split * (BLOCK_M * BLOCK_N) + local, cache_modifier=".cg")
            _gemm_store(acc, scale_2_ptr, w_rows, out_ptr, tokens, rows, stride_om, in_range, ROW_SCALES, DECODE)
            tl.store(counter_ptr + tile, 0)
    else:
        _gemm_store(acc, scale_2_ptr, w_rows, out_ptr, tokens, rows, stride_om, in_range, ROW_SCALES, DECODE)


@triton.jit
def _gemm_store(acc, scale_2_ptr, w_rows, out_ptr, tokens, rows, stride_om, in_range, ROW_SCALES: tl.constexpr, DECODE: tl.constexpr):
    """acc times the tensor scale(s) and the operand's power of two (2^14 or 2^7), rounded into out[tokens, rows] where in range."""
    undo: tl.constexpr = 128.0 if DECODE == 1 else 16384.0
    if ROW_SCALES:
        acc = acc * (tl.load(scale_2_ptr + w_rows) * undo)[None, :]
    else:
        acc = acc * (tl.load(scale_2_ptr) * undo)
    out_ptrs = out_ptr + tokens[:, None].to(tl.int64) * stride_om + rows[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=in_range)


def _check_gemm(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, scale_2: torch.Tensor, out: torch.Tensor) -> None:
    if x.dim() != 2 or x.dtype not in _ACTIVATION_DTYPES:
        raise ValueError(f"x must be [M, K] float32, bfloat16 or float16, got {tuple(x.shape)} {x.dtype}")
    if weight_packed.dim() != 2 or weight_packed.dtype != torch.uint8 or weight_packed.shape[1] * 2 != x.shape[1]:
        raise ValueError(f"weight_packed must be uint8 [N, K/2] with K = {x.shape[1]}, got {tuple(weight_packed.shape)} {weight_packed.dtype}")
    if x.shape[1] % 16:
        raise ValueError(f"K must be a multiple of 16, got {x.shape[1]}")
    rows = weight_packed.shape[0]
    if weight_scale.dtype != torch.float8_e4m3fn or tuple(weight_scale.shape) != (rows, x.shape[1] // 16):
        raise ValueError(f"weight_scale must be float8_e4m3fn [{rows}, {x.shape[1] // 16}], got {tuple(weight_scale.shape)} {weight_scale.dtype}")
    if scale_2.numel() not in (1, rows) or (scale_2.numel() == rows and rows > 1 and scale_2.dim() != 1):
        raise ValueError(f"scale_2 must be one value or float32 [{rows}] (one per row), got shape {tuple(scale_2.shape)}")
    if tuple(out.shape) != (x.shape[0], rows) or out.dtype != x.dtype:
        raise ValueError(f"out must be {x.dtype} [{x.shape[0]}, {rows}], got {out.dtype} {tuple(out.shape)}")


def w4a16_gemm(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, scale_2, out: torch.Tensor, gemm_plan: GemmPlan | None = None,
               tiled: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:  # fmt: skip
    """`out [M, N] = x [M, K] @ W^T`, W [N, K] NVFP4 (`weight_packed [N, K/2]` uint8, `weight_scale [N, K/16]`
    float8_e4m3fn, `scale_2` one value or float32 [N] per row), float32 accumulation, in x's dtype.
    `gemm_plan`: tile sizes other than `plan("linear", ...)` (benchmarks and tests). `tiled`: (words, scales) of a
    tile-major copy for the plan's (block_n, block_kb / 8) (`nvfp4_gemv.tiled_gemv_weight`), read instead of the
    row-major weight (the same bits out); without it a decode batch reads the copy registered for this very weight
    when `TILED_SMALL_M` is on (`register_tiled_copies`)."""
    scale_2 = torch.as_tensor(scale_2, dtype=torch.float32, device=x.device)
    _check_gemm(x, weight_packed, weight_scale, scale_2, out)
    require_launchable(x, weight_packed, weight_scale, scale_2, out)
    tokens, rows, k_bytes = x.shape[0], weight_packed.shape[0], weight_packed.shape[1]
    if tokens == 0 or rows == 0:
        return out
    x = x if x.stride(1) == 1 else x.contiguous()
    packed, scale = weight_packed.contiguous(), weight_scale.contiguous()
    row_scales = scale_2.numel() == rows and rows > 1
    scale_2 = scale_2.reshape(-1).contiguous()
    buffer = staging_buffer(out)
    target = buffer if buffer.stride(1) == 1 else torch.empty(buffer.shape, dtype=buffer.dtype, device=buffer.device)
    p = gemm_plan if gemm_plan is not None else plan("linear", tokens, rows, 2 * k_bytes, _sm_count(x.device), float32=x.dtype == torch.float32)
    grid = (cdiv(tokens, p.block_m), cdiv(rows, p.block_n), p.split_k)
    split_bytes = k_bytes
    workspace, counters = target, target  # unused without split-K
    if p.split_k > 1:
        split_bytes = cdiv(cdiv(k_bytes, p.split_k), p.block_kb) * p.block_kb
        if split_bytes * (p.split_k - 1) >= k_bytes:
            raise ValueError(f"split_k {p.split_k} leaves an empty K slice (K = {2 * k_bytes}, K step {2 * p.block_kb})")
        tiles = grid[0] * grid[1]
        workspace = torch.empty(tiles * p.split_k * p.block_m * p.block_n, dtype=torch.float32, device=x.device)
        counters = ticket_counters(x.device, tiles)
    even_k = k_bytes % p.block_kb == 0 and split_bytes * p.split_k == k_bytes
    decode = _decode(p)
    if decode not in (0, 1):
        raise ValueError(f"the linear GEMM decodes bytes (0) or words (1), got decode {decode}")
    whole_tiles = even_k and rows % p.block_n == 0 and p.block_kb % 8 == 0
    if tiled is None and TILED_SMALL_M and tokens <= SMALL_M_TOKENS and whole_tiles:
        from reference_engine.kernels.nvfp4_gemv import tiled_copy

        tiled = tiled_copy(weight_packed, p.block_n, p.block_kb // 8)
    if tiled is not None and (not whole_tiles or tiled[0].numel() * 8 != rows * k_bytes):
        raise ValueError(f"a tile-major GEMM copy needs whole tiles: N={rows} by {p.block_n} rows, {k_bytes} bytes a row by {p.block_kb} "
                         f"without a ragged K slice, and {rows * k_bytes // 8} words (got {tiled[0].numel()})")  # fmt: skip
    if tiled is not None:
        packed, scale = tiled[0].view(torch.uint8), tiled[1]
    _w4a16_gemm_kernel[grid](
        x, _packed_operand(packed, decode), scale, scale_2, target, workspace, counters, tokens, rows, x.stride(0), target.stride(0),
        K_BYTES=k_bytes, BLOCK_M=p.block_m, BLOCK_N=p.block_n, BLOCK_KB=p.block_kb, EVEN_K=even_k,
        ROW_SCALES=row_scales, DOT_KIND=_dot_kind(x.dtype), SPLIT_K=p.split_k, SPLIT_BYTES=split_bytes, DECODE=decode,
        PREFETCH=_prefetch(p, moe=False), SWAP=_swap(p, moe=False), TILED=int(tiled is not None), num_warps=p.num_warps, num_stages=p.num_stages,
    )
    if target is not buffer:
        buffer.copy_(target)
    finish(buffer, out)
    return out


@triton.jit
def _gate_up_products(x_ptr, x_rows, w_ptr, s_ptr, gate_rows, up_rows, K_BYTES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_KB: tl.constexpr, EVEN_K: tl.constexpr, DOT_KIND: tl.constexpr, DECODE: tl.constexpr, PREFETCH: tl.constexpr, SWAP: tl.constexpr = 0):
    """(gate, up) [BLOCK_M, BLOCK_N] float32 accumulators: x rows at element offsets x_rows [BM] times the NVFP4
    gate rows and the matching up rows (one x tile per K step for both), before the tensor scales. PREFETCH: the
    next step's x tile and block scales are loaded before this step's decode and dots (Triton 3.6 pipelines the
    code words through shared memory but leaves the gathered x rows and the one-byte scales as plain loads). The
    same values; bit-identical under the interpreter and on wgmma (64-token blocks), but on the H200 the mma.sync
    tiles (16 and 32 tokens) and the linears differ in the last bits (run26: relative 2e-4, summation order).
    Measured slower alone (run26, `benchmarks/NOTES.md`); a tuning knob, off by default."""
    acc_gate = _acc(BLOCK_M, BLOCK_N, SWAP)
    acc_up = _acc(BLOCK_M, BLOCK_N, SWAP)
    if PREFETCH:
        LAST: tl.constexpr = (K_BYTES - 1) // BLOCK_KB * BLOCK_KB  # the last step's first byte
        x_next = _x_tile(x_ptr, x_rows, K_BYTES, 0, BLOCK_KB, EVEN_K, DOT_KIND)
        gate_next = _scale_tile(s_ptr, gate_rows, K_BYTES, 0, BLOCK_KB, EVEN_K)
        up_next = _scale_tile(s_ptr, up_rows, K_BYTES, 0, BLOCK_KB, EVEN_K)
        for byte0 in range(0, K_BYTES, BLOCK_KB):
            ahead = tl.multiple_of(tl.minimum(byte0 + BLOCK_KB, LAST), BLOCK_KB)  # the last step reloads itself
            x, s_gate, s_up = x_next, gate_next, up_next
            x_next = _x_tile(x_ptr, x_rows, K_BYTES, ahead, BLOCK_KB, EVEN_K, DOT_KIND)
            gate_next = _scale_tile(s_ptr, gate_rows, K_BYTES, ahead, BLOCK_KB, EVEN_K)
            up_next = _scale_tile(s_ptr, up_rows, K_BYTES, ahead, BLOCK_KB, EVEN_K)
            w_gate = _scaled_tile(w_ptr, s_gate, gate_rows, K_BYTES, byte0, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE)
            acc_gate = _mma(x, w_gate, acc_gate, DOT_KIND, SWAP)
            w_up = _scaled_tile(w_ptr, s_up, up_rows, K_BYTES, byte0, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE)
            acc_up = _mma(x, w_up, acc_up, DOT_KIND, SWAP)
    else:
        for byte0 in range(0, K_BYTES, BLOCK_KB):
            x = _x_tile(x_ptr, x_rows, K_BYTES, byte0, BLOCK_KB, EVEN_K, DOT_KIND)
            w_gate = _tile(w_ptr, s_ptr, gate_rows, K_BYTES, byte0, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE)
            acc_gate = _mma(x, w_gate, acc_gate, DOT_KIND, SWAP)
            w_up = _tile(w_ptr, s_ptr, up_rows, K_BYTES, byte0, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE)
            acc_up = _mma(x, w_up, acc_up, DOT_KIND, SWAP)
    return _unswap(acc_gate, SWAP), _unswap(acc_up, SWAP)


@triton.jit
def _rows_products(a_ptr, a_rows, w_ptr, s_ptr, w_rows, K_BYTES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_KB: tl.constexpr, EVEN_K: tl.constexpr, DOT_KIND: tl.constexpr, DECODE: tl.constexpr, PREFETCH: tl.constexpr, SWAP: tl.constexpr = 0):
    """[BLOCK_M, BLOCK_N] float32: rows of `a` at element offsets a_rows [BM] times NVFP4 rows w_rows, over all of K
    (PREFETCH as `_gate_up_products`)."""
    acc = _acc(BLOCK_M, BLOCK_N, SWAP)
    if PREFETCH:
        LAST: tl.constexpr = (K_BYTES - 1) // BLOCK_KB * BLOCK_KB
        a_next = _x_tile(a_ptr, a_rows, K_BYTES, 0, BLOCK_KB, EVEN_K, DOT_KIND)
        s_next = _scale_tile(s_ptr, w_rows, K_BYTES, 0, BLOCK_KB, EVEN_K)
        for byte0 in range(0, K_BYTES, BLOCK_KB):
            ahead = tl.multiple_of(tl.minimum(byte0 + BLOCK_KB, LAST), BLOCK_KB)
            a, s = a_next, s_next
            a_next = _x_tile(a_ptr, a_rows, K_BYTES, ahead, BLOCK_KB, EVEN_K, DOT_KIND)
            s_next = _scale_tile(s_ptr, w_rows, K_BYTES, ahead, BLOCK_KB, EVEN_K)
            w = _scaled_tile(w_ptr, s, w_rows, K_BYTES, byte0, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE)
            acc = _mma(a, w, acc, DOT_KIND, SWAP)
    else:
        for byte0 in range(0, K_BYTES, BLOCK_KB):
            a = _x_tile(a_ptr, a_rows, K_BYTES, byte0, BLOCK_KB, EVEN_K, DOT_KIND)
            w = _tile(w_ptr, s_ptr, w_rows, K_BYTES, byte0, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE)
            acc = _mma(a, w, acc, DOT_KIND, SWAP)
    return _unswap(acc, SWAP)


@triton.jit
def _block_rows(blocks_ptr, block, MAX_BLOCKS, BLOCK_M: tl.constexpr):
    """Block table [3, MAX_BLOCKS] int32 (expert, first sorted position, end of the expert's group) ->
    (expert, positions [BLOCK_M], valid [BLOCK_M], clamped positions for unmasked loads)."""
    expert = tl.load(blocks_ptr + block)
    first = tl.load(blocks_ptr + MAX_BLOCKS + block)
    end = tl.load(blocks_ptr + 2 * MAX_BLOCKS + block)
    positions = first + tl.arange(0, BLOCK_M)
    valid = positions < end
    return expert, positions, valid, tl.minimum(positions, end - 1)


@triton.jit
def _moe_gate_up_kernel(
    x_ptr, order_ptr, blocks_ptr, packed_ptr, scale_ptr, scale_2_ptr, act_ptr,
    MAX_BLOCKS, stride_xm,
    I: tl.constexpr, H_BYTES: tl.constexpr, TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr, EVEN_K: tl.constexpr, DOT_KIND: tl.constexpr,
    DECODE: tl.constexpr = 0, PREFETCH: tl.constexpr = 0, SWAP: tl.constexpr = 0, FUSED: tl.constexpr = 0,
):
    block = tl.program_id(0)
    expert, positions, valid, safe = _block_rows(blocks_ptr, block, MAX_BLOCKS, BLOCK_M)
    if expert < 0:  # past the real block count
        return
    tokens = tl.load(order_ptr + safe) // TOP_K  # [BM] token of each sorted pair
    x_rows = tokens.to(tl.int64) * stride_xm
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    gate_rows = expert.to(tl.int64) * (2 * I) + tl.minimum(cols, I - 1)
    up_rows = gate_rows + I
    if DECODE == 2:  # x K-permuted; the activation is written K-permuted for the down launch
        acc_gate, acc_up = _register_products(x_ptr, x_rows, packed_ptr, scale_ptr, gate_rows, up_rows, H_BYTES, BLOCK_M, BLOCK_N, DOT_KIND, True)
        act_cols = _permuted_columns(cols)
    elif FUSED:  # one [BM, 2 BN] dot over gate and up rows interleaved (each x tile read once per warpgroup, not twice)
        pair = tl.arange(0, 2 * BLOCK_N)
        rows = expert.to(tl.int64) * (2 * I) + (pair % 2) * I + tl.minimum(tl.program_id(1) * BLOCK_N + pair // 2, I - 1)
        acc = _rows_products(x_ptr, x_rows, packed_ptr, scale_ptr, rows, H_BYTES, BLOCK_M, 2 * BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE, PREFETCH, SWAP)
        acc_gate, acc_up = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
        act_cols = cols
    else:
        acc_gate, acc_up = _gate_up_products(x_ptr, x_rows, packed_ptr, scale_ptr, gate_rows, up_rows, H_BYTES, BLOCK_M, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE, PREFETCH, SWAP)
        act_cols = cols
    undo: tl.constexpr = 16384.0 if DECODE == 0 else 128.0  # the decoded operand's power of two
    gate = acc_gate * (tl.load(scale_2_ptr + 2 * expert) * undo)
    up = acc_up * (tl.load(scale_2_ptr + 2 * expert + 1) * undo)
    act = gate / (1.0 + tl.exp(-gate)) * up
    out_ptrs = act_ptr + positions[:, None].to(tl.int64) * I + act_cols[None, :]
    tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=valid[:, None] & (cols < I)[None, :])


@triton.jit
def _moe_down_kernel(
    act_ptr, order_ptr, weights_ptr, blocks_ptr, packed_ptr, scale_ptr, scale_2_ptr, pair_out_ptr,
    MAX_BLOCKS,
    H: tl.constexpr, I_BYTES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr, EVEN_K: tl.constexpr, DOT_KIND: tl.constexpr,
    DECODE: tl.constexpr = 0, PREFETCH: tl.constexpr = 0, SWAP: tl.constexpr = 0,
):
    block = tl.program_id(0)
    expert, _, valid, safe = _block_rows(blocks_ptr, block, MAX_BLOCKS, BLOCK_M)
    if expert < 0:
        return
    pairs = tl.load(order_ptr + safe)  # [BM] flat index t * top_k + j
    act_rows = safe.to(tl.int64) * (2 * I_BYTES)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    down_rows = expert.to(tl.int64) * H + tl.minimum(cols, H - 1)
    if DECODE == 2:  # act K-permuted by the gate/up launch
        acc, _ = _register_products(act_ptr, act_rows, packed_ptr, scale_ptr, down_rows, down_rows, I_BYTES, BLOCK_M, BLOCK_N, DOT_KIND, False)
    else:
        acc = _rows_products(act_ptr, act_rows, packed_ptr, scale_ptr, down_rows, I_BYTES, BLOCK_M, BLOCK_N, BLOCK_KB, EVEN_K, DOT_KIND, DECODE, PREFETCH, SWAP)
    routing = tl.load(weights_ptr + pairs)  # [BM] float32
    undo: tl.constexpr = 16384.0 if DECODE == 0 else 128.0
    acc = acc * (tl.load(scale_2_ptr + expert) * undo) * routing[:, None]
    out_ptrs = pair_out_ptr + pairs[:, None].to(tl.int64) * H + cols[None, :]
    tl.store(out_ptrs, acc, mask=valid[:, None] & (cols < H)[None, :])


@triton.jit
def _slot_sum_kernel(y_ptr, out_ptr, s_ptr, logit_ptr, stride_s, stride_logit, H: tl.constexpr, SLOTS: tl.constexpr, BLOCK_H: tl.constexpr,
                     SHARED: tl.constexpr = False):
    """out[t] = sum_j y[t * SLOTS + j] for j in slot order (float32 rows) [+ s[t] * sigmoid(logit[t]) when SHARED],
    rounded once into out's dtype."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = cols < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(SLOTS):  # slot order: the same sum for the same routing
        acc += tl.load(y_ptr + (token * SLOTS + j) * H + cols, mask=ok, other=0.0)
    if SHARED:  # the shared expert's output times its sigmoid gate, in float32, after the routed slots
        gate = tl.sigmoid(tl.load(logit_ptr + token * stride_logit).to(tl.float32))
        acc += tl.load(s_ptr + token * stride_s + cols, mask=ok, other=0.0).to(tl.float32) * gate
    tl.store(out_ptr + token * H + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def _check_moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, experts: StackedNvfp4Experts, out: torch.Tensor) -> tuple[int, int, int, int]:
    """Shape and dtype checks; returns (T, top_k, E, I)."""
    if x.dim() != 2 or x.dtype not in _ACTIVATION_DTYPES:
        raise ValueError(f"x must be [T, H] float32, bfloat16 or float16, got {tuple(x.shape)} {x.dtype}")
    tokens, hidden = x.shape
    if topk_ids.dim() != 2 or topk_ids.shape[0] != tokens or topk_ids.dtype != torch.int32:
        raise ValueError(f"topk_ids must be int32 [T={tokens}, top_k], got {tuple(topk_ids.shape)} {topk_ids.dtype}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape) or topk_weights.dtype != torch.float32:
        raise ValueError(f"topk_weights must be float32 {tuple(topk_ids.shape)}, got {tuple(topk_weights.shape)} {topk_weights.dtype}")
    num_experts, double_i = experts.gate_up_packed.shape[:2]
    inter = double_i // 2
    expected = {
        "gate_up_packed": (experts.gate_up_packed, (num_experts, 2 * inter, hidden // 2), torch.uint8),
        "gate_up_scale": (experts.gate_up_scale, (num_experts, 2 * inter, hidden // 16), torch.float8_e4m3fn),
        "gate_up_scale_2": (experts.gate_up_scale_2, (num_experts, 2), torch.float32),
        "down_packed": (experts.down_packed, (num_experts, hidden, inter // 2), torch.uint8),
        "down_scale": (experts.down_scale, (num_experts, hidden, inter // 16), torch.float8_e4m3fn),
        "down_scale_2": (experts.down_scale_2, (num_experts,), torch.float32),
    }
    if hidden % 16 or inter % 16 or double_i % 2 or inter == 0:
        raise ValueError(f"H and I must be positive multiples of 16, got H={hidden}, gate_up rows {double_i}")
    for name, (tensor, shape, dtype) in expected.items():
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise ValueError(f"experts.{name} must be {dtype} {list(shape)} (H={hidden}), got {tensor.dtype} {list(tensor.shape)}")
    if tuple(out.shape) != (tokens, hidden) or out.dtype != x.dtype:
        raise ValueError(f"out must be {x.dtype} [{tokens}, {hidden}], got {out.dtype} {tuple(out.shape)}")
    return tokens, topk_ids.shape[1], num_experts, inter


def max_blocks(pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound on sum_e cdiv(count_e, block_m) over any routing of `pairs` pairs to `num_experts` experts."""
    return min(pairs, pairs // block_m + min(num_experts, pairs))


_COUNT_BLOCK_P = 1024  # pair ids per step of the counting kernels
SLOT_SUM_BLOCK_H = 512  # output columns per program of `_slot_sum_kernel`
TABLE_BLOCK_B = 16  # blocks of the table per program of `_block_table_kernel` (run20: one program for all took 35 us)


@triton.jit
def _expert_counts_kernel(ids_ptr, counts_ptr, P, BLOCK_P: tl.constexpr):
    """Program e: how many of the P flat ids are e."""
    expert = tl.program_id(0)
    total = tl.zeros((BLOCK_P,), dtype=tl.int32)
    p0 = 0
    while p0 < P:  # while loops: the Triton 3.6 interpreter cannot take a runtime argument as a range bound
        p = p0 + tl.arange(0, BLOCK_P)
        ids = tl.load(ids_ptr + p, mask=p < P, other=-1)
        total += (ids == expert).to(tl.int32)
        p0 += BLOCK_P
    tl.store(counts_ptr + expert, tl.sum(total, axis=0))


@triton.jit
def _block_table_kernel(counts_ptr, starts_ptr, table_ptr, E, MAX_BLOCKS, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_B: tl.constexpr):
    """Program b: blocks b * BLOCK_B .. of the table, as `block_table_torch` (each program redoes the prefix sums over
    the E counts, a few hundred values); program 0 also writes the group starts (exclusive prefix sums)."""
    e = tl.arange(0, BLOCK_E)
    e_ok = e < E
    counts = tl.load(counts_ptr + e, mask=e_ok, other=0)
    group_end = tl.cumsum(counts, axis=0)  # inclusive
    per_expert = (counts + BLOCK_M - 1) // BLOCK_M
    blocks_end = tl.cumsum(per_expert, axis=0)
    tl.store(starts_ptr + e, group_end - counts, mask=e_ok & (tl.program_id(0) == 0))
    block = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    expert = tl.sum(((blocks_end[None, :] <= block[:, None]) & e_ok[None, :]).to(tl.int32), axis=1)  # searchsorted, right
    clamped = tl.minimum(expert, E - 1)
    pick = e[None, :] == clamped[:, None]  # [BB, BE]: each block's expert (clamped past the real count)
    end = tl.sum(tl.where(pick, group_end[None, :], 0), axis=1)
    count = tl.sum(tl.where(pick, counts[None, :], 0), axis=1)
    first_block = tl.sum(tl.where(pick, (blocks_end - per_expert)[None, :], 0), axis=1)
    ok = block < MAX_BLOCKS
    tl.store(table_ptr + block, tl.where(expert < E, expert, -1), mask=ok)
    tl.store(table_ptr + MAX_BLOCKS + block, end - count + (block - first_block) * BLOCK_M, mask=ok)
    tl.store(table_ptr + 2 * MAX_BLOCKS + block, end, mask=ok)


@triton.jit
def _scatter_order_kernel(ids_ptr, starts_ptr, order_ptr, P, BLOCK_P: tl.constexpr):
    """Program e: the indices of the pairs whose id is e, in pair order, at order[starts[e]...]."""
    expert = tl.program_id(0)
    base = tl.load(starts_ptr + expert)
    p0 = 0
    while p0 < P:
        p = p0 + tl.arange(0, BLOCK_P)
        match = tl.load(ids_ptr + p, mask=p < P, other=-1) == expert
        hits = match.to(tl.int32)
        tl.store(order_ptr + base + tl.cumsum(hits, axis=0) - 1, p, mask=match)
        base += tl.sum(hits, axis=0)
        p0 += BLOCK_P


def block_table(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] -> (order [T*k] int32: flat pair indices sorted by expert, stable;
    blocks [3, max_blocks] int32: per block its expert (-1 past the real count), first sorted position and
    the end of its expert's group). A counting sort in three Triton launches (counts per expert; prefix sums and
    the table, TABLE_BLOCK_B blocks per program; each expert's pairs scattered in order), no host sync; the same result as
    `block_table_torch` (run19: its radix sort took 2.6 ms of a 1024-token prefill). Ids must lie in [0, E)."""
    flat = topk_ids.reshape(-1).to(torch.int32).contiguous()  # [P]
    pairs = flat.numel()
    blocks = max_blocks(pairs, num_experts, block_m)
    device = flat.device
    counts = torch.empty(num_experts, dtype=torch.int32, device=device)
    starts = torch.empty(num_experts, dtype=torch.int32, device=device)
    order = torch.empty(pairs, dtype=torch.int32, device=device)
    table = torch.empty(3, blocks, dtype=torch.int32, device=device)
    step = min(_COUNT_BLOCK_P, next_power_of_2(max(pairs, 1)))
    _expert_counts_kernel[(num_experts,)](flat, counts, pairs, BLOCK_P=step)
    block_b = min(TABLE_BLOCK_B, next_power_of_2(max(blocks, 1)))
    _block_table_kernel[(cdiv(blocks, block_b),)](counts, starts, table, num_experts, blocks, BLOCK_M=block_m,
                                                          BLOCK_E=next_power_of_2(num_experts), BLOCK_B=block_b)  # fmt: skip
    _scatter_order_kernel[(num_experts,)](flat, starts, order, pairs, BLOCK_P=step)
    return order, table


def block_table_torch(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`block_table` in torch ops (a stable sort, scatter-add counts, cumsums, searchsorted): the reference the
    tests compare the counting sort with."""
    flat = topk_ids.reshape(-1).long()  # [P]
    pairs = flat.numel()
    order = torch.sort(flat, stable=True).indices  # [P]
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))  # [E]
    group_end = torch.cumsum(counts, 0)  # [E] inclusive
    per_expert = (counts + block_m - 1) // block_m  # [E]
    blocks_end = torch.cumsum(per_expert, 0)  # [E] inclusive
    block = torch.arange(max_blocks(pairs, num_experts, block_m), device=flat.device)  # [B]
    expert = torch.searchsorted(blocks_end, block, right=True)  # [B] in [0, E]
    real = expert < num_experts
    clamped = expert.clamp(max=num_experts - 1)
    first = group_end[clamped] - counts[clamped] + (block - (blocks_end[clamped] - per_expert[clamped])) * block_m
    table = torch.stack([torch.where(real, expert, -1), first, group_end[clamped]]).to(torch.int32)  # [3, B]
    return order.to(torch.int32), table


def _moe_plans(x: torch.Tensor, pairs: int, num_experts: int, inter: int, plans: tuple[GemmPlan, GemmPlan] | None) -> tuple[GemmPlan, GemmPlan, bool]:
    """(gate/up plan, down plan, register) of an experts prefill over `pairs` (token, slot) pairs: `plans` or the
    tuned `plan(...)`s, checked (one block_m; decode 2 in both or neither), decode 2 dropped unless H and I are
    whole 128-element steps."""
    hidden = x.shape[1]
    if plans is None:
        sm, float32 = _sm_count(x.device), x.dtype == torch.float32
        plans = (plan("moe_gate_up", pairs, inter, hidden, sm, num_experts, float32), plan("moe_down", pairs, hidden, inter, sm, num_experts, float32))
    plan_a, plan_b = plans
    if plan_a.block_m != plan_b.block_m:
        raise ValueError(f"the two MoE plans must share block_m (one block table), got {plan_a.block_m} and {plan_b.block_m}")
    register = {_decode(plan_a), _decode(plan_b)} == {2}
    if 2 in (_decode(plan_a), _decode(plan_b)) and not register:
        raise ValueError(f"decode 2 (register operand) must be both MoE plans' decode or neither's, got {_decode(plan_a)} and {_decode(plan_b)}")
    if register and (hidden % 128 or inter % 128):  # whole K steps of 128 elements only: the word decode instead
        plan_a, plan_b = (GemmPlan(**(vars(p) | {"decode": 1})) for p in (plan_a, plan_b))
        register = False
    return plan_a, plan_b, register


def moe_prefill_takes_steps(x: torch.Tensor, top_k: int, experts: StackedNvfp4Experts) -> bool:
    """Whether `nvfp4_moe_prefill(x, ...)` with top-k routing over `experts` (its own tuned plans) runs the Gluon
    gate/up launch, which reads x in `permute_steps` order: then a caller that writes x can also write that copy
    (`x_steps`) and save the prefill's copy launch."""
    num_experts, two_inter = experts.gate_up_packed.shape[:2]
    plan_a, _, register = _moe_plans(x, x.shape[0] * top_k, num_experts, two_inter // 2, None)
    return _gluon_moe(x, plan_a, register, x.shape[1], GLUON_GATE_UP)


def nvfp4_moe_prefill(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, experts: StackedNvfp4Experts, out: torch.Tensor, check_ids: bool = True,
    plans: tuple[GemmPlan, GemmPlan] | None = None, shared: tuple[torch.Tensor, torch.Tensor] | None = None,
    x_steps: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[t] = sum_j topk_weights[t, j] * down_e(silu(gate_e x_t) * up_e x_t), e = topk_ids[t, j], for NVFP4
    experts (`StackedNvfp4Experts`; x [T, H], topk_weights [T, k] float32, topk_ids [T, k] int32, out [T, H]
    in x's dtype). The activation is rounded to x's dtype before the down projection (as `ops.moe`).
    `check_ids=False` skips the expert-id range check, the op's one host sync: for ids in range by
    construction (the model's router top-k), so a prefill does not wait for the GPU once per layer.
    `plans`: the (gate/up, down) tiles instead of `plan(...)` (benchmarks and tests; both must share block_m).
    `shared`: (s [T, H] in x's dtype, logit [T, 1] or [T]): out gains s * sigmoid(logit) per token, added to the
    float32 slot sum before its one rounding (the MoE block's shared expert and gate, in the same launch).
    `x_steps`: x already in `moe_prefill_gluon.permute_steps` order (contiguous [T, H], x's dtype; the RMSNorm
    before the block writes it, `kernels.norms.fused_add_rms_norm(steps_out=)`), used by the Gluon gate/up launch
    instead of its own copy of x; ignored when that launch does not run (`moe_prefill_takes_steps`)."""
    from reference_engine.ops.static_moe import capturing, expert_tensors

    tokens, top_k, num_experts, inter = _check_moe(x, topk_weights, topk_ids, experts, out)
    _check_shared(shared, out)
    if x_steps is not None and (x_steps.shape != x.shape or x_steps.dtype != x.dtype or x_steps.device != x.device or not x_steps.is_contiguous()):
        raise ValueError(f"x_steps must be a contiguous tensor of x's shape {list(x.shape)}, dtype {x.dtype} and device {x.device}; "
                         f"got {list(x_steps.shape)} {x_steps.dtype} on {x_steps.device} (contiguous: {x_steps.is_contiguous()})")  # fmt: skip
    tensors = (x, topk_weights, topk_ids, out, *expert_tensors(experts), *(shared or ()), *(() if x_steps is None else (x_steps,)))
    require_launchable(*tensors)
    hidden = x.shape[1]
    if tokens == 0:
        return out
    if check_ids and not capturing(x):  # the one host sync
        low, high = torch.stack(torch.aminmax(topk_ids)).tolist()
        if low < 0 or high >= num_experts:
            raise ValueError(f"topk_ids must lie in [0, {num_experts}), got values in [{low}, {high}]")
    pairs = tokens * top_k
    plan_a, plan_b, register = _moe_plans(x, pairs, num_experts, inter, plans)
    order, table = block_table(topk_ids, num_experts, plan_a.block_m)
    blocks = table.shape[1]
    x = permute_k(x) if register else x if x.stride(1) == 1 else x.contiguous()
    staged = interpreting() and x.dtype != torch.float32
    act = torch.empty((pairs, inter), dtype=torch.float32 if staged else x.dtype, device=x.device)  # [P, I] sorted order
    dot_kind = _dot_kind(x.dtype)
    gluon_a, gluon_b = _gluon_moe(x, plan_a, register, hidden, GLUON_GATE_UP), _gluon_moe(act, plan_b, register, inter, GLUON_DOWN)
    if gluon_a:  # the weights as wgmma's register operand (off unless tuned on)
        from reference_engine.kernels.moe_prefill_gluon import (
            moe_gate_up_gluon_kernel,
            permute_steps,
        )

        if x_steps is None:
            x_steps = permute_steps(x)  # the operand's K order within each 128-element step (one copy of x)
        for block_m, rows_above in _token_classes(plan_a):
            moe_gate_up_gluon_kernel[(blocks, cdiv(inter, plan_a.block_n))](
                x_steps, order, table, experts.gate_up_packed.contiguous().view(torch.int32), experts.gate_up_scale.contiguous().view(torch.int32),
                experts.gate_up_scale_2.contiguous(), act, blocks, x_steps.stride(0), I=inter, H_BYTES=hidden // 2, TOP_K=top_k,
                BLOCK_M=block_m, BLOCK_N=plan_a.block_n, PERMUTED_ACT=int(gluon_b), STAGES=max(plan_a.num_stages, 2),
                TABLE_M=plan_a.block_m, ROWS_ABOVE=rows_above, num_warps=plan_a.block_n // 16, **_register_cap(plan_a),
            )
    else:
        _moe_gate_up_kernel[(blocks, cdiv(inter, plan_a.block_n))](
            x, order, table, _packed_operand(experts.gate_up_packed.contiguous(), _decode(plan_a)), experts.gate_up_scale.contiguous(),
            experts.gate_up_scale_2.contiguous(), act, blocks, x.stride(0), I=inter, H_BYTES=hidden // 2, TOP_K=top_k,
            BLOCK_M=plan_a.block_m, BLOCK_N=plan_a.block_n, BLOCK_KB=plan_a.block_kb, EVEN_K=(hidden // 2) % plan_a.block_kb == 0,
            DOT_KIND=dot_kind, DECODE=_decode(plan_a), PREFETCH=_prefetch(plan_a, moe=True), SWAP=_swap(plan_a, moe=True),
            FUSED=FUSE_GATE_UP if plan_a.fused < 0 else plan_a.fused, num_warps=plan_a.num_warps, num_stages=1 if register else plan_a.num_stages,
        )
    if staged:  # the interpreter truncates float32 -> bf16; torch rounds
        act = act.to(x.dtype)
    pair_out = torch.empty((pairs, hidden), dtype=torch.float32, device=x.device)  # [T*k, H]
    if gluon_b:  # the weights as wgmma's register operand (off unless tuned on)
        from reference_engine.kernels.moe_prefill_gluon import (
            moe_down_gluon_kernel,
            permute_steps,
        )

        act = act if gluon_a else permute_steps(act)  # the Gluon gate/up launch wrote it in step order already
        for block_m, rows_above in _token_classes(plan_b):
            moe_down_gluon_kernel[(blocks, cdiv(hidden, plan_b.block_n))](
                act, order, topk_weights.contiguous(), table, experts.down_packed.contiguous().view(torch.int32),
                experts.down_scale.contiguous().view(torch.int32), experts.down_scale_2.contiguous(), pair_out, blocks, H=hidden, I_BYTES=inter // 2,
                BLOCK_M=block_m, BLOCK_N=plan_b.block_n, STAGES=max(plan_b.num_stages, 2), TABLE_M=plan_b.block_m, ROWS_ABOVE=rows_above,
                num_warps=plan_b.block_n // 16, **_register_cap(plan_b),
            )
    else:
        _moe_down_kernel[(blocks, cdiv(hidden, plan_b.block_n))](
            act, order, topk_weights.contiguous(), table, _packed_operand(experts.down_packed.contiguous(), _decode(plan_b)), experts.down_scale.contiguous(),
            experts.down_scale_2.contiguous(), pair_out, blocks, H=hidden, I_BYTES=inter // 2,
            BLOCK_M=plan_b.block_m, BLOCK_N=plan_b.block_n, BLOCK_KB=plan_b.block_kb, EVEN_K=(inter // 2) % plan_b.block_kb == 0,
            DOT_KIND=dot_kind, DECODE=_decode(plan_b), PREFETCH=_prefetch(plan_b, moe=True), SWAP=_swap(plan_b, moe=True), num_warps=plan_b.num_warps,
            num_stages=1 if register else plan_b.num_stages,
        )
    slot_sum(pair_out, out, top_k, shared)
    return out


def _check_shared(shared: tuple[torch.Tensor, torch.Tensor] | None, out: torch.Tensor) -> None:
    if shared is None:
        return
    if not isinstance(shared, tuple) or len(shared) != 2:
        raise ValueError("shared must be a pair (shared expert output [T, H], gate logit [T, 1] or [T])")
    s, logit = shared
    tokens = out.shape[0]
    if tuple(s.shape) != tuple(out.shape) or s.dtype != out.dtype or s.stride(1) != 1:
        raise ValueError(f"the shared expert output must be {out.dtype} {list(out.shape)} with unit column stride, got {s.dtype} {list(s.shape)}")
    if tuple(logit.shape) not in ((tokens,), (tokens, 1)) or not logit.is_floating_point():
        raise ValueError(f"the shared gate logit must be a float tensor [{tokens}, 1] or [{tokens}], got {logit.dtype} {list(logit.shape)}")


def slot_sum(y: torch.Tensor, out: torch.Tensor, slots: int, shared: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """out [T, H] = the sum over each token's `slots` consecutive float32 rows of y [T * slots, H], in slot order,
    plus s * sigmoid(logit) per token when `shared` = (s [T, H], logit [T, 1] or [T]) is given, rounded once into
    out's dtype (one launch; deterministic)."""
    tokens, hidden = out.shape
    buffer = staging_buffer(out)  # float32 under the interpreter (it truncates to bf16), else `out`
    target = buffer if buffer.is_contiguous() else torch.empty(buffer.shape, dtype=buffer.dtype, device=buffer.device)
    block_h = min(SLOT_SUM_BLOCK_H, next_power_of_2(hidden))
    s, logit = shared if shared is not None else (y, y)  # unread without SHARED
    _slot_sum_kernel[(tokens, cdiv(hidden, block_h))](
        y, target, s, logit, s.stride(0), logit.stride(0), H=hidden, SLOTS=slots, BLOCK_H=block_h, SHARED=shared is not None,
    )
    if target is not buffer:
        buffer.copy_(target)
    finish(buffer, out)
