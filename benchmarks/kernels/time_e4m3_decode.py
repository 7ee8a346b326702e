"""Time the E4M3 decode of the packed-float16 NVFP4 kernels against the bit-placement decode, and write the winners.

    PYTHONPATH=. python3 benchmarks/kernels/time_e4m3_decode.py OUT.json --tuning IN.json --tuning-out OUT-tuning.json

The packed-float16 kernels (`nvfp4_half_dot`) decode 16 E2M1 codes per scale block either by placing each pair's bits in
a float16 (two shifts, two masks, an OR and a multiply per pair: the committed form) or, with the E4M3 decode, by placing
four codes' bits in the four bytes of a word and widening two bytes at a time with `cvt.rn.f16x2.e4m3x2` (about 26%
fewer instructions per step in the sm_90 SASS of the batch-1 GEMV). Whether that is faster depends on the conversion's
issue rate, which only the card can tell. Compared here, each pair in one process on the same weights:

- the batch-1 GEMVs of the tuning file (`nvfp4_gemv` entries at one token, the LM head excluded): the committed tile
  with WORDS 2 against the same tile with WORDS 3, and WORDS 3 with the other K-loop form (plain or unrolled);
- the MoE decode block (router, routed experts and the shared expert) at one token (`moe_decode_batch_one`, WORDS 2
  against 3), at 8 tokens (`moe_decode`, the same) and at 32 and 64 tokens (`moe_grouped_half`, fp8 0 against 1).

Each setting's output is checked against the torch op first (a setting more than 1e-2 off is not timed). Weights are
copied until a graph of calls streams more than the L2 from HBM, as in a real step. A setting replaces the committed
one in the written tuning file where it is at least 3% faster. No speed is asserted.
"""


from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import moe_decode, moe_grouped_half, tuning
from reference_engine.ops import static_moe
from reference_engine.quant.linear import w4a16_linear as torch_linear
from reference_engine.quant.nvfp4 import quantize_nvfp4

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_w4a16_gemv import (  # the sibling sweep's GEMV timing (cold copies, output checked first)
    copies_for,
    timed,
)
from time_moe_decode import COPIES, TOP_K, H, layer  # the MoE layer at the real shape

GAIN = 0.97  # a setting must be at least 3% faster to replace the committed one
MOE_CALLS = 8
MOE_TOKENS = (1, 8, 32, 64)


def gemv_rows(tuning_data: dict, records: list) -> None:
    """The batch-1 GEMV entries: committed tile, WORDS 3 on it, WORDS 3 with the other loop form."""
    for entry in tuning_data.get("nvfp4_gemv", []):
        tokens, rows, k_bytes, config = entry["tokens"], entry["rows"], entry["k_bytes"], tuple(entry["config"])
        if tokens != 1 or rows > 65536 or len(config) < 7 or config[6] not in (2, 3):
            continue
        cols = 2 * k_bytes
        packed, scale, scale_2 = quantize_nvfp4(torch.randn(rows, cols, device="cuda") * cols**-0.5)
        nbytes = packed.numel() + scale.numel() + 4
        weights = [(packed, scale, scale_2)] + [(packed.clone(), scale.clone(), scale_2) for _ in range(copies_for(nbytes) - 1)]
        x = torch.randn(1, cols, device="cuda").bfloat16()
        expected = torch.empty(1, rows, device="cuda", dtype=torch.bfloat16)
        torch_linear(x, packed, scale, scale_2, out=expected)
        committed = (*config[:6], 2)
        other_loop = 1 if config[5] == 0 else 0
        candidates = [committed, (*config[:6], 3), (*config[:5], other_loop, 3)]
        times = {}
        for candidate in candidates:
            error, seconds = timed(x, weights, torch.full_like(expected, float("nan")), expected, candidate)
            times[candidate] = seconds * 1e6
            records.append({"kind": "gemv", "rows": rows, "k_bytes": k_bytes, "config": list(candidate), "us": seconds * 1e6, "rel_error": error})
        best = min((c for c in candidates if times[c] == times[c]), key=times.get, default=committed)
        if best != committed and times[best] <= GAIN * times[committed]:
            entry["config"] = list(best)
        print(f"GEMV N={rows:5d} K bytes={k_bytes}: " + ", ".join(f"{list(c)} {times[c]:.2f} us" for c in candidates)
              + f" -> {entry['config']}", flush=True)  # fmt: skip
        del weights
        torch.cuda.empty_cache()


