"""Time the grouped MoE decode experts reading tile-major copies of the weights against the row-major stack.

    PYTHONPATH=. python3 benchmarks/kernels/time_moe_tiled.py OUT.json [--tokens 16,32,64]

`moe_grouped_half` under the committed plan (this card's tuning file), at the real layer (E=256, H=2048, I=512, top-8
plus the shared expert, NVFP4; `time_moe_decode.layer`, four copies cycled in a CUDA graph so every call streams its
weights from HBM), routed experts plus the shared expert only (ids and weights given, no router). Row-major reads
against the tile-major copies (`tile_experts`): the outputs must be bit-equal before either is timed. The two forms
are timed alternately, three rounds each, and each form's fastest round counts (order bias: run66). No speed is asserted.
"""

# ruff: noqa: B023 - `step` is captured and replayed within the loop iteration that made it
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_moe_decode import COPIES, TOP_K, E, H, layer

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import moe_grouped_half as half
from reference_engine.kernels.tuning import apply_for_cuda

CALLS = 8
ROUNDS = 3


def routing(tokens: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random top-8 ids per token plus the shared slot, and positive weights."""
    ids = torch.stack([torch.randperm(E, generator=gen)[:TOP_K] for _ in range(tokens)])
    ids = torch.cat([ids, torch.full((tokens, 1), E)], 1).int().cuda()
    weights = (torch.rand(tokens, TOP_K + 1, generator=gen) + 0.1).cuda()
    return ids, weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--tokens", default="16,32,64")
    args = parser.parse_args()
    torch.manual_seed(0)
    apply_for_cuda()
    plan = half.PLAN
    layers = [layer() for _ in range(COPIES)]
    tiled = [half.tile_experts(experts, shared, plan) for experts, shared, _ in layers]
    gen = torch.Generator().manual_seed(1)
    records = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        inputs = [(torch.randn(tokens, H, device="cuda").bfloat16(), *routing(tokens, gen)) for _ in range(COPIES)]
        outs = [torch.empty(tokens, H, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]

        def call(index: int, use_tiled: bool, out: torch.Tensor) -> None:
            experts, shared, _ = layers[index % COPIES]
            x, ids, weights = inputs[index % COPIES]
            half.half_grouped_experts_with_shared(x, weights, ids, experts, shared, out, plan=plan, check_ids=False,
                                                  tiled=tiled[index % COPIES] if use_tiled else None)  # fmt: skip

        checks = []
        for use_tiled in (False, True):
            out = torch.full((tokens, H), float("nan"), device="cuda", dtype=torch.bfloat16)
            call(1, use_tiled, out)
            checks.append(out)
        if not (torch.isfinite(checks[0]).all() and torch.equal(checks[0], checks[1])):
            raise SystemExit(f"T={tokens}: the tile-major copies give other bits than the row-major reads")
        rounds: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(ROUNDS):
            for use_tiled in (False, True):

                def step():
                    for index in range(CALLS):
                        call(index, use_tiled, outs[index % COPIES])

                rounds[use_tiled].append(graph_seconds(step) * 1e6 / CALLS)
        rows, tiles = min(rounds[False]), min(rounds[True])
        record = {"tokens": tokens, "plan": vars(plan), "row_major_us": rows, "tile_major_us": tiles, "ratio": tiles / rows,
                  "rounds_us": {"row_major": rounds[False], "tile_major": rounds[True]}}  # fmt: skip
        records.append(record)
        print(f"T={tokens:2d}: row-major {rows:7.1f} us, tile-major {tiles:7.1f} us, ratio {tiles / rows:.3f} (bit-equal)", flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
