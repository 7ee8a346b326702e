"""The MoE block decode with and without the fused router's prefetch of the selected experts into L2.

    PYTHONPATH=. python3 benchmarks/kernels/time_moe_expert_prefetch.py OUT.json [--tuning FILE]

256 experts, top 8 plus the shared expert, NVFP4 weights, the card's tuning (or its architecture's) applied. At
batches 1, 4 and 8 (the fused router's range): both settings run once on the same input and must give the same output
bits (the script exits 1 otherwise), then each is timed in a CUDA graph of CALLS calls over COPIES layers in turn with a
fresh input each (more bytes than the L2 holds, `time_l2_hot_cold.moe_layer`). With --tuning, `moe_expert_prefetch`
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
from time_l2_hot_cold import (  # the sibling script's MoE layer at the real shape
    TOP_K,
    H,
    moe_layer,
)

COPIES, CALLS, MARGIN = 4, 40, 0.02
BATCHES = (1, 4, 8)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--tuning", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    name = torch.cuda.get_device_name()
    path = tuning.tuning_path(name, torch.cuda.get_device_capability())
    if path is not None:
        tuning.apply_tuning(path)
    layers = [moe_layer() for _ in range(COPIES)]
    records: dict = {"device": name, "tuning": None if path is None else str(path), "calls": CALLS, "copies": COPIES}
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
    with open(args.out, "w") as handle:
        json.dump(records, handle, indent=1)
    rows = [records[f"batch_{b}"] for b in BATCHES]
    if not all(row["bits_equal"] for row in rows):
        print("the prefetch changed the output", file=sys.stderr)
        return 1
    if args.tuning:
        total = sum(row["on_us"] for row in rows) / sum(row["off_us"] for row in rows)
        take = total < 1 - MARGIN and all(row["on_over_off"] < 1 + MARGIN for row in rows)
        with open(args.tuning) as handle:
            document = json.load(handle)
        document["moe_expert_prefetch"] = int(take)
        with open(args.tuning, "w") as handle:
            json.dump(document, handle, indent=1)
        print(f"tuning: moe_expert_prefetch = {int(take)} (on / off summed: {total:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
