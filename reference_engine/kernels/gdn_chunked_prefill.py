"""Chunked Gated DeltaNet prefill (contract linear-attention/gdn-chunked-prefill), Triton, two launches.

The same computation as the torch op `reference_engine.ops.linear_attention.gdn_chunked_prefill`
(WY/UT form, float32 throughout). Each sequence is cut into chunks of C tokens (the last one may be
partial; chunks never cross a sequence boundary). Within a chunk, with q, k L2-normalised (q also
scaled by Dk^-0.5), c_i = g_1 + ... + g_i the cumulative log decay and c_last its value at the end:

    A[i, j]  = beta_i (k_i . k_j) exp(c_i - c_j)   for j < i (strictly lower), else 0
    T        = (I + A)^-1                            (unit lower triangular)
    U        = T (beta v)                  [C, Dv]   pseudo values
    W        = T (beta k exp(c))           [C, Dk]   state keys
    P[i, j]  = (q_i . k_j) exp(c_i - c_j)  for j <= i, else 0

and, chunk by chunk with the state S [Dk, Dv] carried from the previous chunk:

    X   = U - W S                                    (what each token writes)
    out = (q exp(c)) S + P X
    S  <- exp(c_last) S + (k exp(c_last - c))^T X

Launch 1, grid (chunk slots, Hv): one program per chunk and value head computes c, T (forward
substitution in registers, on the 16 x 16 diagonal blocks at once, then four block products:
`_unit_lower_inverse_blocked`), U, W, P and the per-row factors of q and k (normalisation times decay)
and stores them (float32 scratch: 81 KB per chunk and head at C = 64, Dk = Dv = 128, 45 MB at
T = 1024). Launch 2, grid (B, Hv, cdiv(Dv, BLOCK_V)): one program per sequence, value head and block
of value columns walks the sequence's chunks in order with its [Dk, BLOCK_V] slice of S in registers and writes the outputs
and the final state slice. Each program of launch 2 reads its slice of `initial_state` before it
writes the same slice of `final_state`, so the two may be one tensor.

The chunk table (start and length of every chunk slot, first slot and count per sequence) is built on
the host from the offsets the input check reads anyway (one copy to the device, no launches), with a fixed
number of slots, T // C + B (each sequence adds at most one partial chunk); unused slots have length 0
and are skipped. The result does not depend on the chunk
size; sizes above MAX_CHUNK are run at MAX_CHUNK (the register tile of launch 1 is C x C).
"""

from __future__ import annotations

import itertools

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
)
from reference_engine.ops.linear_attention import (
    _check_cu_seqlens,
    _check_out,
    _check_qkv,
    _require,
)
from reference_engine.ops.registry import satisfies

L2_EPS = 1e-6
MAX_CHUNK = 64  # tokens per chunk at most (launch 1 holds C x C and C x D tiles in registers)
MIN_DOT = 16  # tl.dot needs every dimension >= 16 on the GPU: smaller sizes are padded with zeros
BLOCK_V_MAX = 32  # value columns per program of launch 2 (Dv = 128: 4 column blocks per head)
BLOCK_D_MAX = 32  # columns of q, k, v per slice in launch 1
SUB_CHUNK = tl.constexpr(16)  # diagonal block of launch 1's blocked inverse (`_unit_lower_inverse_blocked`)
BLOCKED_INVERSE = True  # launch 1 inverts I + A blockwise (16 + 4 steps at C = 64); False: row-by-row substitution (64 steps)
PREPARE_WARPS = 0  # launch 1's warps at C = 64, Dk = Dv = 128 (0: NUM_WARPS; 4 fits two programs per SM at 255 registers: run40, 0.321 -> 0.279 ms per layer at 1024 tokens with the pipelined walk)
SCAN_STAGES = 0  # launch 2's chunk loop: 0 a while loop, >= 1 a range loop pipelined with that many stages (run34: 2 stages 0.379 -> 0.327 ms per layer at 1024 tokens)
NUM_WARPS = 8  # both launches at C = 64, Dk = Dv = 128 (4 warps spill more; see below)
# float32 operands of tl.dot on the GPU, by the dtype of q, k, v. "tf32x3" (three tensor-core passes, about fp32
# accuracy) for float32 inputs: ptxas for sm_90 at the real shape, 8 warps: launch 1 255 registers, no spill;
# launch 2 255 registers, 720-byte stack. "tf32" (one pass, 10-bit significands, more than bfloat16's 7) for 16-bit
# inputs: run19 (H200, 1024 tokens, one layer) 0.354 ms against 0.641 ms, against the float32 torch op out rel
# 2.5e-3 and state rel 1.1e-3 (tf32x3: 4.9e-5 and 8.0e-7; fla, which transformers calls: 4.5e-3 and 3.1e-3), inside
# the contract's bfloat16 bounds (6e-3, 5e-3). "ieee" (exact fp32 FMA dot) spills far more (launch 2: 5.8 KB
# stack), so it is used only under the interpreter, which needs it (its reduced-precision dot paths are not the GPU's).
PRECISION_FOR = {torch.float32: "tf32x3", torch.bfloat16: "tf32", torch.float16: "tf32"}
DOT_PRECISION: str | None = None  # one precision for every dtype instead (benchmarks); None: PRECISION_FOR


