"""The routed experts' prefill GEMMs (gate/up, down) in Gluon (Hopper): the decoded weight tile as wgmma's register
operand, never stored to shared memory.

Why (benchmarks/NOTES.md, run35 and run39): the plain-Triton launches (`nvfp4_gemm._moe_gate_up_kernel`,
`_moe_down_kernel`) store every decoded bfloat16 weight tile to shared memory and read it back for wgmma; the
shared-memory pipe is 73% busy and the warps stall on the CTA barrier between the store and the wgmma. A first Gluon
form that kept the decoded tiles in two shared-memory stages ran correctly but slower (run46: 638.5 us against 473.4
for the whole experts op at 1024 tokens). Here the weights are the wgmma's A operand in registers: weight rows are
the MMA's M (64 per warpgroup), the tokens of one block-table block its N. Every K step's activation tile, packed
weight words and block scales arrive in shared memory by cp.async (`STAGES` stages, STAGES - 1 steps in flight); each
thread reads back the packed words it copied: half a byte per weight written and half read, where the Triton launches
store and reload 2 bytes of decoded tile.

One K step is 128 elements: 64 packed bytes, 16 int32 words, per weight row. Thread (warp w, lane 4g + c) loads words
4c .. 4c + 3 of rows 16w + g and 16w + g + 8 with one 16-byte load each and decodes each word in PTX (`_decode_asm`:
codes i and i + 4 into one bfloat16 pair, e2m1 * block scale * 2^-7, exact). wgmma's register fragment holds, in
thread c, the K positions 2c, 2c + 1, 2c + 8, 2c + 9 of each 16-wide slice, so the decoded values enter it in a
permuted K order: element 32c + 8wl + 4e0 + 2e2 + e1 of the step (word 4c + wl, code e1 + 2e2 + 4e0) sits at position
32wl + 16e2 + 8e1 + 2c + e0. That is a relabelling of registers, no data moves (`gl.convert_layout(...,
assert_trivial=True)` checks it at compile time). The activations are copied once into the same order
(`permute_steps`; the gate/up launch writes its output that way when the down launch is Gluon too), so every product
pairs the right elements: each step sums the same 128 products, in another order.

Per K step: wait for this step's copies and a CTA barrier, start the copies STAGES - 1 steps ahead, read back and
decode the gate tile, issue its wgmmas, decode the up tile while they run, issue its wgmmas, wait for both.

Status: on in the H200 tuning file since run48 (both launches, 64-token blocks, 64 gate/up rows); CUDA tests and
timings in benchmarks/NOTES.md (run47: weights and activations loaded to registers; run48: activations by cp.async;
this form, weights by cp.async too, from run49: the whole experts op at 1024 tokens 378.7 us against 475.8 for the
Triton launches). Offline sm_90 compile checks in `tests/reference_engine/kernels/test_moe_prefill_gluon.py`. Nothing
calls these kernels unless a plan's `gluon` is 1 or `nvfp4_gemm.GLUON_GATE_UP` / `GLUON_DOWN` is set (tuning keys
`moe_prefill_gluon`, `moe_prefill_gluon_down`); `TABLE_M` / `ROWS_ABOVE` let one launch per token class share a block
table (`_takes_block`, `nvfp4_gemm._token_classes`; run51: blocks of at most 32 tokens in a 32-wide launch took the
whole op from 377.9 to 366.9 us, on in the tuning file since run54).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    warpgroup_mma,
    warpgroup_mma_wait,
)

STEP_BYTES = gl.constexpr(64)  # packed bytes of a weight row per K step (128 elements)


@gluon.constexpr_function
def _warp_rows(rank, rows):
    """Warp bases: warp w takes rows 16w .. 16w + 15 (4 warps per 64 rows, one warpgroup)."""
    return [[16 << b] + [0] * (rank - 1) for b in range((rows // 16).bit_length() - 1)]


@gluon.constexpr_function
def _code_layout(rows):
    """[rows, 16, 8]: the 8 codes of each of a K step's 16 int32 words per row. Thread (w, 4g + c) holds words
    4c .. 4c + 3 of rows 16w + g and 16w + g + 8, each word's 8 codes in consecutive registers (one asm call)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 1, 0], [0, 2, 0], [8, 0, 0]],
        lane_bases=[[0, 4, 0], [0, 8, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=_warp_rows(3, rows), block_bases=[], shape=[rows, 16, 8],
    )


@gluon.constexpr_function
def _scale_layout(rows):
    """[rows, 8, 2]: its [rows, 8] slice holds, in thread (w, 4g + c), the block scales 2c and 2c + 1 of one K step of
    rows 16w + g and 16w + g + 8 (the scales of that thread's words 4c .. 4c + 3); the last dimension repeats them, one
    per word."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 1, 0], [8, 0, 0]], lane_bases=[[0, 2, 0], [0, 4, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=_warp_rows(3, rows), block_bases=[], shape=[rows, 8, 2],
    )


@gluon.constexpr_function
def _scale_copy_layout(num_warps):
    """[rows, 2] int32 (a row's 8 block scales of one K step): one 4-byte copy per thread, 16 rows per warp."""
    return gl.BlockedLayout([1, 1], [16, 2], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def _plain_smem_layout():
    """Unswizzled [rows, columns] (per stage): each thread copies in and reads back its own 16 weight bytes per row."""
    return gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])


@gluon.constexpr_function
def _acc_layout(rows, tokens, num_warps):
    """wgmma accumulator [rows, tokens]: weight rows as M (64 per warpgroup), the block's tokens as N."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, tokens, 16])


@gluon.constexpr_function
def _x_layout(num_warps):
    """[tokens, 128] activation elements of one K step: 16 bytes per thread along K."""
    return gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def _x_smem_layout(tokens):
    return gl.NVMMASharedLayout.get_default_for([tokens, 2 * STEP_BYTES], gl.bfloat16)


@gluon.jit
def _block_bounds(blocks_ptr, block, MAX_BLOCKS):
    """Block table [3, MAX_BLOCKS] int32 -> (expert, first sorted position, end of the expert's group); expert < 0
    past the real block count."""
    return gl.load(blocks_ptr + block), gl.load(blocks_ptr + MAX_BLOCKS + block), gl.load(blocks_ptr + 2 * MAX_BLOCKS + block)


@gluon.jit
def _takes_block(expert, first, end, TABLE_M: gl.constexpr, ROWS_ABOVE: gl.constexpr, BLOCK_M: gl.constexpr):
    """Whether this launch handles a block of the TABLE_M-token block table: a real block (expert >= 0) whose token
    count (at most TABLE_M) is above ROWS_ABOVE and at most BLOCK_M. One launch per class lets blocks with few tokens run
    a narrower MMA (`nvfp4_gemm`'s `split_m`); with TABLE_M == BLOCK_M and ROWS_ABOVE 0 every real block qualifies."""
    count = gl.minimum(end - first, TABLE_M)
    return (expert >= 0) & (count > ROWS_ABOVE) & (count <= BLOCK_M)


def _decode_asm() -> str:
    """PTX for one int32 word ($4 .. $11: eight copies, one per element of the call) and its block scale times 2^119
    (float32, $12 .. $19): $0 .. $3 = bfloat16 pairs (code i, code i + 4) times the scale, code i from bits 4i .. 4i + 3.
    Code i + 4 sits 16 bits above code i, so one shift serves both halves: magnitude bits to 6 .. 8 and 22 .. 24 (a
    bfloat16 e2m1 * 2^-126), sign bits to 15 and 31, then one mul.rn.bf16x2 (e2m1 * scale * 2^-7, exact)."""
    lines = ["{", ".reg .b32 s, t, m, g;", "cvt.rn.bf16x2.f32 s, $12, $12;"]
    for i in range(4):
        shift = 6 - 4 * i  # code i's magnitude bits 4i .. 4i + 2 to 6 .. 8
        lines.append(f"shl.b32 t, $4, {shift};" if shift >= 0 else f"shr.b32 t, $4, {-shift};")
        lines += ["and.b32 m, t, 0x01C001C0;", "shl.b32 g, t, 6;", "and.b32 g, g, 0x80008000;", "or.b32 m, m, g;", f"mul.rn.bf16x2 ${i}, m, s;"]
    return "\n".join([*lines, "}"])


_DECODE_ASM = gl.constexpr(_decode_asm())
SCALE_SHIFT = gl.constexpr(2.0**119)  # block scales times 2^119 in the decode, 2^-119 * 2^126 = 2^7 back in the epilogue


@gluon.jit
def _copy_rows(smem, base_ptr, row_offsets, cols, step_offset):
    """Start the asynchronous copy of base_ptr[row_offsets[r] + step_offset + cols[c]] into smem [rows, cols]."""
    async_copy.async_copy_global_to_shared(smem, base_ptr + row_offsets[:, None] + (step_offset + cols)[None, :])


@gluon.jit
def _copy_weights(words_smem, words_ptr, row_words, word_cols, scale_smem, scale_words_ptr, row_scales, pair_cols, step):
    """Start copying K step `step` of a weight tile: its packed words (16 int32 a row) and block scales (2 int32 a row)."""
    _copy_rows(words_smem, words_ptr, row_words, word_cols, step * (STEP_BYTES // 4))
    _copy_rows(scale_smem, scale_words_ptr, row_scales, pair_cols, step * 2)


@gluon.jit
def _copy_step(x_smem, x_ptr, x_rows, x_cols, words_smem, words_ptr, row_words, word_cols, scale_smem, scale_words_ptr, row_scales,
               pair_cols, step):  # fmt: skip
    """Start copying K step `step` of the activation tile and of one weight tile (the caller commits the group)."""
    _copy_rows(x_smem, x_ptr, x_rows, x_cols, step * 2 * STEP_BYTES)
    _copy_weights(words_smem, words_ptr, row_words, word_cols, scale_smem, scale_words_ptr, row_scales, pair_cols, step)


@gluon.jit
def _staged_weights(words_smem, scale_bytes, ROWS: gl.constexpr):
    """One stage's weight words [ROWS, 16] int32 and each word's E4M3 block scale [ROWS, 16], both in
    `SliceLayout(2, _code_layout)`; the thread reads back the 16 bytes per row it copied."""
    word_layout: gl.constexpr = gl.SliceLayout(2, _code_layout(ROWS))
    words = words_smem.load(word_layout)
    blocks = scale_bytes.load(gl.SliceLayout(2, _scale_layout(ROWS)))  # [ROWS, 8] uint8
    per_word = gl.broadcast(blocks[:, :, None], gl.full([1, 1, 2], 0, gl.uint8, _scale_layout(ROWS)))[0].reshape([ROWS, 16])
    return words, gl.convert_layout(per_word, word_layout, assert_trivial=True).to(gl.float8e4nv, bitcast=True)


@gluon.jit
def _per_code(values, ROWS: gl.constexpr):
    """[ROWS, 16] per word -> [ROWS, 16, 8] per code (the same register eight times)."""
    return gl.broadcast(values[:, :, None], gl.full([1, 1, 8], 0, values.dtype, _code_layout(ROWS)))[0]


@gluon.jit
def _operand(words, scale, ROWS: gl.constexpr, a_layout: gl.constexpr):
    """Words and scales of one K step -> wgmma's A operand [ROWS, 128] bfloat16 (e2m1 * scale * 2^-7) in the permuted
    K order of the module docstring."""
    codes = gl.inline_asm_elementwise(
        _DECODE_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r",
        [_per_code(words, ROWS), _per_code(scale.to(gl.float32) * SCALE_SHIFT, ROWS)],
        dtype=gl.bfloat16, is_pure=True, pack=8,
    )  # [ROWS, 16 words, 8]: element e0 + 2 e1 + 4 e2 of word w is code e1 + 2 e2 + 4 e0
    permuted = codes.reshape([ROWS, 4, 4, 2, 2, 2]).permute((0, 2, 3, 4, 1, 5)).reshape([ROWS, 2 * STEP_BYTES])
    return gl.convert_layout(permuted, a_layout, assert_trivial=True)


def permute_steps(x: torch.Tensor) -> torch.Tensor:
    """x [rows, K] (K a multiple of 128) with each 128-element K step in the operand's permuted order (module
    docstring): element 32c + 8wl + 4e0 + 2e2 + e1 of a step moves to position 32wl + 16e2 + 8e1 + 2c + e0. One copy."""
    rows, k = x.shape
    return x.reshape(rows, k // 128, 4, 4, 2, 2, 2).permute(0, 1, 3, 5, 6, 2, 4).reshape(rows, k)


@gluon.jit
def _step_position(n):
    """Column n (natural order) -> its position in `permute_steps` order."""
    r = n % 128
    return (n - r) + (((r >> 3) & 3) << 5) + (((r >> 1) & 1) << 4) + ((r & 1) << 3) + ((r >> 5) << 1) + ((r >> 2) & 1)


@gluon.jit
def moe_gate_up_gluon_kernel(
    x_ptr, order_ptr, blocks_ptr, words_ptr, scale_words_ptr, scale_2_ptr, act_ptr,
    MAX_BLOCKS, stride_x,
    I: gl.constexpr, H_BYTES: gl.constexpr, TOP_K: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    PERMUTED_ACT: gl.constexpr, STAGES: gl.constexpr, TABLE_M: gl.constexpr, ROWS_ABOVE: gl.constexpr, num_warps: gl.constexpr,
):
    """Grid (block-table blocks, cdiv(I, BLOCK_N)): act[p, n] (bfloat16, the pairs' sorted positions p, intermediate
    columns n; at `permute_steps` positions when PERMUTED_ACT, for the Gluon down launch) = silu(gate) * up of the
    block's tokens (at most BLOCK_M; the table's blocks hold TABLE_M, see `_takes_block`) against BLOCK_N = 16 *
    num_warps gate rows and as many up rows of its expert. x [T, H] bfloat16 in `permute_steps` order, row stride
    stride_x; the packed weights and their block scales as int32 words.
    Every K step's activation tile, weight words and scales arrive by cp.async, STAGES - 1 steps ahead."""
    STEPS: gl.constexpr = H_BYTES // STEP_BYTES
    WORDS: gl.constexpr = STEP_BYTES // 4  # weight words per row and step
    expert, first, end = _block_bounds(blocks_ptr, gl.program_id(0), MAX_BLOCKS)
    if not _takes_block(expert, first, end, TABLE_M, ROWS_ABOVE, BLOCK_M):  # past the real block count, or another class
        return
    acc_layout: gl.constexpr = _acc_layout(BLOCK_N, BLOCK_M, num_warps)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    word_layout: gl.constexpr = gl.SliceLayout(2, _code_layout(BLOCK_N))
    pair_layout: gl.constexpr = _scale_copy_layout(num_warps)
    x_layout: gl.constexpr = _x_layout(num_warps)
    plain: gl.constexpr = _plain_smem_layout()

    cols = gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, word_layout))
    gate_rows = expert.to(gl.int64) * (2 * I) + gl.minimum(cols, I - 1)
    word_cols = gl.arange(0, WORDS, layout=gl.SliceLayout(0, word_layout))
    gate_words, up_words = gate_rows * (H_BYTES // 4), (gate_rows + I) * (H_BYTES // 4)
    cols_s = gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, pair_layout))
    gate_rows_s = expert.to(gl.int64) * (2 * I) + gl.minimum(cols_s, I - 1)
    pair_cols = gl.arange(0, 2, layout=gl.SliceLayout(0, pair_layout))
    gate_scales, up_scales = gate_rows_s * (H_BYTES // 32), (gate_rows_s + I) * (H_BYTES // 32)  # int32 words of scales

    m_x = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_layout))
    tokens = gl.load(order_ptr + gl.minimum(first + m_x, end - 1)) // TOP_K  # clamped: unmasked copies
    x_rows = tokens.to(gl.int64) * stride_x
    x_cols = gl.arange(0, 2 * STEP_BYTES, layout=gl.SliceLayout(0, x_layout))
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, 2 * STEP_BYTES], _x_smem_layout(BLOCK_M))
    gate_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, WORDS], plain)
    up_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, WORDS], plain)
    gate_s_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, 2], plain)
    up_s_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, 2], plain)
    gate_s_bytes = gate_s_smem._reinterpret(gl.uint8, [STAGES, BLOCK_N, 8], plain)
    up_s_bytes = up_s_smem._reinterpret(gl.uint8, [STAGES, BLOCK_N, 8], plain)

    for s in gl.static_range(STAGES - 1):  # steps 0 .. STAGES - 2, one commit group each
        _copy_step(x_smem.index(s), x_ptr, x_rows, x_cols, gate_smem.index(s), words_ptr, gate_words, word_cols,
                   gate_s_smem.index(s), scale_words_ptr, gate_scales, pair_cols, s)  # fmt: skip
        _copy_weights(up_smem.index(s), words_ptr, up_words, word_cols, up_s_smem.index(s), scale_words_ptr, up_scales, pair_cols, s)
        async_copy.commit_group()

    acc_gate = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=acc_layout)
    acc_up = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=acc_layout)
    for step in range(STEPS):
        stage = step % STAGES
        async_copy.wait_group(STAGES - 2)  # this thread's copies of this step have landed
        gl.thread_barrier()  # everyone's have; every warp is past its previous step (reads and wgmma wait)
        ahead = gl.minimum(step + STAGES - 1, STEPS - 1)  # clamped copies land in stages no step reads again
        into = (step + STAGES - 1) % STAGES  # the stage the previous step read
        _copy_step(x_smem.index(into), x_ptr, x_rows, x_cols, gate_smem.index(into), words_ptr, gate_words, word_cols,
                   gate_s_smem.index(into), scale_words_ptr, gate_scales, pair_cols, ahead)  # fmt: skip
        _copy_weights(up_smem.index(into), words_ptr, up_words, word_cols, up_s_smem.index(into), scale_words_ptr, up_scales, pair_cols, ahead)
        async_copy.commit_group()
        words, scale = _staged_weights(gate_smem.index(stage), gate_s_bytes.index(stage), BLOCK_N)
        gate_a = _operand(words, scale, BLOCK_N, a_layout)
        acc_gate = warpgroup_mma(gate_a, x_smem.index(stage).permute((1, 0)), acc_gate, is_async=True)
        words, scale = _staged_weights(up_smem.index(stage), up_s_bytes.index(stage), BLOCK_N)
        up_a = _operand(words, scale, BLOCK_N, a_layout)  # while the gate's wgmmas run
        acc_up = warpgroup_mma(up_a, x_smem.index(stage).permute((1, 0)), acc_up, is_async=True)
        acc_gate, acc_up = warpgroup_mma_wait(num_outstanding=0, deps=(acc_gate, acc_up))
    async_copy.wait_group(0)

    gate = acc_gate * (gl.load(scale_2_ptr + 2 * expert) * 128.0)  # 2^7: see SCALE_SHIFT
    up = acc_up * (gl.load(scale_2_ptr + 2 * expert + 1) * 128.0)
    act = gate / (1.0 + gl.exp(-gate)) * up
    n_o = gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    positions = first + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, acc_layout))
    columns = _step_position(n_o) if PERMUTED_ACT else n_o
    out_ptrs = act_ptr + positions.to(gl.int64)[None, :] * I + columns[:, None]
    gl.store(out_ptrs, act.to(gl.bfloat16), mask=(positions < end)[None, :] & (n_o < I)[:, None])


