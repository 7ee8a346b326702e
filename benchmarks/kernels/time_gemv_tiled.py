"""Time the batch-1 NVFP4 GEMVs reading tile-major copies of their weights against the row-major weights.

    PYTHONPATH=. python3 benchmarks/kernels/time_gemv_tiled.py OUT.json [--tuning FILE]

For each batch-1 GEMV of the tuning file (default: this card's, else the H200's; the LM head left out) that runs the
packed-float16 kernel (WORDS 2 or 3): random NVFP4 weights at that shape, copied until a graph of calls streams more
than the L2 (as in a decode step), and their tile-major copies for the committed tile (`nvfp4_gemv.tiled_gemv_weight`).
The outputs must be bit-equal before either form is timed. The two forms alternate over three rounds; each form's
fastest round counts. No speed is asserted. Where tile-major wins, the tuning's `gemv_tiled` 1 has the engine keep
such copies of its NVFP4 projections (`nvfp4_gemv.register_tiled_copy`, under 0.84 GB at full size).
"""

# ruff: noqa: B023 - `step` is captured and replayed within the loop iteration that made it
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_w4a16_gemv import CALLS, copies_for

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import nvfp4_gemv, tuning
from reference_engine.quant.nvfp4 import quantize_nvfp4

ROUNDS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--tuning", default=None, help="tuning file (default: this card's, else the H200's)")
    args = parser.parse_args()
    path = Path(args.tuning) if args.tuning else tuning.tuning_path(torch.cuda.get_device_name(), torch.cuda.get_device_capability())
    entries = json.loads(Path(path).read_text())["nvfp4_gemv"]
    torch.manual_seed(0)
    records = []
    for entry in entries:
        tokens, rows, k_bytes, config = entry["tokens"], entry["rows"], entry["k_bytes"], entry["config"]
        if tokens != 1 or rows > 65536 or len(config) < 7 or config[6] not in (2, 3):
            continue
        _, block_n, block_kb, split_k, warps, loop, words = config
        block_b = block_kb // 8
        cols = 2 * k_bytes
        packed, scale, scale_2 = quantize_nvfp4(torch.randn(rows, cols, device="cuda") * cols**-0.5)
        count = copies_for(packed.numel() + scale.numel())
        weights = [(packed, scale)] + [(packed.clone(), scale.clone()) for _ in range(count - 1)]
        copies = [nvfp4_gemv.tiled_gemv_weight(p, s, block_n, block_b) for p, s in weights]
        x = torch.randn(1, cols, device="cuda").bfloat16()
        outs = [torch.full((1, rows), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        for use_tiled, out in zip((False, True), outs, strict=True):
            nvfp4_gemv._launch_half(x, packed, scale, scale_2, out, block_n, block_b, split_k, warps, loop, fp8=words == 3,
                                    tiled=copies[0] if use_tiled else None)  # fmt: skip
        if not (torch.isfinite(outs[0]).all() and torch.equal(outs[0], outs[1])):
            raise SystemExit(f"{rows} x {cols}: the tile-major copy gives other bits than the row-major weights")
        rounds: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(ROUNDS):
            for use_tiled in (False, True):

                def step(weights=weights, copies=copies):
                    for index in range(CALLS):
                        p, s = weights[index % count]
                        nvfp4_gemv._launch_half(x, p, s, scale_2, outs[0], block_n, block_b, split_k, warps, loop, fp8=words == 3,
                                                tiled=copies[index % count] if use_tiled else None)  # fmt: skip

                rounds[use_tiled].append(graph_seconds(step) * 1e6 / CALLS)
        row_major, tile_major = min(rounds[False]), min(rounds[True])
        records.append({"rows": rows, "k_bytes": k_bytes, "config": config, "row_major_us": row_major, "tile_major_us": tile_major,
                        "ratio": tile_major / row_major, "rounds_us": {"row_major": rounds[False], "tile_major": rounds[True]}})  # fmt: skip
        print(f"GEMV {rows} x {cols} {config}: row-major {row_major:6.2f} us, tile-major {tile_major:6.2f} us, "
              f"ratio {tile_major / row_major:.3f} (bit-equal)", flush=True)  # fmt: skip
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "tuning": str(path), "records": records}, indent=1))


if __name__ == "__main__":
    main()
