"""The whole batch-1 MoE block decode in one persistent launch (contract moe/moe-block-decode), Triton.

Why: at batch 1 the block is three dependent launches (`moe_decode.moe_block_decode`: the fused router, gate/up, down),
about 22 us a layer on the H200 for 16 MB of weights (run53: router 5.4 us, gate/up 8.3, down 8.6), so most of its
time is each launch's ramp and drain, not bytes. Here one launch of G programs (G = multiprocessors x
`PROGRAMS_PER_SM`, all resident at once) walks three phases separated by two grid-wide barriers:

1. router logits rows (`router._router_logits_rows`, the fused router's own code) and the shared expert's gate/up rows
   (`moe_decode._nvfp4_gate_up`; the shared expert does not wait for the routing), items dealt round-robin;
2. every program computes the top-k itself from the finished logits (`router._topk_pick`: the same bits in every
   program, so no third barrier; program 0 stores the routing rows), then the routed experts' gate/up rows, one item
   per (slot, row block);
3. the down rows of all slots (`moe_decode._down_slot`, `_shared_down`: the same float32 sum, in the same order, as the
   two-launch path's down kernel), stored once.

A barrier is a counter in `sync [3]`: each program's threads finish their stores (`debug_barrier`), one thread adds 1
with release semantics (GPU scope) and the program spins on acquiring reads until all G have arrived. After phase 3 each
program takes a ticket from the third counter; the last one puts the three back to zero (every program has then left
both barriers), so the next launch starts from zero. The intermediate values cross the barriers through global memory
(logits in x's dtype, the activation rounded to x's dtype, as the three-launch path rounds them).

Residency: a program that spins waits for every other program to arrive, so all G must be resident together. The wrapper
compiles first and checks registers, shared memory and warps against one multiprocessor's limits for
`PROGRAMS_PER_SM` (ValueError otherwise), and with `COOPERATIVE` (the default) launches the grid as a cooperative one
(Triton's `launch_cooperative_grid`, a CUDA launch attribute that graph capture keeps), so the driver schedules all G
together or refuses the launch instead of leaving some programs waiting for others to finish. The Triton interpreter runs programs one after another, so there (and with
`PHASED`) the same kernel runs as three launches, one phase each, with no barrier; under the interpreter the
activation goes through a float32 buffer that torch rounds between the launches (`launch.staging_buffer`'s reason).

Status: not yet run on a GPU (written in the seventeenth session, which had no machine): interpreter tests of every
phase and an offline sm_90 compile; `benchmarks/kernels/time_moe_persistent.py` times it against the three launches
and writes the tuning key `moe_block_persistent` (its plan, `on` 1 when faster). `moe_decode.moe_block_decode` sends
one-token blocks here only while `moe_decode.PERSISTENT` is set (that key's `on`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from reference_engine.kernels.launch import (
    finish,
    interpreting,
    next_power_of_2,
    require_launchable,
    staging_buffer,
)
from reference_engine.kernels.moe_decode import (
    _down_slot,
    _nvfp4_gate_up,
    _shared_down,
)
from reference_engine.kernels.router import (
    _router_logits_rows,
    _shared_slot,
    _topk_pick,
)
from reference_engine.ops.static_moe import (
    SharedNvfp4Expert,
    StackedNvfp4Experts,
    check_moe_block_decode,
)


@dataclass(frozen=True)
class PersistentPlan:
    """Tiles and launch shape of the persistent block (tuning key `moe_block_persistent` sets `PLAN` here and `moe_decode.PERSISTENT`)."""

    programs_per_sm: int = 1  # G = multiprocessors x this (all resident: checked before the first launch)
    router_rows: int = 2  # logits rows per phase-1 item
    gate_up_block_n: int = 8  # gate (and up) rows per gate/up item
    gate_up_block_k: int = 256  # packed bytes per K step of a gate/up item
    down_block_h: int = 8  # output rows per down item
    down_block_i: int = 256  # packed bytes per K step of a down item
    loop: int = 3  # gate/up K loop and down slot loop: 0 plain, 1 unrolled, n >= 2 pipelined n stages
    words: int = 2  # weight reads as `moe_decode.WORDS`: 0 bytes, 1 int32 words, 2 packed float16 pairs (bfloat16 x)
    num_warps: int = 4


PLAN = PersistentPlan()
PHASED = False  # three launches, one phase each, no barrier (the interpreter always; on a GPU for tests)
COOPERATIVE = True  # launch PHASE 0 as a cooperative grid: the driver refuses a grid that cannot be resident at once
_SM_COUNT_CPU = 4  # programs under the interpreter: several, so that the round-robin dealing is exercised
_SYNC: dict[torch.device, torch.Tensor] = {}
_RESIDENT: dict[tuple, int] = {}  # (device, compiled configuration) -> programs per multiprocessor that fit


@triton.jit
def _grid_sync(counter_ptr, expected):
    """Wait until `expected` programs have arrived at this counter; stores before it are visible to loads after it."""
    tl.debug_barrier()  # every thread's stores are issued before the arrival (release, GPU scope)
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    arrived = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while arrived < expected:
        arrived = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()  # no thread reads past the barrier before the acquiring read


@triton.jit
def _store_act(act_ptr, slot, rows, row_ok, gate, up, I: tl.constexpr):
    act = gate * tl.sigmoid(gate) * up
    tl.store(act_ptr + slot * I + rows, act.to(act_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def _moe_block_persistent_kernel(
    x_ptr, x_in_ptr, router_w_ptr, logits_ptr, weights_ptr, ids_ptr,
    gu_ptr, gu_scale_ptr, gu_scale_2_ptr, down_ptr, down_scale_ptr, down_scale_2_ptr,
    sh_gu_ptr, sh_gu_scale_ptr, sh_gu_scale_2_ptr, sh_down_ptr, sh_down_scale_ptr, sh_down_scale_2_ptr,
    act_ptr, act_in_ptr, out_ptr, sync_ptr,
    E: tl.constexpr, H: tl.constexpr, I: tl.constexpr, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    ROUTER_ROWS: tl.constexpr, ROUTER_BLOCK_H: tl.constexpr, GU_BLOCK_N: tl.constexpr, GU_BLOCK_K: tl.constexpr, DOWN_BLOCK_H: tl.constexpr, DOWN_BLOCK_I: tl.constexpr,
    LOOP: tl.constexpr, DECODE: tl.constexpr, PHASE: tl.constexpr, PROGRAMS: tl.constexpr,
):
    """One token. PHASE 0: all three phases with grid barriers (every program resident); 1, 2, 3: that phase alone.
    x_ptr: x [H] for the router; x_in_ptr: x as the expert dot products read it (its int32 view when DECODE >= 3).
    act_ptr [TOP_K + 1, I]: written in x's dtype (float32 under the interpreter); act_in_ptr: the same as the down
    dot products read it. Slot TOP_K is the shared expert throughout. PROGRAMS: the grid's size."""
    pid = tl.program_id(0)
    ROUTER_ITEMS: tl.constexpr = (E + 1 + ROUTER_ROWS - 1) // ROUTER_ROWS
    GU_BLOCKS: tl.constexpr = (I + GU_BLOCK_N - 1) // GU_BLOCK_N
    DOWN_ITEMS: tl.constexpr = (H + DOWN_BLOCK_H - 1) // DOWN_BLOCK_H
    n_offsets = tl.arange(0, GU_BLOCK_N)
    if PHASE == 0 or PHASE == 1:  # router logits rows, and the shared expert's gate/up (independent of the routing)
        for round_ in range((ROUTER_ITEMS + GU_BLOCKS + PROGRAMS - 1) // PROGRAMS):
            item = pid + round_ * PROGRAMS
            if item < ROUTER_ITEMS:
                _router_logits_rows(x_ptr, router_w_ptr, logits_ptr, item, E, H, ROUTER_ROWS, ROUTER_BLOCK_H)
            elif item < ROUTER_ITEMS + GU_BLOCKS:
                rows = (item - ROUTER_ITEMS) * GU_BLOCK_N + n_offsets
                row_ok = rows < I
                gate, up = _nvfp4_gate_up(sh_gu_ptr, sh_gu_scale_ptr, sh_gu_scale_2_ptr, rows.to(tl.int64), row_ok, x_in_ptr, H, I,
                                          GU_BLOCK_N, GU_BLOCK_K, LOOP, DECODE)  # fmt: skip
                _store_act(act_ptr, TOP_K, rows, row_ok, gate, up, I)
    if PHASE == 0:
        _grid_sync(sync_ptr, PROGRAMS)
    if PHASE == 0 or PHASE == 2:  # the routing (every program), then the routed gate/up rows
        ids, weights, keep = _topk_pick(logits_ptr, E, TOP_K, BLOCK_E, BLOCK_K, True)
        slots = tl.arange(0, BLOCK_K)
        if pid == 0:
            tl.store(weights_ptr + slots, weights, mask=keep)
            tl.store(ids_ptr + slots, ids, mask=keep)
            _shared_slot(logits_ptr, weights_ptr, ids_ptr, E, TOP_K, True, True)
        for round_ in range((TOP_K * GU_BLOCKS + PROGRAMS - 1) // PROGRAMS):
            item = pid + round_ * PROGRAMS
            slot = tl.minimum(item // GU_BLOCKS, TOP_K)  # TOP_K (past the last slot): masked out below
            expert = tl.sum(tl.where(slots == slot, ids, 0), axis=0).to(tl.int64)
            rows = (item % GU_BLOCKS) * GU_BLOCK_N + n_offsets
            row_ok = (rows < I) & (slot < TOP_K)
            gate, up = _nvfp4_gate_up(gu_ptr, gu_scale_ptr, gu_scale_2_ptr + expert * 2, expert * 2 * I + rows, row_ok, x_in_ptr, H, I,
                                      GU_BLOCK_N, GU_BLOCK_K, LOOP, DECODE)  # fmt: skip
            _store_act(act_ptr, slot, rows, row_ok, gate, up, I)
    if PHASE == 0:
        _grid_sync(sync_ptr + 1, PROGRAMS)
    if PHASE == 0 or PHASE == 3:  # down rows: every slot's weighted sum in float32, slot order, then the shared slot
        for round_ in range((DOWN_ITEMS + PROGRAMS - 1) // PROGRAMS):
            rows = (pid + round_ * PROGRAMS) * DOWN_BLOCK_H + tl.arange(0, DOWN_BLOCK_H)
            row_ok = rows < H  # rows past H: an item past the last one, nothing loaded or stored
            acc = tl.zeros((DOWN_BLOCK_H,), dtype=tl.float32)
            first = pid * 0  # the token's first (token, slot) pair: 0, as a tensor
            if LOOP == 1:
                for j in tl.static_range(TOP_K):
                    acc += _down_slot(act_in_ptr, ids_ptr, weights_ptr, down_ptr, down_scale_ptr, down_scale_2_ptr, first + j, rows, row_ok, H, I, True,
                                      DOWN_BLOCK_H, DOWN_BLOCK_I, DECODE)  # fmt: skip
            elif LOOP > 1:
                for j in tl.range(TOP_K, num_stages=LOOP):
                    acc += _down_slot(act_in_ptr, ids_ptr, weights_ptr, down_ptr, down_scale_ptr, down_scale_2_ptr, first + j, rows, row_ok, H, I, True,
                                      DOWN_BLOCK_H, DOWN_BLOCK_I, DECODE)  # fmt: skip
            else:
                for j in range(TOP_K):
                    acc += _down_slot(act_in_ptr, ids_ptr, weights_ptr, down_ptr, down_scale_ptr, down_scale_2_ptr, first + j, rows, row_ok, H, I, True,
                                      DOWN_BLOCK_H, DOWN_BLOCK_I, DECODE)  # fmt: skip
            acc += _shared_down(act_in_ptr, weights_ptr, sh_down_ptr, sh_down_scale_ptr, sh_down_scale_2_ptr, first + TOP_K, rows, row_ok, H, I,
                                DOWN_BLOCK_H, DOWN_BLOCK_I, DECODE)  # fmt: skip
            tl.store(out_ptr + rows, acc.to(out_ptr.dtype.element_ty), mask=row_ok)
    if PHASE == 0:  # the last program out puts the counters back to zero (all have left both barriers)
        tl.debug_barrier()
        ticket = tl.atomic_add(sync_ptr + 2, 1, sem="acq_rel", scope="gpu")
        if ticket == PROGRAMS - 1:
            tl.store(sync_ptr, 0)
            tl.store(sync_ptr + 1, 0)
            tl.store(sync_ptr + 2, 0)


def sync_counters(device: torch.device) -> torch.Tensor:
    """The barrier counters of `device` (zero between launches; the last program of each launch resets them)."""
    counters = _SYNC.get(device)
    if counters is None:
        counters = torch.zeros(4, dtype=torch.int32, device=device)
        _SYNC[device] = counters
    return counters


def programs_that_fit(n_regs: int, shared_bytes: int, num_warps: int, properties) -> int:
    """Programs of this compiled kernel one multiprocessor holds at once: the least of the register file (registers
    allocated per warp in units of 256), shared memory, threads and the block limit."""
    threads = 32 * num_warps
    regs_per_warp = ((max(n_regs, 1) * 32 + 255) // 256) * 256
    by_regs = getattr(properties, "regs_per_multiprocessor", 65536) // (regs_per_warp * num_warps)
    smem = getattr(properties, "shared_memory_per_multiprocessor", 228 * 1024)
    by_smem = smem // shared_bytes if shared_bytes > 0 else 32
    by_threads = getattr(properties, "max_threads_per_multi_processor", 2048) // threads
    return max(0, min(by_regs, by_smem, by_threads, 32))


def _grid(device: torch.device, plan: PersistentPlan, phased: bool) -> int:
    if device.type != "cuda":
        return _SM_COUNT_CPU
    return torch.cuda.get_device_properties(device).multi_processor_count * (1 if phased else plan.programs_per_sm)


def moe_block_persistent(
    x: torch.Tensor,  # [1, H]
    router_weight: torch.Tensor,  # [E+1, H]: router rows, then shared_expert_gate's row
    experts: StackedNvfp4Experts,
    shared: SharedNvfp4Expert,
    top_k: int,
    out: torch.Tensor,  # [1, H]
    plan: PersistentPlan | None = None,
    routing: tuple[torch.Tensor, torch.Tensor] | None = None,  # tests: (weights [1, top_k + 1], ids [1, top_k + 1]) filled
) -> None:
    """The MoE block of one token in one launch (the signature of `ops.static_moe.moe_block_decode`, T = 1)."""
    block = prepare(x, router_weight, experts, shared, top_k, out, plan, routing)
    if block.phased:
        for phase in (1, 2, 3):
            block.run_phase(phase)
    else:
        block.run_all()
    block.finish()


@dataclass(frozen=True)
class PreparedBlock:
    """One call's kernel arguments (`prepare`): run the phases in order (`run_phase`), or all at once (`run_all`), then
    `finish` (the output out of its staging buffer)."""

    args: tuple  # the kernel's tensor arguments, act_in_ptr at ACT_IN
    constants: dict
    programs: int
    phased: bool
    rounding: tuple[torch.Tensor, torch.dtype, bool] | None  # interpreter: (float32 act, x's dtype, half) rounded before phase 3
    device: torch.device
    plan: PersistentPlan
    buffer: torch.Tensor
    out: torch.Tensor

    ACT_IN = 19  # position of act_in_ptr in `args`
    TARGET = 20  # position of out_ptr

    def run_phase(self, phase: int, programs: int | None = None) -> None:
        """One phase (1, 2, 3) as its own launch, no barrier. `programs`: a grid other than the one PROGRAMS names
        (tests: a known-wrong launch)."""
        args = list(self.args)
        if phase == 3 and self.rounding is not None:  # the activation rounded into x's dtype as the GPU stores it
            act, dtype, half = self.rounding
            rounded = act.to(dtype)
            args[self.ACT_IN] = rounded.view(torch.int32) if half else rounded.to(act.dtype)
        grid = self.programs if programs is None else programs
        _moe_block_persistent_kernel[(grid,)](*args, PHASE=phase, PROGRAMS=self.programs, **self.constants)

    def run_all(self) -> None:
        """The three phases in one launch with grid barriers (CUDA; every program resident, checked first)."""
        _check_resident(self.device, self.plan, self.constants, self.args, self.programs)
        _moe_block_persistent_kernel[(self.programs,)](*self.args, PHASE=0, PROGRAMS=self.programs, launch_cooperative_grid=COOPERATIVE,
                                                       **self.constants)  # fmt: skip

    def finish(self) -> None:
        target = self.args[self.TARGET]
        if target is not self.buffer:
            self.buffer.copy_(target)
        finish(self.buffer, self.out)


def prepare(
    x: torch.Tensor, router_weight: torch.Tensor, experts: StackedNvfp4Experts, shared: SharedNvfp4Expert, top_k: int, out: torch.Tensor,
    plan: PersistentPlan | None = None, routing: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> PreparedBlock:
    """Checks and the kernel arguments of `moe_block_persistent` (its parameters). Under the interpreter the logits, the
    activation and the routing weights start as NaN, so a phase that reads them before they are written shows in the
    output."""
    num_experts, intermediate = check_moe_block_decode(x, router_weight, experts, shared, top_k, out)
    if x.shape[0] != 1:
        raise ValueError(f"the persistent MoE block takes one token, got {x.shape[0]}")
    require_launchable(x, router_weight, out)
    p = plan if plan is not None else PLAN
    hidden = x.shape[1]
    interpreter = interpreting()
    half = p.words == 2 and x.dtype == torch.bfloat16
    decode = (4 if interpreter else 3) if half else (1 if interpreter else 2) if p.words else 0
    view = torch.int64 if half else torch.int32 if p.words else None
    routed = [experts.gate_up_packed, experts.gate_up_scale, experts.gate_up_scale_2, experts.down_packed, experts.down_scale, experts.down_scale_2]
    sh = [shared.gate_up_packed, shared.gate_up_scale, shared.gate_up_scale_2, shared.down_packed, shared.down_scale, shared.down_scale_2]
    routed, sh = [t.contiguous() for t in routed], [t.contiguous() for t in sh]
    require_launchable(x, *routed, *sh)
    if view is not None:  # codes as int64 scale blocks (half) or int32 words
        routed[0], routed[3], sh[0], sh[3] = (t.view(view) for t in (routed[0], routed[3], sh[0], sh[3]))
    x = x.contiguous()
    x_in = x.view(torch.int32) if half else x
    new = (lambda *shape, dtype: torch.full(shape, float("nan"), dtype=dtype)) if interpreter else (
        lambda *shape, dtype: torch.empty(shape, dtype=dtype, device=x.device))  # fmt: skip
    logits = new(num_experts + 1, dtype=x.dtype)
    if routing is not None:
        weights, ids = routing
    else:  # the interpreter starts the ids at 0 (in range) and the weights at NaN: read too early, they show in the output
        weights = new(1, top_k + 1, dtype=torch.float32)
        ids = torch.zeros(1, top_k + 1, dtype=torch.int32) if interpreter else torch.empty(1, top_k + 1, dtype=torch.int32, device=x.device)
    act = new(top_k + 1, intermediate, dtype=torch.float32 if interpreter else x.dtype)  # interpreter: torch rounds before phase 3
    act_in = act.view(torch.int32) if half and not interpreter else act
    buffer = staging_buffer(out)
    target = buffer if buffer.is_contiguous() else torch.empty(buffer.shape, dtype=buffer.dtype, device=buffer.device)
    constants = {
        "E": num_experts, "H": hidden, "I": intermediate, "TOP_K": top_k, "BLOCK_E": next_power_of_2(num_experts),
        "BLOCK_K": next_power_of_2(top_k), "ROUTER_ROWS": p.router_rows, "ROUTER_BLOCK_H": next_power_of_2(hidden),
        "GU_BLOCK_N": min(p.gate_up_block_n, next_power_of_2(intermediate)), "GU_BLOCK_K": min(p.gate_up_block_k, next_power_of_2(hidden // 2)),
        "DOWN_BLOCK_H": min(p.down_block_h, next_power_of_2(hidden)), "DOWN_BLOCK_I": min(p.down_block_i, next_power_of_2(intermediate // 2)),
        "LOOP": p.loop, "DECODE": decode, "num_warps": p.num_warps,
    }  # fmt: skip
    phased = PHASED or interpreter
    args = (x, x_in, router_weight.contiguous(), logits, weights, ids, *routed, *sh, act, act_in, target, sync_counters(x.device))
    assert args[PreparedBlock.ACT_IN] is act_in and args[PreparedBlock.TARGET] is target
    return PreparedBlock(args, constants, _grid(x.device, p, phased), phased, (act, x.dtype, half) if interpreter else None, x.device, p, buffer, out)


def _check_resident(device: torch.device, p: PersistentPlan, constants: dict, args: tuple, programs: int) -> None:
    """ValueError unless `p.programs_per_sm` programs of this configuration fit one multiprocessor together (a program
    spinning at a barrier waits for every other one; one that never becomes resident would hang the GPU)."""
    key = (device, p, COOPERATIVE, tuple(sorted(constants.items())), tuple(a.dtype for a in args))
    fit = _RESIDENT.get(key)
    if fit is None:
        compiled = _moe_block_persistent_kernel.warmup(*args, PHASE=0, PROGRAMS=programs, grid=(1,), launch_cooperative_grid=COOPERATIVE, **constants)
        compiled._init_handles()  # loads the binary: the register count is known from then on
        fit = programs_that_fit(compiled.n_regs, compiled.metadata.shared, compiled.metadata.num_warps, torch.cuda.get_device_properties(device))
        _RESIDENT[key] = fit
    if fit < p.programs_per_sm:
        raise ValueError(f"the persistent MoE block needs {p.programs_per_sm} programs per multiprocessor resident together; this "
                         f"configuration fits {fit} (registers, shared memory or threads): lower programs_per_sm or the tiles")  # fmt: skip
