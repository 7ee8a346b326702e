"""Time the committed batch-1 GEMV tiles with each K-loop form, and write the faster forms into a tuning file.

    PYTHONPATH=. python3 benchmarks/kernels/time_gemv_loops.py results.json tuning-in.json tuning-out.json

For each batch-1 entry of tuning-in's `nvfp4_gemv` list (the decode shapes' measured tiles), the same tile with
the K loop plain (0), unrolled (1: `tl.static_range`, so every step's loads may be issued before the first block
dot) and pipelined in 3 stages (3), timed as in `sweep_w4a16_gemv.py` (a CUDA graph of back-to-back calls on copies
of the weights that together exceed the L2; each output checked against the torch op first). tuning-out: tuning-in
with an entry's loop form changed where another is at least 3% faster. No speed is asserted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from reference_engine.quant.linear import w4a16_linear as torch_linear
from reference_engine.quant.nvfp4 import quantize_nvfp4

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_w4a16_gemv import copies_for, timed  # the sibling sweep's timing helpers

LOOPS = (0, 1, 3)
GAIN = 0.97


def main(path: str, tuning_in: str, tuning_out: str) -> None:
    tuning = json.loads(Path(tuning_in).read_text())
    records = []
    for entry in tuning["nvfp4_gemv"]:
        tokens, rows, k_bytes, config = entry["tokens"], entry["rows"], entry["k_bytes"], tuple(entry["config"])
        if tokens != 1 or rows > 65536:  # batch-1 decode shapes only (not the NVFP4 LM head)
            continue
        cols = 2 * k_bytes
        packed, scale, scale_2 = quantize_nvfp4(torch.randn(rows, cols, device="cuda") * cols**-0.5)
        nbytes = packed.numel() + scale.numel() + 4
        weights = [(packed, scale, scale_2)] + [(packed.clone(), scale.clone(), scale_2) for _ in range(copies_for(nbytes) - 1)]
        x = torch.randn(1, cols, device="cuda").bfloat16()
        expected = torch.empty(1, rows, device="cuda", dtype=torch.bfloat16)
        torch_linear(x, packed, scale, scale_2, out=expected)
        times = {}
        for loop in LOOPS:
            candidate = (*config[:5], loop, *config[6:])
            error, seconds = timed(x, weights, torch.full_like(expected, float("nan")), expected, candidate)
            times[loop] = seconds * 1e6
            records.append({"rows": rows, "k_bytes": k_bytes, "config": candidate, "us": seconds * 1e6, "rel_error": error})
        best = min((loop for loop in LOOPS if times[loop] == times[loop]), key=times.get)
        committed = config[5]
        if best != committed and times[best] <= GAIN * times[committed]:
            entry["config"] = [*config[:5], best, *config[6:]]
        print(f"N={rows:6d} K bytes={k_bytes}: committed loop {committed}; " + ", ".join(f"loop {loop} {times[loop]:.2f} us" for loop in LOOPS)
              + f" -> loop {entry['config'][5]}", flush=True)  # fmt: skip
        del weights
        torch.cuda.empty_cache()
    Path(path).write_text(json.dumps(records, indent=1))
    Path(tuning_out).write_text(json.dumps(tuning, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