@gluon.jit
def moe_down_gluon_kernel(
    act_ptr, order_ptr, weights_ptr, blocks_ptr, words_ptr, scale_words_ptr, scale_2_ptr, pair_out_ptr,
    MAX_BLOCKS,
    H: gl.constexpr, I_BYTES: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    TABLE_M: gl.constexpr, ROWS_ABOVE: gl.constexpr, num_warps: gl.constexpr,
):
    """The down launch in the same form: grid (block-table blocks, cdiv(H, BLOCK_N)); act [pairs, I] bfloat16 in sorted
    order and `permute_steps` order (the gate/up launch with PERMUTED_ACT); writes pair_out[pair, H] float32 = the down
    products times the tensor scale and the pair's routing weight (as `nvfp4_gemm._moe_down_kernel`)."""
    STEPS: gl.constexpr = I_BYTES // STEP_BYTES
    WORDS: gl.constexpr = STEP_BYTES // 4
    expert, first, end = _block_bounds(blocks_ptr, gl.program_id(0), MAX_BLOCKS)
    if not _takes_block(expert, first, end, TABLE_M, ROWS_ABOVE, BLOCK_M):  # past the real block count, or another class
        return
    acc_layout: gl.constexpr = _acc_layout(BLOCK_N, BLOCK_M, num_warps)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    word_layout: gl.constexpr = gl.SliceLayout(2, _code_layout(BLOCK_N))
    pair_layout: gl.constexpr = _scale_copy_layout(num_warps)
    x_layout: gl.constexpr = _x_layout(num_warps)
    plain: gl.constexpr = _plain_smem_layout()

    first_row = expert.to(gl.int64) * H + gl.program_id(1) * BLOCK_N
    rows = first_row + gl.minimum(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, word_layout)), H - 1 - gl.program_id(1) * BLOCK_N)
    rows_s = first_row + gl.minimum(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, pair_layout)), H - 1 - gl.program_id(1) * BLOCK_N)
    word_cols = gl.arange(0, WORDS, layout=gl.SliceLayout(0, word_layout))
    pair_cols = gl.arange(0, 2, layout=gl.SliceLayout(0, pair_layout))
    row_words, row_scales = rows * (I_BYTES // 4), rows_s * (I_BYTES // 32)

    m_x = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_layout))
    a_rows = gl.minimum(first + m_x, end - 1).to(gl.int64) * (2 * I_BYTES)  # act row of sorted position p: I elements
    a_cols = gl.arange(0, 2 * STEP_BYTES, layout=gl.SliceLayout(0, x_layout))
    a_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, 2 * STEP_BYTES], _x_smem_layout(BLOCK_M))
    w_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, WORDS], plain)
    s_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, 2], plain)
    s_bytes = s_smem._reinterpret(gl.uint8, [STAGES, BLOCK_N, 8], plain)
    for s in gl.static_range(STAGES - 1):
        _copy_step(a_smem.index(s), act_ptr, a_rows, a_cols, w_smem.index(s), words_ptr, row_words, word_cols, s_smem.index(s),
                   scale_words_ptr, row_scales, pair_cols, s)  # fmt: skip
        async_copy.commit_group()

    acc = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=acc_layout)
    for step in range(STEPS):
        stage = step % STAGES
        async_copy.wait_group(STAGES - 2)
        gl.thread_barrier()
        ahead = gl.minimum(step + STAGES - 1, STEPS - 1)
        into = (step + STAGES - 1) % STAGES
        _copy_step(a_smem.index(into), act_ptr, a_rows, a_cols, w_smem.index(into), words_ptr, row_words, word_cols,
                   s_smem.index(into), scale_words_ptr, row_scales, pair_cols, ahead)  # fmt: skip
        async_copy.commit_group()
        words, scale = _staged_weights(w_smem.index(stage), s_bytes.index(stage), BLOCK_N)
        acc = warpgroup_mma(_operand(words, scale, BLOCK_N, a_layout), a_smem.index(stage).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    async_copy.wait_group(0)

    n_o = gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    positions = first + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, acc_layout))
    valid = positions < end
    pairs = gl.load(order_ptr + gl.minimum(positions, end - 1))  # flat index t * top_k + j
    routing = gl.load(weights_ptr + pairs)
    y = acc * (gl.load(scale_2_ptr + expert) * 128.0) * routing[None, :]
    out_ptrs = pair_out_ptr + pairs.to(gl.int64)[None, :] * H + n_o[:, None]
    gl.store(out_ptrs, y, mask=valid[None, :] & (n_o < H)[:, None])
