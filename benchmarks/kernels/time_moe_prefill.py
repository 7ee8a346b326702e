"""Time the NVFP4 tensor-core GEMMs with the weight tile as the dot's second operand (swap 0) and as its first
(swap 1: wgmma reads the decoded tile from registers, the tokens are the dot's N), and the routed experts' token
block; write the winners into a tuning file.

    PYTHONPATH=. python3 benchmarks/kernels/time_moe_prefill.py results.json [tuning-in.json [tuning-out.json]] [--tiles | --gluon]

`--gluon`: the experts only, the committed plans against the gate/up launch in Gluon (`moe_prefill_gluon`, the
decoded weights as wgmma's register operand; token blocks 64 and 32, 128 and 64 rows) and against both launches in
Gluon; tuning-out gets `moe_prefill_gluon` 1 with the winner's rows and token block (`moe_prefill_gluon_down` 1 when
both launches won) for a gain of 2% or more over the faster of the committed plans and the variant that runs the same
kernels (a second sample of them: run50's committed time was 2.4% above its identical variant's).

`--tiles`: the experts only, the committed plans against the fused gate/up launch (`moe_prefill_fused_gate_up`, one
dot over interleaved gate and up rows, 128 or 64 rows of each) and decode 2 (`gemm_decode_moe`, the register operand)
at the tiles the keys express; tuning-out gets the best of them for a gain of 2% or more.

Routed experts (`nvfp4_moe_prefill`, 256 experts, H 2048, I 512, top-8, routing from random logits) at 1024
tokens: the committed plan, then each variant in `moe_variants`. Linears (`w4a16_gemm`): the decode batches' tiles
(8, 32 and 64 tokens at the stacked decode shapes, `small_m_gemm` from the tuning file) and prefill at 128 tokens
(below `dequant_min_tokens`), each with swap 0 and 1. Weights of the linears are cycled over copies that
together exceed the 60 MB L2, inside a CUDA graph (`time_gemm_tiles.weights`); the experts are 400 MB.
Every variant's output is compared with the committed plan's (another operand order or token block may differ by
summation order: relative error < 1e-2, else it is skipped). `tuning-out.json`: tuning-in plus `gemm_swap_moe`,
`moe_prefill_block_m_max`, `moe_prefill_gate_up_block_n` (from the 1024-token time) and `gemm_swap_linear` (summed
over the linear shapes), each changed only for a gain of 2% or more. No speed is asserted. (run26 and run27 timed
the one-step-ahead loads, `gemm_prefetch_*`, with this script: `benchmarks/NOTES.md`.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import nvfp4_gemm
from reference_engine.kernels.nvfp4_gemm import GemmPlan, plan
from reference_engine.kernels.tuning import apply_tuning
from reference_engine.quant.nvfp4 import quantize_nvfp4

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_gemm_tiles import (  # the sibling script's L2-cycling helpers
    time_linear,
    weights,
)

EXPERTS, HIDDEN, INTER, TOP_K = 256, 2048, 512, 8
MOE_TOKENS = (1024,)  # run26 also timed 256 (block_m 16 whatever the cap): `kernels/results/2026-12-03-h200-run26-moe-prefill.log`
LINEAR_SHAPES = [(12288, 2048), (9216, 2048), (2048, 4096)]  # GDN qkvz, attention qkv, out projections (rows, K)
LINEAR_TOKENS = (8, 32, 64, 128)
GAIN = 0.98  # a setting changes only if it is at least 2% faster


def stacked_experts():
    from reference_engine.ops import static_moe

    def stack(rows, cols):
        packed, scale, scale_2 = quantize_nvfp4(torch.randn(EXPERTS * rows, cols, device="cuda") * cols**-0.5)
        return packed.view(EXPERTS, rows, cols // 2), scale.view(EXPERTS, rows, cols // 16), scale_2

    gate_up, gu_scale, gu_s2 = stack(2 * INTER, HIDDEN)
    down, d_scale, d_s2 = stack(HIDDEN, INTER)
    return static_moe.StackedNvfp4Experts(gate_up, gu_scale, gu_s2.reshape(1, 1).expand(EXPERTS, 2).contiguous(), down, d_scale,
                                          d_s2.reshape(1).expand(EXPERTS).contiguous())  # fmt: skip


def with_fields(p: GemmPlan, **fields) -> GemmPlan:
    return GemmPlan(**(vars(p) | fields))


def moe_variants(tokens: int) -> dict[str, tuple[GemmPlan, GemmPlan]]:
    """label -> (gate/up plan, down plan); 'committed' first (the module's plans as the tuning file set them), then
    every combination of the operand order (swap 0/1), the largest token block (16/32/64) and the gate/up rows (64/128),
    with the committed prefetch setting (run26: prefetch 1 measured faster)."""
    pairs = tokens * TOP_K
    base_a, base_b = plan("moe_gate_up", pairs, INTER, HIDDEN, num_experts=EXPERTS), plan("moe_down", pairs, HIDDEN, INTER, num_experts=EXPERTS)
    found = {"committed": (base_a, base_b)}
    mean_group = -(-pairs // EXPERTS)
    for swap in (0, 1):
        for block_m_max in (16, 32, 64):
            block_m = max(16, min(block_m_max, 1 << (2 * mean_group - 1).bit_length()))  # as `plan` with the cap
            warps = 8 if block_m >= 64 else 4
            for rows in (64, 128):
                a = with_fields(base_a, block_m=block_m, num_warps=warps, block_n=rows, swap=swap)
                b = with_fields(base_b, block_m=block_m, num_warps=warps, swap=swap)
                found[f"swap {swap} block_m_max {block_m_max} rows {rows}"] = (a, b)
    return found


def tile_variants(tokens: int) -> dict[str, tuple[GemmPlan, GemmPlan]]:
    """`--tiles`: the committed plans, then the fused gate/up launch and (REGISTER) decode 2 (`register_variants`). (run35
    timed single changes no tuning key expresses, pipeline stages 2/4, a 128-element K step, 4 warps, 256 rows: none
    faster, `benchmarks/NOTES.md`.)"""
    base_a, base_b = plan("moe_gate_up", tokens * TOP_K, INTER, HIDDEN, num_experts=EXPERTS), plan("moe_down", tokens * TOP_K, HIDDEN, INTER, num_experts=EXPERTS)
    fused = {f"fused gate/up rows {rows}": (with_fields(base_a, block_n=rows, fused=1), base_b) for rows in (128, 64)}
    return {"committed": (base_a, base_b)} | fused | (register_variants(tokens) if REGISTER else {})


def gluon_variants(tokens: int) -> dict[str, tuple[GemmPlan, GemmPlan]]:
    """`--gluon`: the committed plans, then the gate/up launch in Gluon (`kernels/moe_prefill_gluon.py`, the decoded
    weights as wgmma's register operand) at token blocks 64 and 32 and 128 or 64 gate/up rows per program (8 or 4
    warps), alone and with the down launch in Gluon (128 rows), then both launches with a register cap (run49 timed four
    shared-memory stages: 390.6 against 378.7 us with three) and with the blocks of at most 32 tokens in 32-wide launches.
    Labels: 'gluon <launches> block_m <m> rows <n>[ registers <cap> | split <m>]'."""
    base_a, base_b = plan("moe_gate_up", tokens * TOP_K, INTER, HIDDEN, num_experts=EXPERTS), plan("moe_down", tokens * TOP_K, HIDDEN, INTER, num_experts=EXPERTS)
    found = {"committed": (base_a, base_b)}
    for launches in ("gate/up", "both"):
        for block_m, rows in ((64, 128), (64, 64), (32, 64)):
            down = with_fields(base_b, block_m=block_m, block_n=128, gluon=int(launches == "both"))
            found[f"gluon {launches} block_m {block_m} rows {rows}"] = (with_fields(base_a, gluon=1, block_m=block_m, block_n=rows), down)
    for cap in (168, 160):  # three 4-warp gate/up programs per SM fit under 170 registers (run49: 171, two fit)
        found[f"gluon both block_m 64 rows 64 registers {cap}"] = (with_fields(base_a, gluon=1, block_m=64, block_n=64, max_registers=cap),
                                                                  with_fields(base_b, gluon=1, block_m=64, block_n=128, max_registers=cap))  # fmt: skip
    # blocks of at most 32 tokens (about half of them at 1024 tokens) in 32-wide launches: less MMA padding
    found["gluon both block_m 64 rows 64 split 32"] = (with_fields(base_a, gluon=1, block_m=64, block_n=64, split_m=32),
                                                       with_fields(base_b, gluon=1, block_m=64, block_n=128, split_m=32))  # fmt: skip
    return found


def committed_label(tuning: dict) -> str:
    """The `gluon_variants` label that runs the same kernels as a tuning file's committed plans (none: '')."""
    if not tuning.get("moe_prefill_gluon"):
        return ""
    label = f"gluon {'both' if tuning.get('moe_prefill_gluon_down') else 'gate/up'} block_m {tuning.get('moe_prefill_block_m_max', 64)}"
    label += f" rows {tuning.get('moe_prefill_gate_up_block_n', 64)}"
    if tuning.get("moe_prefill_gluon_max_registers"):
        label += f" registers {tuning['moe_prefill_gluon_max_registers']}"
    return label + (f" split {tuning['moe_prefill_gluon_split_m']}" if tuning.get("moe_prefill_gluon_split_m") else "")


REGISTER = False  # decode 2 in `--tiles` (run36: 2.4 to 4.9 times slower than the committed plans, so left out since)


def register_variants(tokens: int) -> dict[str, tuple[GemmPlan, GemmPlan]]:
    """Decode 2 (`gemm_decode_moe` 2: straight into wgmma's register operand) at the tiles the tuning keys express."""
    saved = (nvfp4_gemm.DECODE_MOE, nvfp4_gemm.MOE_BLOCK_M_MAX, nvfp4_gemm.MOE_GATE_UP_BLOCK_N)
    found = {}
    try:
        for block_m_max, rows in ((64, 128), (64, 64), (32, 128), (32, 64)):
            nvfp4_gemm.DECODE_MOE, nvfp4_gemm.MOE_BLOCK_M_MAX, nvfp4_gemm.MOE_GATE_UP_BLOCK_N = 2, block_m_max, rows
            found[f"decode 2 block_m_max {block_m_max} rows {rows}"] = (plan("moe_gate_up", tokens * TOP_K, INTER, HIDDEN, num_experts=EXPERTS),
                                                                        plan("moe_down", tokens * TOP_K, HIDDEN, INTER, num_experts=EXPERTS))  # fmt: skip
    finally:
        nvfp4_gemm.DECODE_MOE, nvfp4_gemm.MOE_BLOCK_M_MAX, nvfp4_gemm.MOE_GATE_UP_BLOCK_N = saved
    return found


def time_moe(records: list, experts, variants=moe_variants) -> dict[str, float]:
    """Microseconds per call at 1024 tokens per variant label (NaN: output rejected)."""
    at_1024 = {}
    for tokens in MOE_TOKENS:
        x = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
        top = torch.softmax(torch.randn(tokens, EXPERTS, device="cuda") * 2.0, -1).topk(TOP_K, dim=-1)
        routing = (top.values / top.values.sum(-1, keepdim=True)).contiguous()
        ids = top.indices.int().contiguous()
        reference = None
        for label, plans in variants(tokens).items():
            out = torch.full((tokens, HIDDEN), float("nan"), dtype=torch.bfloat16, device="cuda")
            try:
                nvfp4_gemm.nvfp4_moe_prefill(x, routing, ids, experts, out, check_ids=False, plans=plans)
            except Exception as error:  # noqa: BLE001 - a variant that does not compile is reported, not fatal
                print(f"moe T={tokens} {label}: failed {type(error).__name__}: {str(error)[:300]}", flush=True)
                records.append({"part": "moe prefill", "tokens": tokens, "variant": label, "error": str(error)[:300]})
                at_1024[label] = float("nan")
                continue
            if reference is None:
                reference = out.clone()
            error = float((out.double() - reference.double()).norm() / reference.double().norm())
            identical = bool(torch.equal(out, reference))
            if not (torch.isfinite(out).all() and error < 1e-2):
                print(f"moe T={tokens} {label}: output rejected (error {error:.2e})", flush=True)
                records.append({"part": "moe prefill", "tokens": tokens, "variant": label, "rel_error": error, "rejected": True})
                at_1024[label] = float("nan")
                continue

            def step(out=out, plans=plans, x=x, routing=routing, ids=ids):
                for _ in range(4):
                    nvfp4_gemm.nvfp4_moe_prefill(x, routing, ids, experts, out, check_ids=False, plans=plans)

            us = graph_seconds(step) * 1e6 / 4
            if tokens == 1024:
                at_1024[label] = us
            records.append({"part": "moe prefill", "tokens": tokens, "variant": label, "us": us, "rel_error_vs_committed": error, "identical": identical,
                            "plans": [vars(p) for p in plans]})  # fmt: skip
            print(f"moe T={tokens:5d} {label:40s} {us:8.1f} us  vs committed: identical {identical}, error {error:.1e}", flush=True)
    return at_1024


def time_linears(records: list) -> dict[int, float]:
    """Summed microseconds over `LINEAR_SHAPES` x `LINEAR_TOKENS` per operand order (swap 0/1, committed prefetch)."""
    totals = {0: 0.0, 1: 0.0}
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    x_all = torch.randn(max(LINEAR_TOKENS), 4096, device="cuda").bfloat16()
    for rows, k in LINEAR_SHAPES:
        made = weights(rows, k)
        for tokens in LINEAR_TOKENS:
            x = x_all[:tokens, :k].contiguous()
            base = plan("linear", tokens, rows, k, sm)
            outs = {}
            for swap in (0, 1):
                us, error = time_linear(x, made, with_fields(base, swap=swap))
                totals[swap] += us
                outs[swap] = us
                records.append({"part": "linear", "tokens": tokens, "rows": rows, "k": k, "swap": swap, "us": us, "rel_error": error, "plan": vars(base)})
            print(f"linear {tokens:4d} x {rows:5d} x {k}: swap 0 {outs[0]:7.1f} us, 1 {outs[1]:7.1f} us", flush=True)
        del made
    return totals


def main(path: str, tuning_in: str | None, tuning_out: str | None, tiles: bool = False, gluon: bool = False) -> None:
    if tuning_in:
        apply_tuning(tuning_in)
    records: list = []
    experts = stacked_experts()
    moe = time_moe(records, experts, gluon_variants if gluon else tile_variants if tiles else moe_variants)
    del experts
    if gluon:  # `moe_prefill_gluon` (with its token block and rows) into the tuning file when at least 2% faster
        Path(path).write_text(json.dumps({"records": records, "moe_1024": moe}, indent=1))
        pick = min((label for label in moe if label.startswith("gluon") and moe[label] == moe[label]), key=moe.get, default=None)
        print(f"moe at 1024 tokens: committed {moe['committed']:.1f} us, best Gluon {pick!r} {moe.get(pick, float('nan')):.1f} us", flush=True)
        if tuning_in and tuning_out:
            tuning = json.loads(Path(tuning_in).read_text())
            baseline = min(moe["committed"], moe.get(committed_label(tuning), float("inf")))  # a second sample of the committed kernels
            if pick is not None and moe[pick] <= GAIN * baseline:
                _, launches, _, block_m, _, rows, *extra = pick.split()  # extra: [] or ["registers" | "split", value]
                tuning |= {"moe_prefill_gluon": 1, "moe_prefill_gate_up_block_n": int(rows), "moe_prefill_block_m_max": int(block_m)}
                tuning["moe_prefill_gluon_max_registers"] = int(extra[1]) if extra[:1] == ["registers"] else 0
                tuning["moe_prefill_gluon_split_m"] = int(extra[1]) if extra[:1] == ["split"] else 0
                if launches == "both":
                    tuning["moe_prefill_gluon_down"] = 1
            Path(tuning_out).write_text(json.dumps(tuning, indent=1) + "\n")
            keys = ("moe_prefill_gluon", "moe_prefill_gluon_down", "moe_prefill_gate_up_block_n", "moe_prefill_block_m_max", "moe_prefill_gluon_max_registers",
                    "moe_prefill_gluon_split_m")
            print("tuning:", {key: tuning.get(key) for key in keys}, flush=True)
        return
    if tiles:  # decode 2 at the best tiles into the tuning file when it is at least 2% faster
        Path(path).write_text(json.dumps({"records": records, "moe_1024": moe}, indent=1))
        pick = min((label for label in moe if label != "committed" and moe[label] == moe[label]), key=moe.get, default=None)
        print(f"moe at 1024 tokens: committed {moe['committed']:.1f} us, best {pick!r} {moe.get(pick, float('nan')):.1f} us", flush=True)
        if tuning_in and tuning_out:
            tuning = json.loads(Path(tuning_in).read_text())
            if pick is not None and moe[pick] <= GAIN * moe["committed"] and pick.startswith("fused"):
                tuning |= {"moe_prefill_fused_gate_up": 1, "moe_prefill_gate_up_block_n": int(pick.split()[-1])}
            elif pick is not None and moe[pick] <= GAIN * moe["committed"]:
                *_, block_m_max, _, rows = pick.split()
                tuning |= {"gemm_decode_moe": 2, "moe_prefill_block_m_max": int(block_m_max), "moe_prefill_gate_up_block_n": int(rows)}
            Path(tuning_out).write_text(json.dumps(tuning, indent=1) + "\n")
            print("tuning:", {key: tuning.get(key) for key in ("gemm_decode_moe", "moe_prefill_fused_gate_up", "moe_prefill_block_m_max", "moe_prefill_gate_up_block_n")}, flush=True)
        return
    linears = time_linears(records)
    best = min((label for label in moe if moe[label] == moe[label]), key=moe.get)
    print(f"moe at 1024 tokens: committed {moe['committed']:.1f} us, best {best!r} {moe[best]:.1f} us", flush=True)
    print(f"linears summed: swap 0 {linears[0]:.1f} us, swap 1 {linears[1]:.1f} us", flush=True)
    Path(path).write_text(json.dumps({"records": records, "moe_1024": moe, "linears": linears}, indent=1))
    if tuning_in and tuning_out:
        tuning = json.loads(Path(tuning_in).read_text())
        pick = min((label for label in moe if label != "committed" and moe[label] == moe[label]), key=moe.get)
        if moe[pick] <= GAIN * moe["committed"]:
            _, swap, _, block_m_max, _, rows = pick.split()
            tuning |= {"gemm_swap_moe": int(swap), "moe_prefill_block_m_max": int(block_m_max), "moe_prefill_gate_up_block_n": int(rows)}
        if linears[1] <= GAIN * linears[0]:
            tuning["gemm_swap_linear"] = 1
        Path(tuning_out).write_text(json.dumps(tuning, indent=1) + "\n")
        print("tuning:", {key: tuning.get(key) for key in ("gemm_swap_moe", "moe_prefill_block_m_max", "moe_prefill_gate_up_block_n", "gemm_swap_linear")}, flush=True)


if __name__ == "__main__":
    arguments = [a for a in sys.argv[1:] if a not in ("--tiles", "--gluon")]
    if len(arguments) not in (1, 2, 3):
        sys.exit(__doc__)
    main(arguments[0], arguments[1] if len(arguments) > 1 else None, arguments[2] if len(arguments) > 2 else None, tiles="--tiles" in sys.argv,
         gluon="--gluon" in sys.argv)  # fmt: skip
