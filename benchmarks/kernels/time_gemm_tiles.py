"""Time the NVFP4 tensor-core GEMMs: weight decodes (`DECODES`: 0 bytes, 1 int32 words in PTX) at prefill shapes,
and the tiles of decode batches (BLOCK_N, warps, split-K); write the winners into a tuning file.

    PYTHONPATH=. python3 benchmarks/kernels/time_gemm_tiles.py results.json [tuning-out.json] [--decodes-only]

Prefill: 1024 tokens through the model's linears (GDN in_proj_qkv / in_proj_z / out_proj, attention q / o, the
shared expert's gate / up / down) and the routed experts (`nvfp4_moe_prefill`, top-8 of 256). Decode batches:
8, 32 and 64 tokens through the decode path's stacked linears (GDN qkvz, attention qkv, the out projections),
the tiles before this change, the split-K heuristic with each decode, and a grid of BLOCK_N x split-K.
Every configuration's output is checked against the torch op first (relative error < 1e-2, else it is
skipped); weights are cycled over copies that together exceed the 60 MB L2, inside a CUDA graph, so each call
streams its weights from HBM. `tuning-out.json`: the committed tuning file plus `gemm_decode` and
`small_m_gemm` from these timings. `--decodes-only`: at decode batches only the committed tiles under each
decode (no grid), and the committed `small_m_gemm` kept. No speed is asserted.
"""

# ruff: noqa: B023 - `step` is captured and replayed within the loop iteration that made it
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import nvfp4_gemm
from reference_engine.kernels.tuning import apply_for_cuda, device_file
from reference_engine.quant import linear as torch_linear
from reference_engine.quant.nvfp4 import quantize_nvfp4

PREFILL_TOKENS = 1024
PREFILL_SHAPES = [(8192, 2048), (4096, 2048), (2048, 4096), (512, 2048), (2048, 512)]
SMALL_SHAPES = [(12288, 2048), (9216, 2048), (2048, 4096)]
SMALL_TOKENS = (8, 32, 64)
GRID = [(block_n, 4 if block_n == 64 else 8, split) for block_n in (64, 128) for split in (1, 2, 4, 8, 16)]
L2_BYTES = 60e6
DECODES = (0, 1)  # compared at every prefill shape; the faster total is written as `gemm_decode`


def weights(rows: int, k: int):
    copies = min(64, max(2, math.ceil(3 * L2_BYTES / (rows * k * 0.5625))))
    made = [quantize_nvfp4(torch.randn(rows, k, device="cuda") * k**-0.5) for _ in range(copies)]
    return made


def time_linear(x: torch.Tensor, made: list, gemm_plan) -> tuple[float, float]:
    """(microseconds per call, relative error of the first copy against the torch op)."""
    packed, scale, scale_2 = made[0]
    expected = torch.empty(x.shape[0], packed.shape[0], dtype=torch.float32, device="cuda")
    torch_linear.w4a16_linear(x.float(), packed, scale, scale_2, expected)
    out = torch.full((x.shape[0], packed.shape[0]), float("nan"), dtype=x.dtype, device="cuda")
    nvfp4_gemm.w4a16_gemm(x, packed, scale, scale_2, out, gemm_plan=gemm_plan)
    error = float((out.double() - expected.double()).norm() / expected.double().norm())
    if not error < 1e-2:
        return float("nan"), error
    outs = [torch.empty_like(out) for _ in made]

    def step():
        for index, (p, s, s2) in enumerate(made):
            nvfp4_gemm.w4a16_gemm(x, p, s, s2, outs[index], gemm_plan=gemm_plan)

    return graph_seconds(step) * 1e6 / len(made), error


def with_decode(p, decode: int):
    return nvfp4_gemm.GemmPlan(p.block_m, p.block_n, p.block_kb, p.num_warps, p.num_stages, p.split_k, decode)


def prefill(records: list) -> dict[int, float]:
    totals = dict.fromkeys(DECODES, 0.0)
    x = torch.randn(PREFILL_TOKENS, 4096, device="cuda").bfloat16()
    for rows, k in PREFILL_SHAPES:
        made = weights(rows, k)
        base = nvfp4_gemm.plan("linear", PREFILL_TOKENS, rows, k, torch.cuda.get_device_properties(0).multi_processor_count)
        for decode in DECODES:
            us, error = time_linear(x[:, :k].contiguous(), made, with_decode(base, decode))
            totals[decode] += us
            flops = 2 * PREFILL_TOKENS * rows * k
            records.append({"part": "prefill linear", "tokens": PREFILL_TOKENS, "rows": rows, "k": k, "decode": decode, "us": us, "rel_error": error,
                            "tflops": flops / (us * 1e-6) / 1e12})  # fmt: skip
            print(f"prefill {PREFILL_TOKENS}x{rows}x{k} decode {decode}: {us:8.1f} us ({flops / (us * 1e-6) / 1e12:.0f} TFLOP/s), error {error:.1e}", flush=True)
        del made
    return totals


