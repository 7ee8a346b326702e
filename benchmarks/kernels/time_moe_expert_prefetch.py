"""The MoE block decode with and without the fused router's prefetch of the selected experts into L2.

    PYTHONPATH=. python3 benchmarks/kernels/time_moe_expert_prefetch.py OUT.json [--tuning FILE]

256 experts, top 8 plus the shared expert, NVFP4 weights, the card's tuning (or its architecture's) applied. At
batches 1, 4 and 8 (the fused router's range): both settings run once on the same input and must give the same output
bits (the script exits 1 otherwise), then each is timed in a CUDA graph of CALLS calls over COPIES layers in turn with a
fresh input each (more bytes than the L2 holds, `time_moe_decode.layer`). With --tuning, `moe_expert_prefetch`
is written: 1 when on is faster summed over the batches by more than 2% and slower at none by more than 2%, else 0.
No speed is asserted.
"""

# ruff: noqa: B023 - each `step` is captured and replayed within the loop iteration that made it
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import moe_decode, router, tuning

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_moe_decode import (  # the sibling script's MoE layer at the real shape
    TOP_K,
    H,
    layer,
)

COPIES, CALLS, MARGIN = 4, 40, 0.02
BATCHES = (1, 4, 8)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--tuning", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    path = tuning.apply_for_cuda()
    layers = [layer() for _ in range(COPIES)]
    records: dict = {"device": torch.cuda.get_device_name(), "tuning": None if path is None else str(path), "calls": CALLS, "copies": COPIES}
    for batch in BATCHES:
        xs = [torch.randn(batch, H, device="cuda").bfloat16() for _ in range(COPIES)]
        outs = [torch.empty(batch, H, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
        row, results = {}, {}
        for on in (False, True):
            router.PREFETCH_EXPERTS = on
            experts, shared, weight = layers[0]
            moe_decode.moe_block_decode(xs[0], weight, experts, shared, TOP_K, out=outs[0])
            results[on] = outs[0].clone()

            def step():
                for index in range(CALLS):
                    experts, shared, weight = layers[index % COPIES]
                    moe_decode.moe_block_decode(xs[index % COPIES], weight, experts, shared, TOP_K, out=outs[index % COPIES])

            row["on_us" if on else "off_us"] = graph_seconds(step, replays=20) * 1e6 / CALLS
        router.PREFETCH_EXPERTS = False
        row["bits_equal"] = torch.equal(results[False], results[True])
        row["on_over_off"] = row["on_us"] / row["off_us"]
        records[f"batch_{batch}"] = row
        print(batch, json.dumps(row), flush=True)
    rows = [records[f"batch_{b}"] for b in BATCHES]
    return tuning.finish_switch_timing(args.out, records, rows, "bits_equal", "on_us", "off_us", "moe_expert_prefetch", args.tuning, MARGIN)


if __name__ == "__main__":
    sys.exit(main())
