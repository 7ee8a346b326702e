"""The routed experts' prefill GEMMs (gate/up, down) in Gluon (Hopper): decoded weight tiles in two shared-memory stages.

Status: compiled for sm_90 ahead of time only (Triton 3.6's bundled ptxas; `tests/reference_engine/kernels/
test_moe_prefill_gluon.py`). Neither kernel has run on a GPU yet: no correctness or speed figure exists. Nothing calls
them unless a plan's `gluon` is 1 or `nvfp4_gemm.GLUON_GATE_UP` / `GLUON_DOWN` is set (tuning keys `moe_prefill_gluon`,
`moe_prefill_gluon_down`; absent from the committed tuning file). `moe_down_gluon_kernel` is the down launch in the
same form (one accumulator, two wgmmas per step).

Why (benchmarks/NOTES.md, run39): the plain-Triton gate/up launch (`nvfp4_gemm._moe_gate_up_kernel`) stalls on the CTA
barrier between storing its decoded weight tile and the wgmma that reads it; with one tile buffer, step k+1's decode
waits for step k's wgmma. Here step k+1's loads and decode run while step k's wgmmas are in flight, into the other stage.

Same inputs, block table and outputs as `_moe_gate_up_kernel` with DECODE 0 (bytes; `e2m1 * block_scale * 2^-14`
products exact in float16, as bfloat16 dot operands; the tensor scale and 2^14 applied to the float32 accumulators).
One K step is 64 elements: 32 packed bytes per weight row. Its even elements (low nibbles) and odd elements (high
nibbles) are decoded apart and stored in two [rows, 32] tiles, and x's even and odd elements likewise (x read as int32
words: element 2j in the low half). Each step then runs two wgmmas of K 32 per accumulator (even with even, odd with
odd): the same products as one K-64 step, summed in another order. No tile is interleaved back into K order.

Per iteration k, with stage s = k % 2:
  1. load step k's x words, weight bytes and block scales; decode to bfloat16 (step k-1's wgmmas still running);
  2. a CTA barrier: every warpgroup has passed step 5 of iteration k-1, so its step k-2 wgmmas (the last readers of
     stage s) are done;
  3. store the six tiles to stage s, fence the async proxy, CTA barrier (every thread's stores visible to wgmma);
  4. issue step k's four wgmmas asynchronously;
  5. wait until at most those four are outstanding (this warpgroup's step k-1 done).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

K_STEP_BYTES = 32  # packed bytes of a weight row per K step (64 elements)


@gluon.constexpr_function
def _x_layout(num_warps):
    """[BM, 32] int32 activation words: 16 bytes per thread along K."""
    return gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def _w_layout(num_warps):
    """[BN, 32] packed weight bytes: 16 bytes per thread along K."""
    return gl.BlockedLayout([1, 16], [16, 2], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def _acc_layout(block_n, num_warps):
    """wgmma accumulator [64, BN]: 4 warps along M (one warpgroup's 64 rows), the warpgroups side by side along N."""
    warps_n = num_warps // 4
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, warps_n], instr_shape=[16, block_n // warps_n, 16])


@gluon.constexpr_function
def _tile_smem_layout(rows):
    """A [rows, 32] bfloat16 tile in shared memory, as wgmma reads it."""
    return gl.NVMMASharedLayout.get_default_for([rows, K_STEP_BYTES], gl.bfloat16)


@gluon.jit
def _e2m1_half(codes):
    """uint8 codes 0..15 -> float16 holding the E2M1 value times 2^-14 (magnitude bits to 11..9, sign to 15)."""
    c = codes.to(gl.int16)
    return (((c & 7) << 9) | ((c & 8) << 12)).to(gl.float16, bitcast=True)


@gluon.jit
def _weight_halves(packed_ptr, scale_ptr, rows, byte_cols, H_BYTES: gl.constexpr, byte0):
    """Rows `rows` [BN] (int64), packed bytes byte0 + byte_cols [32]: (even, odd) elements as bfloat16 [BN, 32] each,
    e2m1 * block_scale * 2^-14 (exact)."""
    offsets = rows[:, None] * H_BYTES + (byte0 + byte_cols)[None, :]
    packed = gl.load(packed_ptr + offsets)  # [BN, 32] uint8
    scale = gl.load(scale_ptr + rows[:, None] * (H_BYTES // 8) + ((byte0 + byte_cols) // 8)[None, :]).to(gl.float16)  # per byte
    even = (_e2m1_half(packed & 0xF) * scale).to(gl.bfloat16)
    odd = (_e2m1_half(packed >> 4) * scale).to(gl.bfloat16)
    return even, odd


@gluon.jit
def _block_bounds(blocks_ptr, block, MAX_BLOCKS):
    """Block table [3, MAX_BLOCKS] int32 -> (expert, first sorted position, end of the expert's group); expert < 0
    past the real block count."""
    return gl.load(blocks_ptr + block), gl.load(blocks_ptr + MAX_BLOCKS + block), gl.load(blocks_ptr + 2 * MAX_BLOCKS + block)


@gluon.jit
def _x_halves(x_words_ptr, row_words, word_cols, byte0):
    """x rows at int32-word offsets row_words [BM] (int64), words byte0 + word_cols [32] (elements 2*byte0 ..):
    (even, odd) elements as bfloat16 [BM, 32] each."""
    words = gl.load(x_words_ptr + row_words[:, None] + (byte0 + word_cols)[None, :])  # [BM, 32] int32
    even = (words & 0xFFFF).to(gl.int16).to(gl.bfloat16, bitcast=True)
    odd = ((words >> 16) & 0xFFFF).to(gl.int16).to(gl.bfloat16, bitcast=True)
    return even, odd


@gluon.jit
def moe_gate_up_gluon_kernel(
    x_words_ptr, order_ptr, blocks_ptr, packed_ptr, scale_ptr, scale_2_ptr, act_ptr,
    MAX_BLOCKS, stride_xw,
    I: gl.constexpr, H_BYTES: gl.constexpr, TOP_K: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Grid (block-table blocks, cdiv(I, BLOCK_N)); x as int32 words (x.view(int32), row stride stride_xw words);
    act [pairs, I] bfloat16 at the pairs' sorted positions. BLOCK_M 64 (one wgmma M per warpgroup row), num_warps 4 or 8."""
    KB: gl.constexpr = 32  # packed bytes (and x words) per K step
    expert, first, end = _block_bounds(blocks_ptr, gl.program_id(0), MAX_BLOCKS)
    if expert < 0:  # past the real block count
        return
    x_layout: gl.constexpr = _x_layout(num_warps)
    w_layout: gl.constexpr = _w_layout(num_warps)
    acc_layout: gl.constexpr = _acc_layout(BLOCK_N, num_warps)
    a_smem_layout: gl.constexpr = _tile_smem_layout(BLOCK_M)
    b_smem_layout: gl.constexpr = _tile_smem_layout(BLOCK_N)

    m_x = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_layout))
    positions_x = gl.minimum(first + m_x, end - 1)  # clamped: unmasked loads
    tokens = gl.load(order_ptr + positions_x) // TOP_K
    row_words = tokens.to(gl.int64) * stride_xw
    word_cols = gl.arange(0, KB, layout=gl.SliceLayout(0, x_layout))

    n_w = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, w_layout))
    cols_w = gl.minimum(gl.program_id(1) * BLOCK_N + n_w, I - 1)
    gate_rows = expert.to(gl.int64) * (2 * I) + cols_w
    up_rows = gate_rows + I
    byte_cols = gl.arange(0, KB, layout=gl.SliceLayout(0, w_layout))

    # Two stages of six tiles: x even / odd, gate even / odd, up even / odd.
    x_even_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_M, KB], a_smem_layout)
    x_odd_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_M, KB], a_smem_layout)
    g_even_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, KB], b_smem_layout)
    g_odd_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, KB], b_smem_layout)
    u_even_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, KB], b_smem_layout)
    u_odd_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, KB], b_smem_layout)

    acc_gate = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    acc_up = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    for step in range(H_BYTES // KB):
        byte0 = step * KB
        stage = step % 2
        xe, xo = _x_halves(x_words_ptr, row_words, word_cols, byte0)
        ge, go = _weight_halves(packed_ptr, scale_ptr, gate_rows, byte_cols, H_BYTES, byte0)
        ue, uo = _weight_halves(packed_ptr, scale_ptr, up_rows, byte_cols, H_BYTES, byte0)
        gl.thread_barrier()  # every warpgroup waited for its step k-2 (end of the last iteration): stage s is free
        x_even_s.index(stage).store(xe)
        x_odd_s.index(stage).store(xo)
        g_even_s.index(stage).store(ge)
        g_odd_s.index(stage).store(go)
        u_even_s.index(stage).store(ue)
        u_odd_s.index(stage).store(uo)
        fence_async_shared()
        gl.thread_barrier()
        acc_gate = warpgroup_mma(x_even_s.index(stage), g_even_s.index(stage).permute((1, 0)), acc_gate, is_async=True)
        acc_gate = warpgroup_mma(x_odd_s.index(stage), g_odd_s.index(stage).permute((1, 0)), acc_gate, is_async=True)
        acc_up = warpgroup_mma(x_even_s.index(stage), u_even_s.index(stage).permute((1, 0)), acc_up, is_async=True)
        acc_up = warpgroup_mma(x_odd_s.index(stage), u_odd_s.index(stage).permute((1, 0)), acc_up, is_async=True)
        acc_gate, acc_up = warpgroup_mma_wait(num_outstanding=4, deps=(acc_gate, acc_up))  # step k's four may still run
    acc_gate, acc_up = warpgroup_mma_wait(num_outstanding=0, deps=(acc_gate, acc_up))

    gate = acc_gate * (gl.load(scale_2_ptr + 2 * expert) * 16384.0)
    up = acc_up * (gl.load(scale_2_ptr + 2 * expert + 1) * 16384.0)
    act = gate / (1.0 + gl.exp(-gate)) * up
    m_o = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
    n_o = gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
    positions = first + m_o
    out_ptrs = act_ptr + positions.to(gl.int64)[:, None] * I + n_o[None, :]
    gl.store(out_ptrs, act.to(gl.bfloat16), mask=(positions < end)[:, None] & (n_o < I)[None, :])


@gluon.jit
def moe_down_gluon_kernel(
    act_words_ptr, order_ptr, weights_ptr, blocks_ptr, packed_ptr, scale_ptr, scale_2_ptr, pair_out_ptr,
    MAX_BLOCKS,
    H: gl.constexpr, I_BYTES: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, num_warps: gl.constexpr,
):
    """The down launch in the same two-stage form: grid (block-table blocks, cdiv(H, BLOCK_N)); act [pairs, I] bfloat16
    in sorted order read as int32 words; writes pair_out[pair, H] float32 = the down products times the tensor scale and
    the pair's routing weight (as `nvfp4_gemm._moe_down_kernel`). One accumulator: two wgmmas of K 32 per step."""
    KB: gl.constexpr = 32
    expert, first, end = _block_bounds(blocks_ptr, gl.program_id(0), MAX_BLOCKS)
    if expert < 0:  # past the real block count
        return
    x_layout: gl.constexpr = _x_layout(num_warps)
    w_layout: gl.constexpr = _w_layout(num_warps)
    acc_layout: gl.constexpr = _acc_layout(BLOCK_N, num_warps)
    a_smem_layout: gl.constexpr = _tile_smem_layout(BLOCK_M)
    b_smem_layout: gl.constexpr = _tile_smem_layout(BLOCK_N)

    m_x = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_layout))
    safe_x = gl.minimum(first + m_x, end - 1)
    row_words = safe_x.to(gl.int64) * I_BYTES  # act row of sorted position p: I elements = I_BYTES words
    word_cols = gl.arange(0, KB, layout=gl.SliceLayout(0, x_layout))
    n_w = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, w_layout))
    down_rows = expert.to(gl.int64) * H + gl.minimum(gl.program_id(1) * BLOCK_N + n_w, H - 1)
    byte_cols = gl.arange(0, KB, layout=gl.SliceLayout(0, w_layout))

    a_even_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_M, KB], a_smem_layout)
    a_odd_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_M, KB], a_smem_layout)
    w_even_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, KB], b_smem_layout)
    w_odd_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, KB], b_smem_layout)

    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    for step in range(I_BYTES // KB):
        byte0 = step * KB
        stage = step % 2
        ae, ao = _x_halves(act_words_ptr, row_words, word_cols, byte0)
        we, wo = _weight_halves(packed_ptr, scale_ptr, down_rows, byte_cols, I_BYTES, byte0)
        gl.thread_barrier()  # every warpgroup waited for its step k-2: stage s is free
        a_even_s.index(stage).store(ae)
        a_odd_s.index(stage).store(ao)
        w_even_s.index(stage).store(we)
        w_odd_s.index(stage).store(wo)
        fence_async_shared()
        gl.thread_barrier()
        acc = warpgroup_mma(a_even_s.index(stage), w_even_s.index(stage).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(a_odd_s.index(stage), w_odd_s.index(stage).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=2, deps=(acc,))  # step k's two may still run
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    m_o = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
    n_o = gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
    positions = first + m_o
    valid = positions < end
    pairs = gl.load(order_ptr + gl.minimum(positions, end - 1))  # flat index t * top_k + j
    routing = gl.load(weights_ptr + pairs)
    y = acc * (gl.load(scale_2_ptr + expert) * 16384.0) * routing[:, None]
    out_ptrs = pair_out_ptr + pairs.to(gl.int64)[:, None] * H + n_o[None, :]
    gl.store(out_ptrs, y, mask=valid[:, None] & (n_o < H)[None, :])