@triton.jit
def _row_tile(ptr, start, length, head, col0, stride_t, stride_h,
              D: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK: tl.constexpr):
    """Rows start .. start + length - 1, columns col0 .. col0 + BLOCK - 1 of head `head` of a [T, H, D]
    tensor (row stride `stride_t`, head stride `stride_h`, unit column stride) in float32, as a [BLOCK_C, BLOCK]
    tile (zeros outside)."""
    rows = tl.arange(0, BLOCK_C)
    dims = col0 + tl.arange(0, BLOCK)
    mask = (rows < length)[:, None] & (dims < D)[None, :]
    offsets = ((start + rows).to(tl.int64) * stride_t + head * stride_h)[:, None] + dims[None, :]
    return tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _unit_lower_inverse_blocked(a, rows, cols, BLOCK_C: tl.constexpr, PRECISION: tl.constexpr):
    """(I + A)^-1 for A [C, C] strictly lower triangular, C <= 4 * SUB_CHUNK, in SUB_CHUNK + 4 steps instead of C.

    Split A = D + E: D the strictly lower parts of the SUB_CHUNK x SUB_CHUNK diagonal blocks, E the blocks below
    them. Tb = (I + D)^-1 is block diagonal; forward substitution computes it for all diagonal blocks at once: at
    step s, rows s, SUB + s, 2 SUB + s, ... (one per block; their columns are disjoint, so one merged row vector
    carries all of them). Then I + A = (I + D)(I + N) with N = Tb E strictly block-lower, so N^(C / SUB) = 0 and
    (I + A)^-1 = (I - N + N^2 - N^3) Tb: four C x C products. Exact algebra; in the worst case (identical keys,
    beta 1, no decay: A all ones below the diagonal) Tb is bidiagonal and N's powers stay small."""
    SUB: tl.constexpr = SUB_CHUNK
    tl.static_assert(BLOCK_C <= 4 * SUB)
    same_block = (rows // SUB)[:, None] == (cols // SUB)[None, :]
    d = tl.where(same_block, a, 0.0)
    tb = tl.zeros((BLOCK_C, BLOCK_C), dtype=tl.float32)
    for s in range(SUB):
        step_rows = (rows % SUB) == s  # one row per diagonal block
        d_rows = tl.sum(tl.where(step_rows[:, None], d, 0.0), axis=0)  # those rows of D, merged (disjoint columns)
        merged = tl.where((cols % SUB) == s, 1.0, 0.0) - tl.sum(d_rows[:, None] * tb, axis=0)
        tb = tl.where(step_rows[:, None] & same_block, merged[None, :], tb)
    eye = tl.where(rows[:, None] == cols[None, :], 1.0, 0.0)
    n = tl.dot(tb, tl.where(same_block, 0.0, a), input_precision=PRECISION)  # Tb E
    n2 = tl.dot(n, n, input_precision=PRECISION)
    n3 = tl.dot(n2, n, input_precision=PRECISION)
    return tl.dot(eye - n + n2 - n3, tb, input_precision=PRECISION)


@triton.jit
def _gdn_chunk_prepare_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, chunk_start_ptr, chunk_len_ptr,
    w_ptr, u_ptr, p_ptr, f_ptr, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_D: tl.constexpr,
    EPS: tl.constexpr, PRECISION: tl.constexpr, BLOCKED_INVERSE: tl.constexpr = True,
):
    """Per (chunk slot n, value head h): W [C, Dk], U [C, Dv], P [C, C] and the factors F [3, C] into the
    scratch at (n, h): F[0] = query row scale times exp(c), F[1] = key row scale times exp(c_last - c),
    F[2] = exp(c_last) in every entry.

    Only C x C tiles and [C, BLOCK_D] slices of q, k, v live in registers: the Gram matrices q k^T and
    k k^T of the raw rows are accumulated over BLOCK_D-column slices and normalised afterwards
    (entry i, j times the row scales of i and j), W and U are produced slice by slice."""
    slot = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    start = tl.load(chunk_start_ptr + slot)
    length = tl.load(chunk_len_ptr + slot)
    if length > 0:
        key_head = head // (HV // HK)
        rows = tl.arange(0, BLOCK_C)
        cols = tl.arange(0, BLOCK_C)
        row_ok = rows < length
        token_head = (start + rows).to(tl.int64) * HV + head  # [C] flat (token, value head)
        g = tl.load(g_ptr + token_head, mask=row_ok, other=0.0)
        beta = tl.load(beta_ptr + token_head, mask=row_ok, other=0.0)

        q_sq = tl.zeros((BLOCK_C,), dtype=tl.float32)
        k_sq = tl.zeros((BLOCK_C,), dtype=tl.float32)
        qk = tl.zeros((BLOCK_C, BLOCK_C), dtype=tl.float32)
        kk = tl.zeros((BLOCK_C, BLOCK_C), dtype=tl.float32)
        for col0 in range(0, BLOCK_K, BLOCK_D):
            q = _row_tile(q_ptr, start, length, key_head, col0, stride_qt, stride_qh, DK, BLOCK_C, BLOCK_D)
            k = _row_tile(k_ptr, start, length, key_head, col0, stride_kt, stride_kh, DK, BLOCK_C, BLOCK_D)
            q_sq += tl.sum(q * q, axis=1)
            k_sq += tl.sum(k * k, axis=1)
            qk += tl.dot(q, tl.trans(k), input_precision=PRECISION)
            kk += tl.dot(k, tl.trans(k), input_precision=PRECISION)
        q_scale_rows = tl.rsqrt(q_sq + EPS) * q_scale  # [C] L2 normalisation (and Dk^-0.5) of each query row
        k_scale_rows = tl.rsqrt(k_sq + EPS)  # [C]

        c = tl.cumsum(g, axis=0)  # [C]; padding rows have g = 0, so c stays at c_last there
        lower_eq = rows[:, None] >= cols[None, :]
        decay = tl.exp(tl.where(lower_eq, c[:, None] - c[None, :], float("-inf")))  # exp(c_i - c_j), j <= i
        kk = kk * k_scale_rows[:, None] * k_scale_rows[None, :]
        a = tl.where(rows[:, None] > cols[None, :], beta[:, None] * kk * decay, 0.0)
        if BLOCKED_INVERSE:
            t = _unit_lower_inverse_blocked(a, rows, cols, BLOCK_C, PRECISION)
        else:
            # T = (I + A)^-1 by forward substitution: row i of T = e_i - sum_{j < i} A[i, j] T[j, :].
            t = tl.zeros((BLOCK_C, BLOCK_C), dtype=tl.float32)
            for i in range(BLOCK_C):
                a_row = tl.sum(tl.where(rows[:, None] == i, a, 0.0), axis=0)  # A[i, :] over columns
                new_row = tl.where(cols == i, 1.0, 0.0) - tl.sum(a_row[:, None] * t, axis=0)
                t = tl.where(rows[:, None] == i, new_row[None, :], t)
        p = tl.where(lower_eq, qk * q_scale_rows[:, None] * k_scale_rows[None, :] * decay, 0.0)  # [C, C]

        base = slot * HV + head  # flat (chunk slot, value head)
        scratch_rows = base * BLOCK_C + rows  # [C]
        c_last = tl.sum(tl.where(rows == BLOCK_C - 1, c, 0.0), axis=0)
        factors = base * 3 * BLOCK_C + rows  # [C]: rows of the three [C] factor vectors
        tl.store(f_ptr + factors, q_scale_rows * tl.exp(c))  # query row factor: normalisation, Dk^-0.5, exp(c)
        tl.store(f_ptr + factors + BLOCK_C, k_scale_rows * tl.exp(c_last - c))  # key row factor to the chunk end
        tl.store(f_ptr + factors + 2 * BLOCK_C, tl.zeros((BLOCK_C,), dtype=tl.float32) + tl.exp(c_last))  # chunk decay
        tl.store(p_ptr + scratch_rows[:, None] * BLOCK_C + cols[None, :], p)
        key_weights = k_scale_rows * beta * tl.exp(c)  # [C]: normalised k times beta exp(c)
        for col0 in range(0, BLOCK_K, BLOCK_D):
            k = _row_tile(k_ptr, start, length, key_head, col0, stride_kt, stride_kh, DK, BLOCK_C, BLOCK_D)
            w = tl.dot(t, k * key_weights[:, None], input_precision=PRECISION)  # [C, BLOCK_D] of W
            tl.store(w_ptr + scratch_rows[:, None] * BLOCK_K + (col0 + tl.arange(0, BLOCK_D))[None, :], w)
        for col0 in range(0, BLOCK_DV, BLOCK_D):
            v = _row_tile(v_ptr, start, length, head, col0, stride_vt, stride_vh, DV, BLOCK_C, BLOCK_D)
            u = tl.dot(t, v * beta[:, None], input_precision=PRECISION)  # [C, BLOCK_D] of U
            tl.store(u_ptr + scratch_rows[:, None] * BLOCK_DV + (col0 + tl.arange(0, BLOCK_D))[None, :], u)


