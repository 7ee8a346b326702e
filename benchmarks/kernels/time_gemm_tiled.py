"""Time the decode-batch tensor-core GEMM reading tile-major copies of the linears against the row-major weights.

    PYTHONPATH=. python3 benchmarks/kernels/time_gemm_tiled.py OUT.json [--tokens 8,32,64]

At batches 8 to 64 every NVFP4 linear runs `nvfp4_gemm.w4a16_gemm` with the small-M plan (this card's tuning): 64
weight rows by 32 bytes a K step, the pattern that held a pure stream of the grouped MoE tiles to 1.8 TB/s (run74).
For each decode linear shape and batch: random NVFP4 weights, copied until a graph of calls streams more than the L2
(as in a decode step), and their tile-major copies for the plan's tile (`nvfp4_gemv.tiled_gemv_weight`). Outputs
must be bit-equal before either form is timed; the two forms alternate over three rounds and each form's fastest
round counts. No speed is asserted. `adopt_measured.py --gemm-tiled` turns on the tuning's `gemm_tiled` (the engine
then keeps such copies, `nvfp4_gemm.register_tiled_copies`, under 0.84 GB per tile at full size) where it wins.
"""

# ruff: noqa: B023 - `step` is captured and replayed within the loop iteration that made it
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_w4a16_gemv import CALLS, SHAPES, copies_for

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import nvfp4_gemm, nvfp4_gemv
from reference_engine.kernels.tuning import apply_for_cuda
from reference_engine.quant.nvfp4 import quantize_nvfp4

ROUNDS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--tokens", default="8,32,64")
    args = parser.parse_args()
    apply_for_cuda()
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    records = []
    for name, (rows, cols) in SHAPES.items():
        if rows > 65536:  # the LM head: bfloat16 in the bench's default model
            continue
        packed, scale, scale_2 = quantize_nvfp4(torch.randn(rows, cols, device="cuda") * cols**-0.5)
        count = copies_for(packed.numel() + scale.numel())
        weights = [(packed, scale)] + [(packed.clone(), scale.clone()) for _ in range(count - 1)]
        for tokens in (int(t) for t in args.tokens.split(",")):
            plan = nvfp4_gemm.plan("linear", tokens, rows, cols, sm_count)
            copies = [nvfp4_gemv.tiled_gemv_weight(p, s, plan.block_n, plan.block_kb // 8) for p, s in weights]
            x = torch.randn(tokens, cols, device="cuda").bfloat16()
            outs = [torch.full((tokens, rows), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2)]
            for copy, out in zip((None, copies[0]), outs, strict=True):
                nvfp4_gemm.w4a16_gemm(x, packed, scale, scale_2, out, plan, tiled=copy)
            if not (torch.isfinite(outs[0]).all() and torch.equal(outs[0], outs[1])):
                raise SystemExit(f"{name} at {tokens} tokens: the tile-major copy gives other bits than the row-major weights")
            rounds: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(ROUNDS):
                for use_tiled in (False, True):

                    def step(weights=weights, copies=copies):
                        for index in range(CALLS):
                            p, s = weights[index % count]
                            nvfp4_gemm.w4a16_gemm(x, p, s, scale_2, outs[0], plan, tiled=copies[index % count] if use_tiled else None)

                    rounds[use_tiled].append(graph_seconds(step) * 1e6 / CALLS)
            row_major, tile_major = min(rounds[False]), min(rounds[True])
            records.append({"shape": name, "rows": rows, "cols": cols, "tokens": tokens,
                            "plan": [plan.block_m, plan.block_n, plan.block_kb, plan.num_warps, plan.num_stages, plan.split_k],
                            "row_major_us": row_major, "tile_major_us": tile_major, "ratio": tile_major / row_major,
                            "rounds_us": {"row_major": rounds[False], "tile_major": rounds[True]}})  # fmt: skip
            print(f"GEMM {name} {rows} x {cols}, {tokens} tokens: row-major {row_major:6.2f} us, tile-major {tile_major:6.2f} us, "
                  f"ratio {tile_major / row_major:.3f} (bit-equal)", flush=True)  # fmt: skip
            del copies
        del weights
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "records": records}, indent=1))


if __name__ == "__main__":
    main()
