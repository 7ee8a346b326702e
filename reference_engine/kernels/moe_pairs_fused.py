"""Decode MoE experts with the shared expert in one launch: gate/up programs first, then down programs that load their
weights before they wait for the activations (NVFP4, packed float16 dot products, bfloat16 x).

Why: at batch 1 `moe_decode` runs the experts as two launches, gate/up (576 programs) then down (256 programs), and
each is short and latency-bound (run76 on an H100: 8.1 and 8.8 us a layer, where the down projection's 5.3 MB need
about 2 us at the copy bandwidth). The down launch cannot start its weight loads before the gate/up launch has ended,
although its weights depend only on the expert ids, which the router wrote before either launch.

Here one launch of P_GU + P_D programs on a 1-D grid does both:
- programs 0 .. P_GU - 1 are `moe_decode`'s gate/up programs (pair p = t * (K + 1) + j, gate rows n * BLOCK_N..), the
  same code; each stores its activations, then adds 1 to its token's counter (release, GPU scope);
- programs P_GU .. are down programs, one per (token t, BLOCK_H output rows). Each first loads the codes and block
  scales of its rows for all K routed experts of the token (a [K, BLOCK_H, I/16] tile of int64 scale blocks) and of the
  shared expert, with the routing weights and tensor scales; then it waits until the token's counter reaches
  (K + 1) * cdiv(I, BLOCK_N), the token's gate/up program count (acquire reads, `_wait_for`); then reads the
  token's K + 1 activation rows from L2, forms the dot products and writes out[t, rows] =
  sum_j w_j * down_j(act_j) + w_shared * down_shared(act_shared). The last down program of a token (a second,
  per-token ticket) puts both counters back to zero, so a CUDA graph can replay the launch.

Deadlock freedom: a waiting program only waits for programs of lower index, and the GPU starts a grid's programs in
index order (observed, not a documented guarantee; the fallback would be a work index drawn from an atomic counter at
program start), so every gate/up program has started (and runs to its end without waiting) before any down program
waits (run78's CUDA tests at 1 to 8 tokens all ran to their end). Under the interpreter programs run one after
another in index order, so nothing ever spins.

Numerics: the gate/up programs are `moe_decode`'s, bit for bit. The down sums are the same products in the same
float16 pairs and float32 block sums, but the slots are added as a tree (`tl.sum` over the slot axis) rather than
one after another, so outputs agree with the two launches to float32 rounding of the slot sum (the tests bound it).

The router too (`BLOCK`, `fused_block_with_shared`): the fused router's programs (`router._router_logits_ticket`, with
the norm before the block when `moe_decode` folds it in) go first in the same grid. The one drawing a token's last ticket
runs the top-k, then marks the token routed (release). Gate/up programs wait for that mark (the ids, and the normed row
the norm writer stored before its ticket); down programs wait for it before loading their weights, then for the count.

Tuning keys `moe_pairs_fused_max_tokens` (`MAX_TOKENS`), `moe_pairs_fused_block` (`BLOCK`), `moe_pairs_fused_down_rows`
(`DOWN_BLOCK_H`), `moe_pairs_fused_warps` (`NUM_WARPS`) and `moe_pairs_fused_spin_ns` (`SPIN_NS`): off (`MAX_TOKENS` 0) until
`benchmarks/kernels/time_moe_pairs_fused.py` times it against the separate launches.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from reference_engine.kernels.launch import (
    cdiv,
    finish,
    interpreting,
    next_power_of_2,
    staging_buffer,
    ticket_counters,
)
from reference_engine.kernels.moe_decode import _gate_up_program
from reference_engine.kernels.nvfp4_half_dot import _block_dot_full, _x_half_pairs
from reference_engine.kernels.router import _router_logits_ticket, _topk_row
from reference_engine.ops.static_moe import SharedNvfp4Expert, StackedNvfp4Experts

MAX_TOKENS = 0  # the fused launch serves decode batches up to this many tokens (0: off)
BLOCK = False  # the router in the same launch too (`fused_block_with_shared`; tuning key `moe_pairs_fused_block`)
DOWN_BLOCK_H = 8  # output rows per down program (its tile: top_k x DOWN_BLOCK_H x I/16 int64 scale blocks)
NUM_WARPS = 4
SPIN_NS = 0  # nanoseconds a waiting program sleeps between two reads of its counter (0: it spins; tuning key `moe_pairs_fused_spin_ns`)


@triton.jit
def _wait_for(counter_ptr, target, ASM: tl.constexpr, SLEEP_NS: tl.constexpr = 0):
    """Spin until the int32 at `counter_ptr` reaches `target`, each read an acquire at GPU scope (`ld.acquire.gpu`), so
    what the producers stored before their release is visible to every load after the loop. ASM off (the interpreter,
    where programs run one after another): plain volatile reads.

    Why not volatile reads then one `atomic_add(ptr, 0, sem="acquire")`: Triton 3.6 drops an atomic add of 0 whose
    result is unused when it lowers to LLVM, so that acquire never reached the PTX (run78 on an H100: the down programs
    read stale activations). `tests/.../test_moe_pairs_fused.py` compiles the kernels for sm_90 and checks the PTX.

    SLEEP_NS > 0 (with ASM): `nanosleep` between reads. Every warp of every waiting program reads the same few counter
    words, all held by one L2 slice, while the gate/up programs stream their weights through the L2 (run79: the fused
    launch took 1.65x the two launches' time at one token); the sleep thins those reads."""
    seen = _load_acquire(counter_ptr, ASM)
    while seen < target:
        if ASM and SLEEP_NS > 0:
            seen = _sleep_then(seen, SLEEP_NS)
        seen = _load_acquire(counter_ptr, ASM)


@triton.jit
def _sleep_then(value, NS: tl.constexpr):
    """`value`, returned after `nanosleep.u32 NS` (not pure: the sleep stays where it is in the loop)."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;\n\tnanosleep.u32 $2;", "=r,r,r", [value, tl.full([], NS, tl.int32)], dtype=tl.int32,
                                     is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _load_acquire(ptr, ASM: tl.constexpr):
    """The int32 at `ptr`, read with acquire semantics at GPU scope (ASM), or a volatile read (interpreter)."""
    if ASM:
        return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1)
    else:
        return tl.load(ptr, volatile=True)


@triton.jit
def _down_program(
    d, act32_ptr, ids_ptr, weights_ptr, d_w_ptr, d_scale_ptr, d_s2_ptr, sd_w_ptr, sd_scale_ptr, sd_s2_ptr, out_ptr, counter_ptr,
    T, H: tl.constexpr, I: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, READY: tl.constexpr,
    ROW_BLOCKS: tl.constexpr, ASM: tl.constexpr, SLEEP_NS: tl.constexpr = 0,
):
    """Down program d: token d // ROW_BLOCKS, output rows (d % ROW_BLOCKS) * BLOCK_H.. (module docstring)."""
    SLOTS: tl.constexpr = TOP_K + 1
    NB: tl.constexpr = I // 16  # scale blocks (int64 code words) per down row
    token = d // ROW_BLOCKS
    rows = (d % ROW_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = rows < H
    slots = tl.arange(0, BLOCK_K)
    slot_ok = slots < TOP_K
    blocks = tl.arange(0, NB)
    pair0 = token * SLOTS
    experts = tl.load(ids_ptr + pair0 + slots, mask=slot_ok, other=0).to(tl.int64)  # [BK]
    slot_scale = tl.load(weights_ptr + pair0 + slots, mask=slot_ok, other=0.0) * tl.load(d_s2_ptr + experts, mask=slot_ok, other=0.0)
    # The weights first: they depend on the ids only, not on the activations this program waits for.
    offsets = (experts[:, None, None] * H + rows[None, :, None]) * NB + blocks[None, None, :]  # [BK, BH, NB]
    tile_ok = slot_ok[:, None, None] & row_ok[None, :, None]
    codes = tl.load(d_w_ptr + offsets, mask=tile_ok, other=0)
    scales = tl.load(d_scale_ptr + offsets, mask=tile_ok, other=0.0)
    shared_offsets = rows[:, None].to(tl.int64) * NB + blocks[None, :]  # [BH, NB]
    shared_codes = tl.load(sd_w_ptr + shared_offsets, mask=row_ok[:, None], other=0)
    shared_scales = tl.load(sd_scale_ptr + shared_offsets, mask=row_ok[:, None], other=0.0)
    shared_scale = tl.load(weights_ptr + pair0 + TOP_K) * tl.load(sd_s2_ptr)
    _wait_for(counter_ptr + token, READY, ASM, SLEEP_NS)
    shape: tl.constexpr = (BLOCK_K, BLOCK_H, NB)
    act_rows = act32_ptr + (pair0 + slots).to(tl.int64)[:, None] * (I // 2)  # [BK, 1] row pointers (int32 words)
    p0, p1, p2, p3, p4, p5, p6, p7 = _x_half_pairs(act_rows, blocks[None, :], slot_ok[:, None], ASM, True, True)  # [BK, NB] each
    dots = _block_dot_full(codes, tl.broadcast_to(p0[:, None, :], shape), tl.broadcast_to(p1[:, None, :], shape), tl.broadcast_to(p2[:, None, :], shape),
                           tl.broadcast_to(p3[:, None, :], shape), tl.broadcast_to(p4[:, None, :], shape), tl.broadcast_to(p5[:, None, :], shape),
                           tl.broadcast_to(p6[:, None, :], shape), tl.broadcast_to(p7[:, None, :], shape), ASM, True)  # fmt: skip
    per_slot = tl.sum(dots * scales.to(tl.float32), axis=2) * (1.0 / 1024.0)  # [BK, BH]: E2M1 * 2^-14 units, as `_nvfp4_rows_dot`
    acc = tl.sum(per_slot * (slot_scale * 16384.0)[:, None], axis=0)  # [BH]
    s0, s1, s2, s3, s4, s5, s6, s7 = _x_half_pairs(act32_ptr + (pair0 + TOP_K).to(tl.int64) * (I // 2), blocks, blocks < NB, ASM, True, True)
    shared_shape: tl.constexpr = (BLOCK_H, NB)
    shared_dots = _block_dot_full(shared_codes, tl.broadcast_to(s0[None, :], shared_shape), tl.broadcast_to(s1[None, :], shared_shape),
                                  tl.broadcast_to(s2[None, :], shared_shape), tl.broadcast_to(s3[None, :], shared_shape),
                                  tl.broadcast_to(s4[None, :], shared_shape), tl.broadcast_to(s5[None, :], shared_shape),
                                  tl.broadcast_to(s6[None, :], shared_shape), tl.broadcast_to(s7[None, :], shared_shape), ASM, True)  # fmt: skip
    acc += tl.sum(shared_dots * shared_scales.to(tl.float32), axis=1) * (1.0 / 1024.0) * (shared_scale * 16384.0)
    tl.store(out_ptr + token.to(tl.int64) * H + rows, acc.to(out_ptr.dtype.element_ty), mask=row_ok)
    done = tl.atomic_add(counter_ptr + T + token, 1, sem="relaxed", scope="gpu")  # every row block of the token is past its wait
    last = done == ROW_BLOCKS - 1
    if last:
        tl.store(counter_ptr + token, 0)
        tl.store(counter_ptr + T + token, 0)
    return last


@triton.jit
def _fused_pairs_kernel(
    x32_ptr, ids_ptr, weights_ptr, gu_w_ptr, gu_scale_ptr, gu_s2_ptr, d_w_ptr, d_scale_ptr, d_s2_ptr,
    sgu_w_ptr, sgu_scale_ptr, sgu_s2_ptr, sd_w_ptr, sd_scale_ptr, sd_s2_ptr, act_ptr, act32_ptr, out_ptr, counter_ptr, T,
    H: tl.constexpr, I: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, GU_BLOCK_N: tl.constexpr, GU_BLOCK_K: tl.constexpr,
    LOOP: tl.constexpr, DECODE: tl.constexpr, BLOCK_H: tl.constexpr, ROUND_BF16: tl.constexpr, SLEEP_NS: tl.constexpr = 0,
):
    """Grid (T * (TOP_K + 1) * cdiv(I, GU_BLOCK_N) + T * cdiv(H, BLOCK_H),): gate/up programs, then down programs."""
    GU_ROW_BLOCKS: tl.constexpr = (I + GU_BLOCK_N - 1) // GU_BLOCK_N
    READY: tl.constexpr = (TOP_K + 1) * GU_ROW_BLOCKS  # gate/up programs per token
    ROW_BLOCKS: tl.constexpr = (H + BLOCK_H - 1) // BLOCK_H
    pid = tl.program_id(0)
    if pid < T * READY:
        pair = pid // GU_ROW_BLOCKS
        _gate_up_program(pair, pid % GU_ROW_BLOCKS, x32_ptr, ids_ptr, gu_w_ptr, gu_scale_ptr, gu_s2_ptr, act_ptr, H, I, TOP_K, True, GU_BLOCK_N,
                         GU_BLOCK_K, sgu_w_ptr, sgu_scale_ptr, sgu_s2_ptr, True, LOOP, DECODE, ROUND_BF16)  # fmt: skip
        tl.debug_barrier()  # every thread's activations are stored before the count is raised (release, GPU scope)
        tl.atomic_add(counter_ptr + pair // (TOP_K + 1), 1, sem="release", scope="gpu")
    else:
        _down_program(pid - T * READY, act32_ptr, ids_ptr, weights_ptr, d_w_ptr, d_scale_ptr, d_s2_ptr, sd_w_ptr, sd_scale_ptr, sd_s2_ptr, out_ptr,
                      counter_ptr, T, H, I, TOP_K, BLOCK_K, BLOCK_H, READY, ROW_BLOCKS, DECODE == 5, SLEEP_NS)  # fmt: skip


@triton.jit
def _fused_block_kernel(
    rx_ptr, router_w_ptr, logits_ptr, ids_ptr, weights_ptr, x32_ptr, gu_w_ptr, gu_scale_ptr, gu_s2_ptr, d_w_ptr, d_scale_ptr, d_s2_ptr,
    sgu_w_ptr, sgu_scale_ptr, sgu_s2_ptr, sd_w_ptr, sd_scale_ptr, sd_s2_ptr, act_ptr, act32_ptr, out_ptr, counter_ptr, T, E,
    residual_ptr, norm_w_ptr, normed_ptr, residual_out_ptr, eps,
    H: tl.constexpr, I: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, ROUTER_ROWS: tl.constexpr,
    ROUTER_BLOCK_H: tl.constexpr, ROUTER_BLOCKS: tl.constexpr, GU_BLOCK_N: tl.constexpr, GU_BLOCK_K: tl.constexpr, LOOP: tl.constexpr,
    DECODE: tl.constexpr, BLOCK_H: tl.constexpr, ROUND_BF16: tl.constexpr, ADD_NORM: tl.constexpr, BF16: tl.constexpr, NORM_WRITER: tl.constexpr,
    SLEEP_NS: tl.constexpr = 0,
):
    """The whole block (module docstring, "The router too"). Grid (T * ROUTER_BLOCKS + T * (TOP_K + 1) * cdiv(I, GU_BLOCK_N)
    + T * cdiv(H, BLOCK_H),). Counters: [0, T) the router's tickets, [T, 2T) routed, [2T, 3T) gate/up counts, [3T, 4T) down done."""
    SLOTS: tl.constexpr = TOP_K + 1
    GU_ROW_BLOCKS: tl.constexpr = (I + GU_BLOCK_N - 1) // GU_BLOCK_N
    READY: tl.constexpr = SLOTS * GU_ROW_BLOCKS
    ROW_BLOCKS: tl.constexpr = (H + BLOCK_H - 1) // BLOCK_H
    pid = tl.program_id(0)
    routers = T * ROUTER_BLOCKS
    if pid < routers:
        routed = (pid // ROUTER_BLOCKS).to(tl.int64)  # the token (int64, as the router's code takes it)
        ticket = _router_logits_ticket(pid % ROUTER_BLOCKS, routed, rx_ptr, router_w_ptr, logits_ptr, counter_ptr, E, H, ROUTER_ROWS, ROUTER_BLOCK_H,
                                       residual_ptr, norm_w_ptr, normed_ptr, residual_out_ptr, eps, ADD_NORM, BF16, NORM_WRITER)  # fmt: skip
        if ticket == ROUTER_BLOCKS - 1:
            _topk_row(logits_ptr + routed * (E + 1), weights_ptr + routed * SLOTS, ids_ptr + routed * SLOTS, E, TOP_K, BLOCK_E, BLOCK_K, True, True)
            tl.store(counter_ptr + routed, 0)
            tl.debug_barrier()  # the ids and weights are stored before the token is marked routed (release, GPU scope)
            tl.atomic_xchg(counter_ptr + T + routed, 1, sem="release", scope="gpu")
    elif pid < routers + T * READY:
        g = pid - routers
        pair = g // GU_ROW_BLOCKS
        token = pair // SLOTS
        _wait_for(counter_ptr + T + token, 1, DECODE == 5, SLEEP_NS)  # the ids (and with ADD_NORM the normed x) are written
        _gate_up_program(pair, g % GU_ROW_BLOCKS, x32_ptr, ids_ptr, gu_w_ptr, gu_scale_ptr, gu_s2_ptr, act_ptr, H, I, TOP_K, True, GU_BLOCK_N,
                         GU_BLOCK_K, sgu_w_ptr, sgu_scale_ptr, sgu_s2_ptr, True, LOOP, DECODE, ROUND_BF16)  # fmt: skip
        tl.debug_barrier()  # every thread's activations are stored before the count is raised (release, GPU scope)
        tl.atomic_add(counter_ptr + 2 * T + token, 1, sem="release", scope="gpu")
    else:
        d = pid - routers - T * READY
        token = d // ROW_BLOCKS
        _wait_for(counter_ptr + T + token, 1, DECODE == 5, SLEEP_NS)  # the ids are written: the down weights can be loaded
        last = _down_program(d, act32_ptr, ids_ptr, weights_ptr, d_w_ptr, d_scale_ptr, d_s2_ptr, sd_w_ptr, sd_scale_ptr, sd_s2_ptr, out_ptr,
                             counter_ptr + 2 * T, T, H, I, TOP_K, BLOCK_K, BLOCK_H, READY, ROW_BLOCKS, DECODE == 5, SLEEP_NS)  # fmt: skip
        if last:
            tl.store(counter_ptr + T + token, 0)


def runs(num_tokens: int, dtype: torch.dtype) -> bool:
    """True when `moe_decode` hands this batch's per-pair experts to the fused launch: on, within `MAX_TOKENS`, bfloat16
    x (the launch reads x and the activations as float16 pairs and decodes the codes through E4M3, `moe_decode`'s WORDS 3)."""
    return 1 <= num_tokens <= MAX_TOKENS and dtype == torch.bfloat16


@dataclasses.dataclass(frozen=True)
class _Launch:
    """What both launches share: the activation buffer, the output target, the expert tensors as the kernels take them
    (codes as int64 scale blocks), the common constexprs, and the gate/up plus down program count."""

    act: torch.Tensor
    buffer: torch.Tensor
    target: torch.Tensor
    expert_args: tuple
    constants: dict
    expert_programs: int

    def finish(self, out: torch.Tensor) -> None:
        if self.target is not self.buffer:
            self.buffer.copy_(self.target)
        finish(self.buffer, out)


def _launch_setup(x, experts: StackedNvfp4Experts, shared: SharedNvfp4Expert, top_k: int, out, gate_up_tiles: tuple[int, int, int]) -> _Launch:
    num_tokens, hidden = x.shape
    intermediate = int(experts.gate_up_packed.shape[1]) // 2
    if intermediate % 16 or hidden % 16:
        raise ValueError(f"the fused launch needs H and I multiples of 16, got H={hidden}, I={intermediate}")
    loop, block_n, block_k = gate_up_tiles
    block_n = min(block_n, next_power_of_2(intermediate))
    block_h = min(DOWN_BLOCK_H, next_power_of_2(hidden))
    slots = top_k + 1
    act = torch.empty(num_tokens * slots, intermediate, dtype=torch.bfloat16, device=x.device)
    buffer = staging_buffer(out)
    target = buffer if buffer.is_contiguous() else torch.empty(buffer.shape, dtype=buffer.dtype, device=buffer.device)
    i64 = torch.int64
    expert_args = (experts.gate_up_packed.view(i64), experts.gate_up_scale, experts.gate_up_scale_2, experts.down_packed.view(i64), experts.down_scale,
                   experts.down_scale_2, shared.gate_up_packed.view(i64), shared.gate_up_scale, shared.gate_up_scale_2, shared.down_packed.view(i64),
                   shared.down_scale, shared.down_scale_2, act, act.view(torch.int32), target)  # fmt: skip
    constants = {
        "H": hidden, "I": intermediate, "TOP_K": top_k, "BLOCK_K": next_power_of_2(top_k), "GU_BLOCK_N": block_n,
        "GU_BLOCK_K": min(block_k, next_power_of_2(hidden // 2)), "LOOP": loop,
        "DECODE": 6 if interpreting() else 5,  # the packed float16 pairs with the E4M3 decode (interpreter form / PTX)
        "BLOCK_H": block_h, "ROUND_BF16": interpreting(), "SLEEP_NS": SPIN_NS, "num_warps": NUM_WARPS,
    }  # fmt: skip
    programs = num_tokens * (slots * cdiv(intermediate, block_n) + cdiv(hidden, block_h))
    return _Launch(act, buffer, target, expert_args, constants, programs)


def fused_pairs_with_shared(
    x: torch.Tensor,  # [T, H] bfloat16, contiguous
    topk_weights: torch.Tensor,  # [T, top_k + 1] float32
    topk_ids: torch.Tensor,  # [T, top_k + 1] int32, the shared slot last
    experts: StackedNvfp4Experts,  # contiguous
    shared: SharedNvfp4Expert,  # contiguous
    out: torch.Tensor,  # [T, H]
    gate_up_tiles: tuple[int, int, int],  # (LOOP, BLOCK_N, BLOCK_K bytes) of the gate/up programs, as `moe_decode` would launch them
) -> None:
    """The routed experts plus the weighted shared expert in one launch (module docstring); inputs as `moe_decode._launch`
    takes them after its checks. Writes every element of `out`."""
    num_tokens = x.shape[0]
    if num_tokens == 0:
        return
    launch = _launch_setup(x, experts, shared, topk_ids.shape[1] - 1, out, gate_up_tiles)
    _fused_pairs_kernel[(launch.expert_programs,)](
        x.view(torch.int32), topk_ids, topk_weights, *launch.expert_args, ticket_counters(x.device, 2 * num_tokens), num_tokens, **launch.constants,
    )  # fmt: skip
    launch.finish(out)


def runs_block(num_tokens: int, x: torch.Tensor, router_weight: torch.Tensor) -> bool:
    """True when `moe_decode` hands the whole block (router included) to one launch: `BLOCK` on, `runs`, within the fused
    router's batches, contiguous x and router rows, the hidden size in one router step."""
    from reference_engine.kernels import router

    return (BLOCK and runs(num_tokens, x.dtype) and num_tokens <= router.FUSED_ROUTER_MAX_TOKENS and x.is_contiguous()
            and router_weight.is_contiguous() and next_power_of_2(x.shape[1]) <= router.ROUTER_BLOCK_H)  # fmt: skip


def fused_block_with_shared(
    x: torch.Tensor,  # [T, H] bfloat16, contiguous: the block's normed input (with `add_norm`: written by this launch)
    router_weight: torch.Tensor,  # [E+1, H]: router rows, then the shared expert's gate row
    experts: StackedNvfp4Experts,  # contiguous
    shared: SharedNvfp4Expert,  # contiguous
    top_k: int,
    out: torch.Tensor,  # [T, H]
    gate_up_tiles: tuple[int, int, int],
    router_x: torch.Tensor | None = None,  # with `add_norm`: the un-normed input the router programs read
    add_norm=None,  # ops.norms.AddNorm: the norm before the block, done by the router programs (`router` module docstring)
) -> None:
    """Router logits, top-k with the shared slot, the routed experts and the shared expert in one launch (module
    docstring, "The router too"); inputs as `moe_decode._block` takes them. Writes every element of `out`."""
    from reference_engine.kernels import router

    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return
    num_experts = router_weight.shape[0] - 1
    launch = _launch_setup(x, experts, shared, top_k, out, gate_up_tiles)
    logits = torch.empty(num_tokens, num_experts + 1, dtype=x.dtype, device=x.device)
    topk_weights = torch.empty(num_tokens, top_k + 1, dtype=torch.float32, device=x.device)
    topk_ids = torch.empty(num_tokens, top_k + 1, dtype=torch.int32, device=x.device)
    router_blocks = cdiv(num_experts + 1, router.ROUTER_ROWS)
    if add_norm is not None:
        norm = {"residual_ptr": add_norm.residual, "norm_w_ptr": add_norm.weight, "normed_ptr": add_norm.out, "residual_out_ptr": add_norm.residual_out,
                "eps": float(add_norm.eps), "ADD_NORM": True, "NORM_WRITER": router.NORM_WRITER}  # fmt: skip
    else:
        norm = {"residual_ptr": x, "norm_w_ptr": x, "normed_ptr": x, "residual_out_ptr": x, "eps": 0.0, "ADD_NORM": False, "NORM_WRITER": 0}
    _fused_block_kernel[(num_tokens * router_blocks + launch.expert_programs,)](
        x if add_norm is None else router_x, router_weight, logits, topk_ids, topk_weights, x.view(torch.int32), *launch.expert_args,
        ticket_counters(x.device, 4 * num_tokens), num_tokens, num_experts, BLOCK_E=next_power_of_2(num_experts), ROUTER_ROWS=router.ROUTER_ROWS,
        ROUTER_BLOCK_H=min(router.ROUTER_BLOCK_H, next_power_of_2(hidden)), ROUTER_BLOCKS=router_blocks, BF16=True, **launch.constants, **norm,
    )  # fmt: skip
    launch.finish(out)