@triton.jit
def _scan_chunk(q_ptr, k_ptr, w_ptr, u_ptr, p_ptr, f_ptr, out_ptr, s_lo, s_hi, slot, start, length, live, head, key_head, cols, col_ok, strides,
                HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr):
    """One chunk of `_gdn_chunk_scan_kernel`: its outputs stored, the state halves returned. `live` False (a
    sequence with fewer chunks than the launch's loop count): every load is masked to zero and the chunk decay to
    one, so the state comes back unchanged and nothing is stored (length must be 0)."""
    HALF: tl.constexpr = BLOCK_K // 2
    rows = tl.arange(0, BLOCK_C)
    lo = tl.arange(0, HALF)
    hi = HALF + tl.arange(0, HALF)
    scratch_rows = (slot * HV + head) * BLOCK_C + rows  # [C]
    factors = (slot * HV + head) * 3 * BLOCK_C + rows  # [C]
    # X = U - W S
    x = tl.load(u_ptr + scratch_rows[:, None] * BLOCK_DV + cols[None, :], mask=col_ok[None, :] & live, other=0.0)  # [C, BV]
    w = tl.load(w_ptr + scratch_rows[:, None] * BLOCK_K + lo[None, :], mask=live, other=0.0)
    x -= tl.dot(w, s_lo, input_precision=PRECISION)
    w = tl.load(w_ptr + scratch_rows[:, None] * BLOCK_K + hi[None, :], mask=live, other=0.0)
    x -= tl.dot(w, s_hi, input_precision=PRECISION)
    # out = P X + (q exp(c)) S, q L2-normalised and scaled
    o = tl.dot(tl.load(p_ptr + scratch_rows[:, None] * BLOCK_C + rows[None, :], mask=live, other=0.0), x, input_precision=PRECISION)
    q_rows = tl.load(f_ptr + factors, mask=live, other=0.0)
    stride_qt, stride_qh, stride_kt, stride_kh = strides
    q = _row_tile(q_ptr, start, length, key_head, 0, stride_qt, stride_qh, DK, BLOCK_C, HALF)
    o += tl.dot(q * q_rows[:, None], s_lo, input_precision=PRECISION)
    q = _row_tile(q_ptr, start, length, key_head, HALF, stride_qt, stride_qh, DK, BLOCK_C, HALF)
    o += tl.dot(q * q_rows[:, None], s_hi, input_precision=PRECISION)
    # S <- exp(c_last) S + (k exp(c_last - c))^T X, k L2-normalised
    k_rows = tl.load(f_ptr + factors + BLOCK_C, mask=live, other=0.0)
    chunk_decay = tl.load(f_ptr + (slot * HV + head) * 3 * BLOCK_C + 2 * BLOCK_C, mask=live, other=1.0)
    k = _row_tile(k_ptr, start, length, key_head, 0, stride_kt, stride_kh, DK, BLOCK_C, HALF)
    s_lo = s_lo * chunk_decay + tl.dot(tl.trans(k * k_rows[:, None]), x, input_precision=PRECISION)
    k = _row_tile(k_ptr, start, length, key_head, HALF, stride_kt, stride_kh, DK, BLOCK_C, HALF)
    s_hi = s_hi * chunk_decay + tl.dot(tl.trans(k * k_rows[:, None]), x, input_precision=PRECISION)
    out_offsets = ((start + rows).to(tl.int64) * HV + head)[:, None] * DV + cols[None, :]
    tl.store(out_ptr + out_offsets, o.to(out_ptr.dtype.element_ty), mask=(rows < length)[:, None] & col_ok[None, :])
    return s_lo, s_hi