def moe_time(layers, xs, outs, expected) -> tuple[float, float]:
    """(relative error of the first copy's output against `expected`, microseconds per block call, cold)."""
    check = torch.full_like(expected, float("nan"))
    experts, shared, router = layers[0]
    moe_decode.moe_block_decode(xs[0], router, experts, shared, TOP_K, out=check)
    error = float((check.double() - expected.double()).norm() / expected.double().norm())
    if not error < 1e-2:
        return error, float("nan")

    def step():
        for index in range(MOE_CALLS):
            experts, shared, router = layers[index % COPIES]
            moe_decode.moe_block_decode(xs[index % COPIES], router, experts, shared, TOP_K, out=outs[index % COPIES])

    return error, graph_seconds(step) * 1e6 / MOE_CALLS


def moe_rows(tuning_data: dict, records: list) -> None:
    """The MoE block at each batch with the committed decode and with the E4M3 decode."""
    layers = [layer() for _ in range(COPIES)]
    for tokens in MOE_TOKENS:
        xs = [torch.randn(tokens, H, device="cuda").bfloat16() for _ in range(COPIES)]
        outs = [torch.empty(tokens, H, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
        expected = torch.empty_like(outs[0])
        experts, shared, router = layers[0]
        static_moe.moe_block_decode(xs[0], router, experts, shared, TOP_K, out=expected)
        grouped = moe_grouped_half.runs(tokens, torch.bfloat16)
        if grouped:
            key, base = "moe_grouped_half", moe_grouped_half.PLAN
            settings = {0: base, 1: replace(base, fp8=1)}
        else:
            key = "moe_decode_batch_one" if tokens == 1 and moe_decode.BATCH_ONE is not None else "moe_decode"
            base = moe_decode._settings(tokens)
            if base[5] not in (2, 3):
                print(f"MoE T={tokens}: {key} reads WORDS {base[5]}, not the packed float16 pairs; skipped", flush=True)
                continue
            settings = {0: (*base[:5], 2, base[6]), 1: (*base[:5], 3, base[6])}
        times = {}
        for fp8, setting in settings.items():
            if grouped:
                moe_grouped_half.PLAN = setting
            elif key == "moe_decode_batch_one":
                moe_decode.BATCH_ONE = setting
            else:
                (moe_decode.LOOP, moe_decode.GATE_UP_BLOCK_N, moe_decode.GATE_UP_BLOCK_K, moe_decode.DOWN_BLOCK_H, moe_decode.DOWN_BLOCK_I,
                 moe_decode.WORDS, moe_decode.DOWN_SPLIT) = setting  # fmt: skip
            error, us = moe_time(layers, xs, outs, expected)
            times[fp8] = us
            records.append({"kind": "moe block", "tokens": tokens, "key": key, "e4m3": fp8, "us": us, "rel_error": error})
        if grouped:
            moe_grouped_half.PLAN = base
        elif key == "moe_decode_batch_one":
            moe_decode.BATCH_ONE = base
        else:
            (moe_decode.LOOP, moe_decode.GATE_UP_BLOCK_N, moe_decode.GATE_UP_BLOCK_K, moe_decode.DOWN_BLOCK_H, moe_decode.DOWN_BLOCK_I,
             moe_decode.WORDS, moe_decode.DOWN_SPLIT) = base  # fmt: skip
        wins = times[1] == times[1] and times[1] <= GAIN * times[0]
        if wins and key in tuning_data:
            if grouped:
                tuning_data[key]["fp8"] = 1
            else:
                tuning_data[key]["WORDS"] = 3
        print(f"MoE T={tokens:2d} ({key}): bit placement {times[0]:.1f} us, E4M3 {times[1]:.1f} us, ratio {times[1] / times[0]:.3f}"
              + (" -> E4M3" if wins else ""), flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--tuning", required=True, help="the tuning file to start from (applied first)")
    parser.add_argument("--tuning-out", required=True, help="where to write it with the winning settings")
    args = parser.parse_args()
    torch.manual_seed(0)
    tuning.apply_tuning(args.tuning)
    tuning_data = json.loads(Path(args.tuning).read_text())
    records: list = []
    try:
        gemv_rows(tuning_data, records)
        moe_rows(tuning_data, records)
    finally:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "tuning": args.tuning, "records": records}, indent=1))
    Path(args.tuning_out).write_text(json.dumps(tuning_data, indent=1) + "\n")
    changed = sorted(key for key in tuning_data if tuning_data[key] != json.loads(Path(args.tuning).read_text()).get(key))
    print(f"tuning: wrote {args.tuning_out}; changed: {changed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