def moe(records: list) -> dict[int, float]:
    from reference_engine.ops import static_moe

    experts_count, hidden, inter, top_k = 256, 2048, 512, 8

    def stack(rows, cols):
        packed, scale, scale_2 = quantize_nvfp4(torch.randn(experts_count * rows, cols, device="cuda") * cols**-0.5)
        return packed.view(experts_count, rows, cols // 2), scale.view(experts_count, rows, cols // 16), scale_2

    gate_up, gu_scale, gu_s2 = stack(2 * inter, hidden)
    down, d_scale, d_s2 = stack(hidden, inter)
    experts = static_moe.StackedNvfp4Experts(gate_up, gu_scale, gu_s2.reshape(1, 1).expand(experts_count, 2).contiguous(), down, d_scale,
                                            d_s2.reshape(1).expand(experts_count).contiguous())  # fmt: skip
    totals = dict.fromkeys(DECODES, 0.0)
    for tokens in (PREFILL_TOKENS, 32):
        x = torch.randn(tokens, hidden, device="cuda").bfloat16()
        ids = torch.stack([torch.randperm(experts_count, device="cuda")[:top_k] for _ in range(tokens)]).int()
        routing = torch.softmax(torch.randn(tokens, top_k, device="cuda"), -1)
        outs = {}
        for decode in DECODES:
            nvfp4_gemm.DECODE = decode
            out = torch.full((tokens, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
            nvfp4_gemm.nvfp4_moe_prefill(x, routing, ids, experts, out, check_ids=False)
            outs[decode] = out

            def step(out=out):
                for _ in range(4):
                    nvfp4_gemm.nvfp4_moe_prefill(x, routing, ids, experts, out, check_ids=False)

            us = graph_seconds(step) * 1e6 / 4
            if tokens == PREFILL_TOKENS:
                totals[decode] += us
            records.append({"part": "moe grouped", "tokens": tokens, "decode": decode, "us": us})
            print(f"moe grouped T={tokens} decode {decode}: {us:8.1f} us", flush=True)
        same = all(torch.equal(outs[DECODES[0]], outs[decode]) for decode in DECODES)
        records.append({"part": "moe grouped", "tokens": tokens, "decodes_identical": same})
        print(f"moe grouped T={tokens}: decodes {DECODES} outputs identical: {same}", flush=True)
    nvfp4_gemm.DECODE = 0
    return totals


def small_batches(records: list, decode: int, grid: bool = True) -> list[dict]:
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    entries = []
    for rows, k in SMALL_SHAPES:
        made = weights(rows, k)
        for tokens in SMALL_TOKENS:
            x = torch.randn(tokens, k, device="cuda").bfloat16()
            block_m = nvfp4_gemm._pow2_between(tokens, 16, 64)
            auto = nvfp4_gemm.plan("linear", tokens, rows, k, sm)
            candidates = {"run12 tiles (128 rows, no split, decode 0)": nvfp4_gemm.GemmPlan(block_m, 128, 32, 8, 3, 1, 0)} if grid else {}
            candidates |= {**{f"auto decode {d}": with_decode(auto, d) for d in DECODES}}  # fmt: skip
            for block_n, warps, split in GRID if grid else ():
                candidates[f"grid {block_n}/{warps}/{split}"] = nvfp4_gemm.GemmPlan(block_m, block_n, 32, warps, 3, split, decode)
            best = None
            for name, p in candidates.items():
                try:
                    us, error = time_linear(x, made, p)
                except ValueError as failure:  # a split that leaves an empty K slice
                    us, error = float("nan"), float("nan")
                    print(f"  {name}: {failure}")
                records.append({"part": "small batch", "tokens": tokens, "rows": rows, "k": k, "name": name, "plan": list(vars(p).values()), "us": us, "rel_error": error})
                print(f"T={tokens:2d} {rows}x{k} {name:34s}: {us:7.1f} us (error {error:.1e})", flush=True)
                if name.startswith(("grid", "auto")) and not math.isnan(us) and (best is None or us < best[0]) and p.decode == decode:
                    best = (us, p)
            if best is not None:
                entries.append({"block_m": block_m, "rows": rows, "k": k, "config": [best[1].block_n, best[1].num_warps, best[1].split_k]})
        del made
    return entries


def main(path: str, tuning_out: str | None, grid: bool = True) -> None:
    torch.manual_seed(0)
    apply_for_cuda()  # the committed decode-batch tiles ("auto" plans)
    records: list = []
    totals = prefill(records)
    moe_totals = moe(records)
    decode = min(DECODES, key=lambda d: totals[d] + moe_totals[d])
    print(f"prefill linears decode {DECODES}: {[round(totals[d]) for d in DECODES]} us; moe: {[round(moe_totals[d]) for d in DECODES]} us -> decode {decode}", flush=True)
    Path(path).write_text(json.dumps(records, indent=1))
    entries = small_batches(records, decode, grid)
    Path(path).write_text(json.dumps(records, indent=1))
    if tuning_out:
        tuning = json.loads(device_file(torch.cuda.get_device_name()).read_text())
        tuning["gemm_decode"] = decode
        if grid:
            tuning["small_m_gemm"] = entries
        Path(tuning_out).write_text(json.dumps(tuning, indent=1) + "\n")
        print(f"wrote {tuning_out}: gemm_decode {decode}, {len(entries)} small-batch entries")


if __name__ == "__main__":
    arguments = [a for a in sys.argv[1:] if a != "--decodes-only"]
    if len(arguments) not in (1, 2) or any(a.startswith("--") for a in arguments):
        print(__doc__)
        raise SystemExit(2)
    main(arguments[0], arguments[1] if len(arguments) == 2 else None, grid="--decodes-only" not in sys.argv)