@triton.jit
def _scan_step(q_ptr, k_ptr, w_ptr, u_ptr, p_ptr, f_ptr, out_ptr, chunk_start_ptr, chunk_len_ptr, s_lo, s_hi, step, first, count,
               head, key_head, cols, col_ok, strides, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
               BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr):
    """Step `step` of a sequence's chunk loop when the loop runs the batch's largest count: past the sequence's own
    `count` the step is masked (`_scan_chunk`'s `live`) on a valid slot."""
    live = step < count
    slot = (first + tl.maximum(tl.minimum(step, count - 1), 0)).to(tl.int64)  # every load below is masked by `live`
    start = tl.load(chunk_start_ptr + slot, mask=live, other=0)
    length = tl.load(chunk_len_ptr + slot, mask=live, other=0)
    return _scan_chunk(q_ptr, k_ptr, w_ptr, u_ptr, p_ptr, f_ptr, out_ptr, s_lo, s_hi, slot, start, length, live, head, key_head, cols, col_ok, strides,
                       HK, HV, DK, DV, BLOCK_C, BLOCK_K, BLOCK_DV, PRECISION)  # fmt: skip


@triton.jit
def _gdn_chunk_scan_kernel(
    q_ptr, k_ptr, w_ptr, u_ptr, p_ptr, f_ptr, chunk_start_ptr, chunk_len_ptr, seq_first_ptr, seq_count_ptr,
    state_ptr, out_ptr, final_state_ptr, max_steps, stride_qt, stride_qh, stride_kt, stride_kh, slots_ptr, has_ptr,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_V: tl.constexpr,
    PRECISION: tl.constexpr, STAGES: tl.constexpr = 0, INTERPRETED: tl.constexpr = False, POOL: tl.constexpr = False,
):
    """Per (sequence b, value head h, column block): the chunks of b in order, S [Dk, BLOCK_V] in registers.

    S is held as two row halves [BLOCK_K / 2, BLOCK_V] (s_lo, s_hi) and every [C, Dk] operand is
    loaded as two [C, BLOCK_K / 2] halves right before its products, to bound the registers.
    STAGES 0: a while loop over the sequence's own chunk count (loaded). STAGES >= 1: a range loop of
    `max_steps` (the host's largest chunk count of the batch) that Triton software-pipelines with that many
    stages, the steps past a sequence's own count masked (`_scan_chunk`'s `live`)."""
    HALF: tl.constexpr = BLOCK_K // 2
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    cols = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)  # value columns [BV]
    key_head = head // (HV // HK)
    lo = tl.arange(0, HALF)
    hi = HALF + tl.arange(0, HALF)
    col_ok = cols < DV
    row = seq
    has_state = True
    if POOL:  # states as rows of a pool: sequence b's is row slots[b]; without a state it starts from zeros
        row = tl.load(slots_ptr + seq).to(tl.int64)
        has_state = tl.load(has_ptr + seq) != 0
    state_base = (row * HV + head) * DK * DV
    lo_offsets = state_base + lo[:, None] * DV + cols[None, :]
    hi_offsets = state_base + hi[:, None] * DV + cols[None, :]
    lo_mask = (lo < DK)[:, None] & col_ok[None, :]
    hi_mask = (hi < DK)[:, None] & col_ok[None, :]
    s_lo = tl.load(state_ptr + lo_offsets, mask=lo_mask & has_state, other=0.0)  # [HALF, BV]
    s_hi = tl.load(state_ptr + hi_offsets, mask=hi_mask & has_state, other=0.0)  # [HALF, BV]
    first = tl.load(seq_first_ptr + seq)
    count = tl.load(seq_count_ptr + seq)
    strides = (stride_qt, stride_qh, stride_kt, stride_kh)
    if STAGES == 0:
        step = 0
        while step < count:  # a while loop: the interpreter cannot take a loaded bound in range()
            slot = (first + step).to(tl.int64)
            step += 1
            start = tl.load(chunk_start_ptr + slot)
            length = tl.load(chunk_len_ptr + slot)
            s_lo, s_hi = _scan_chunk(q_ptr, k_ptr, w_ptr, u_ptr, p_ptr, f_ptr, out_ptr, s_lo, s_hi, slot, start, length, True, head, key_head, cols, col_ok, strides,
                                     HK, HV, DK, DV, BLOCK_C, BLOCK_K, BLOCK_DV, PRECISION)  # fmt: skip
    elif INTERPRETED:  # the same masked steps; the interpreter cannot take a runtime argument as a range bound
        step = 0
        while step < max_steps:
            s_lo, s_hi = _scan_step(q_ptr, k_ptr, w_ptr, u_ptr, p_ptr, f_ptr, out_ptr, chunk_start_ptr, chunk_len_ptr, s_lo, s_hi, step, first, count,
                                    head, key_head, cols, col_ok, strides, HK, HV, DK, DV, BLOCK_C, BLOCK_K, BLOCK_DV, PRECISION)  # fmt: skip
            step += 1
    else:
        for step in tl.range(0, max_steps, num_stages=STAGES):
            s_lo, s_hi = _scan_step(q_ptr, k_ptr, w_ptr, u_ptr, p_ptr, f_ptr, out_ptr, chunk_start_ptr, chunk_len_ptr, s_lo, s_hi, step, first, count,
                                    head, key_head, cols, col_ok, strides, HK, HV, DK, DV, BLOCK_C, BLOCK_K, BLOCK_DV, PRECISION)  # fmt: skip
    tl.store(final_state_ptr + lo_offsets, s_lo, mask=lo_mask)
    tl.store(final_state_ptr + hi_offsets, s_hi, mask=hi_mask)


_ONE_SEQUENCE_TABLES: dict[tuple[int, int, str], tuple[torch.Tensor, ...]] = {}  # (T, chunk, device) -> a one-sequence batch's table


def _chunk_table_from_offsets(offsets: list[int], num_tokens: int, chunk: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Chunk slots of a ragged batch, built on the host from the offsets the input check already read (one
    copy to the device, no launches). Returns chunk_start [N], chunk_len [N] (0 for unused slots),
    seq_first [B], seq_count [B], all int32, with N = T // C + B: sequence b owns slots seq_first[b] ..
    seq_first[b] + seq_count[b] - 1, slot j of it covering tokens cu[b] + j*C .. min(cu[b] + (j+1)*C, cu[b+1]) - 1.

    A one-sequence batch's table is kept per token count (never freed: a CUDA graph captured over it,
    `prefill_graphs.py`, reads it at every replay, and a capture may not copy from pageable host memory)."""
    key = (num_tokens, chunk, str(device))
    if len(offsets) == 2 and key in _ONE_SEQUENCE_TABLES:
        return _ONE_SEQUENCE_TABLES[key]
    table = _build_chunk_table(offsets, num_tokens, chunk, device)
    if len(offsets) == 2:
        _ONE_SEQUENCE_TABLES[key] = table
    return table


def _build_chunk_table(offsets: list[int], num_tokens: int, chunk: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    num_seqs = len(offsets) - 1
    num_slots = num_tokens // chunk + num_seqs
    start, length, first, counts = [0] * num_slots, [0] * num_slots, [], []
    slot = 0
    for begin, end in itertools.pairwise(offsets):
        first.append(slot)
        counts.append(-(-(end - begin) // chunk))
        for chunk_start in range(begin, end, chunk):
            start[slot], length[slot] = chunk_start, min(chunk, end - chunk_start)
            slot += 1
    table = torch.tensor(start + length + first + counts, dtype=torch.int32).to(device, non_blocking=True)
    return table[:num_slots], table[num_slots : 2 * num_slots], table[2 * num_slots : 2 * num_slots + num_seqs], table[2 * num_slots + num_seqs :]


@satisfies("linear-attention/gdn-chunked-prefill", major=1, devices=("cuda",), backend="triton")
def gdn_chunked_prefill(
    query: torch.Tensor,  # [T, Hk, Dk]
    key: torch.Tensor,  # [T, Hk, Dk]
    value: torch.Tensor,  # [T, Hv, Dv]
    g: torch.Tensor,  # [T, Hv] float32
    beta: torch.Tensor,  # [T, Hv] float32
    cu_seqlens: torch.Tensor,  # [B + 1] int32
    initial_state: torch.Tensor,  # [B, Hv, Dk, Dv] float32
    out: torch.Tensor,  # [T, Hv, Dv]
    final_state: torch.Tensor,  # [B, Hv, Dk, Dv] float32 (may be `initial_state`)
    chunk_size: int = 64,
    state_slots: torch.Tensor | None = None,  # [B] integer (device): initial_state / final_state are pools [S, Hv, Dk, Dv]
    has_initial_state: torch.Tensor | None = None,  # [B] bool (device), with state_slots: False starts from zeros
) -> None:
    """The gated delta rule over a ragged batch, chunk by chunk (WY/UT form, fp32), in two Triton launches.

    Validates like the torch op (one host read of `cu_seqlens`, as there). Chunk sizes above
    MAX_CHUNK run at MAX_CHUNK (the result does not depend on the chunk size). Beyond the contract, for the model's
    prefill (no gather or scatter launches around the op): with `state_slots` and `has_initial_state`, sequence b's
    state is row state_slots[b] of the contiguous pools `initial_state` / `final_state` (zeros where
    has_initial_state[b] is False; the two may be one pool)."""
    tokens, num_k_heads, k_dim, num_v_heads, v_dim = _check_qkv(query, key, value, g, beta)
    _require(isinstance(chunk_size, int) and chunk_size >= 1, f"chunk_size must be a positive integer, got {chunk_size!r}")
    num_seqs = cu_seqlens.shape[0] - 1 if cu_seqlens.dim() == 1 else -1
    pool = state_slots is not None
    _require(pool == (has_initial_state is not None), "state_slots and has_initial_state go together")
    if pool:
        _require(state_slots.dim() == 1 and state_slots.shape[0] == num_seqs and not state_slots.is_floating_point()
                 and tuple(has_initial_state.shape) == (num_seqs,) and has_initial_state.dtype == torch.bool,
                 f"state_slots must be integer [B={num_seqs}] and has_initial_state bool [B], got {state_slots.dtype} {tuple(state_slots.shape)} "
                 f"and {has_initial_state.dtype} {tuple(has_initial_state.shape)}")  # fmt: skip
        for name, tensor in (("initial_state", initial_state), ("final_state", final_state)):
            _require(tensor.dim() == 4 and tuple(tensor.shape[1:]) == (num_v_heads, k_dim, v_dim) and tensor.dtype == torch.float32 and tensor.is_contiguous(),
                     f"{name} must be a contiguous float32 pool [S, Hv={num_v_heads}, Dk={k_dim}, Dv={v_dim}], got {tensor.dtype} {tuple(tensor.shape)}")  # fmt: skip
    else:
        _check_out(initial_state, (num_seqs, num_v_heads, k_dim, v_dim), torch.float32, "initial_state")
        _check_out(final_state, (num_seqs, num_v_heads, k_dim, v_dim), torch.float32, "final_state")
    _check_out(out, (tokens, num_v_heads, v_dim), value.dtype, "out")
    offsets = _check_cu_seqlens(cu_seqlens, tokens)
    require_launchable(query, key, value, g, beta, cu_seqlens, initial_state, out, final_state, *((state_slots, has_initial_state) if pool else ()))
    if tokens == 0:
        if pool:  # every sequence keeps its state (zeros without one)
            rows = initial_state[state_slots]
            final_state.index_copy_(0, state_slots, rows.masked_fill(~has_initial_state[:, None, None, None], 0.0))
        else:
            final_state.copy_(initial_state)
        return

    chunk = min(chunk_size, MAX_CHUNK)
    block_c = max(MIN_DOT, next_power_of_2(chunk))
    block_k = max(2 * MIN_DOT, next_power_of_2(k_dim))  # launch 2 splits Dk in two halves
    block_dv = max(MIN_DOT, next_power_of_2(v_dim))
    block_v = min(BLOCK_V_MAX, block_dv)
    precision = "ieee" if interpreting() else DOT_PRECISION or PRECISION_FOR[query.dtype]
    chunk_start, chunk_len, seq_first, seq_count = _chunk_table_from_offsets(offsets, tokens, chunk, query.device)
    max_steps = max(-(-(end - begin) // chunk) for begin, end in itertools.pairwise(offsets))  # launch 2's loop count (SCAN_STAGES >= 1)
    num_slots = chunk_start.shape[0]
    device = query.device
    w, u, p, f = (  # W [N, Hv, C, Dk], U [N, Hv, C, Dv], P [N, Hv, C, C], F [N, Hv, 3, C], float32 (padded sizes)
        torch.empty(num_slots, num_v_heads, *shape, dtype=torch.float32, device=device)
        for shape in ((block_c, block_k), (block_c, block_dv), (block_c, block_c), (3, block_c))
    )
    # strided views (the conv output's q, k, v column ranges) are read in place: only the column stride must be 1
    q_in, k_in, v_in = (t if t.stride(2) == 1 else t.contiguous() for t in (query, key, value))
    q_scale = float(k_dim**-0.5)

    _gdn_chunk_prepare_kernel[(num_slots, num_v_heads)](
        q_in, k_in, v_in, g.contiguous(), beta.contiguous(), chunk_start, chunk_len, w, u, p, f, q_scale,
        q_in.stride(0), q_in.stride(1), k_in.stride(0), k_in.stride(1), v_in.stride(0), v_in.stride(1),
        HK=num_k_heads, HV=num_v_heads, DK=k_dim, DV=v_dim, BLOCK_C=block_c, BLOCK_K=block_k, BLOCK_DV=block_dv,
        BLOCK_D=min(BLOCK_D_MAX, block_k, block_dv), EPS=L2_EPS, PRECISION=precision, BLOCKED_INVERSE=BLOCKED_INVERSE, num_warps=(PREPARE_WARPS or NUM_WARPS) if block_c * block_k >= 64 * 128 else 4,
    )

    source = initial_state if initial_state.is_contiguous() else initial_state.contiguous()
    target = final_state if final_state.is_contiguous() else torch.empty_like(final_state, memory_format=torch.contiguous_format)
    buffer = staging_buffer(out)
    result = buffer if buffer.is_contiguous() else torch.empty(buffer.shape, dtype=buffer.dtype, device=buffer.device)
    _gdn_chunk_scan_kernel[(num_seqs, num_v_heads, cdiv(v_dim, block_v))](
        q_in, k_in, w, u, p, f, chunk_start, chunk_len, seq_first, seq_count, source, result, target, max_steps,
        q_in.stride(0), q_in.stride(1), k_in.stride(0), k_in.stride(1), state_slots if pool else chunk_start, has_initial_state if pool else chunk_start,
        HK=num_k_heads, HV=num_v_heads, DK=k_dim, DV=v_dim, BLOCK_C=block_c, BLOCK_K=block_k, BLOCK_DV=block_dv, BLOCK_V=block_v,
        PRECISION=precision, STAGES=SCAN_STAGES, INTERPRETED=interpreting(), POOL=pool, num_warps=NUM_WARPS if block_k * block_v >= 128 * 32 else 4,
    )
    if target is not final_state:
        final_state.copy_(target)
    if result is not buffer:
        buffer.copy_(result)
    finish(buffer, out)
