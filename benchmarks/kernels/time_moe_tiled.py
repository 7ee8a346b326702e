"""Time the grouped MoE decode experts reading tile-major copies of the weights against the row-major stack.

    PYTHONPATH=. python3 benchmarks/kernels/time_moe_tiled.py OUT.json [--tokens 16,32,64] [--sweep] [--per-pair]

`moe_grouped_half` under the committed plan (this card's tuning file), at the real layer (E=256, H=2048, I=512, top-8
plus the shared expert, NVFP4; `time_moe_decode.layer`, four copies cycled in a CUDA graph so every call streams its
weights from HBM), routed experts plus the shared expert only (ids and weights given, no router). Row-major reads
against the tile-major copies (`tile_experts`): the outputs must be bit-equal before either is timed. The two forms
are timed alternately, three rounds each, and each form's fastest round counts (order bias: run66). No speed is asserted.

`--sweep`: contiguous copies may afford other tiles (run74's stream test read 8 scale blocks a step as fast as 4), so
each batch also times tile-major copies made for the plans of `VARIANTS` (each checked bit-equal to row-major reads
under the same plan), in the same rounds. Records get `sweep` (plan fields changed, us); `adopt_measured.py --tiled`
takes the variant that beat the committed plan's tile-major time by 3% or more at every batch, the fastest in total.

`--per-pair`: also times, in the same rounds, the per-pair kernels (`moe_decode.nvfp4_experts_with_shared` under
the committed `moe_decode` settings) that batches below `moe_grouped_half`'s `min_tokens` run, on the same inputs
(another summation order: their output must agree within bfloat16 rounding). Records get `per_pair_us`;
`adopt_measured.py --tiled` lowers `min_tokens` to the smallest batch timed from which the grouped kernels on the
copies beat the per-pair ones by 3% or more at every batch timed.
"""

# ruff: noqa: B023 - `step` is captured and replayed within the loop iteration that made it
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_moe_decode import COPIES, TOP_K, E, H, layer

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import moe_decode
from reference_engine.kernels import moe_grouped_half as half
from reference_engine.kernels.tuning import apply_for_cuda

CALLS = 8
ROUNDS = 3
VARIANTS = (  # plan fields changed from the committed plan for `--sweep`
    {"gate_up_block_b": 8},
    {"down_block_b": 8},
    {"gate_up_block_b": 8, "down_block_b": 8},
    {"gate_up_block_n": 64},
    {"num_warps": 8},
    {"gate_up_block_b": 8, "down_block_b": 8, "num_warps": 8},
)


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
    parser.add_argument("--sweep", action="store_true", help="also time tile-major copies for the plans of VARIANTS")
    parser.add_argument("--per-pair", action="store_true", help="also time the per-pair kernels of the smaller batches")
    args = parser.parse_args()
    torch.manual_seed(0)
    apply_for_cuda()
    committed = half.PLAN
    layers = [layer() for _ in range(COPIES)]
    changes = [{}] + ([v for v in VARIANTS if any(getattr(committed, k) != value for k, value in v.items())] if args.sweep else [])
    plans = [dataclasses.replace(committed, **change) for change in changes]
    copies_by_plan = [[half.tile_experts(experts, shared, plan) for experts, shared, _ in layers] for plan in plans]
    gen = torch.Generator().manual_seed(1)
    records = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        inputs = [(torch.randn(tokens, H, device="cuda").bfloat16(), *routing(tokens, gen)) for _ in range(COPIES)]
        outs = [torch.empty(tokens, H, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]

        def call(index: int, plan, tiled, out: torch.Tensor) -> None:
            experts, shared, _ = layers[index % COPIES]
            x, ids, weights = inputs[index % COPIES]
            half.half_grouped_experts_with_shared(x, weights, ids, experts, shared, out, plan=plan, check_ids=False,
                                                  tiled=tiled[index % COPIES] if tiled is not None else None)  # fmt: skip

        forms = [(committed, None, {})]  # (plan, tile-major copies or None, fields changed)
        for plan, change, tiled in zip(plans, changes, copies_by_plan, strict=True):
            checks = []
            for copies in (None, tiled):
                out = torch.full((tokens, H), float("nan"), device="cuda", dtype=torch.bfloat16)
                try:
                    call(1, plan, copies, out)
                except Exception as error:  # a variant that does not compile or launch is skipped, not fatal
                    if change:
                        print(f"  skipped {change}: {type(error).__name__}: {str(error)[:120]}", flush=True)
                        break
                    raise
                checks.append(out)
            if len(checks) < 2:
                continue
            if not (torch.isfinite(checks[0]).all() and torch.equal(checks[0], checks[1])):
                if change:
                    print(f"  skipped {change}: tile-major bits differ from row-major", flush=True)
                    continue
                raise SystemExit(f"T={tokens}: the tile-major copies give other bits than the row-major reads")
            forms.append((plan, tiled, change))
        def per_pair(index: int, out: torch.Tensor) -> None:
            experts, shared, _ = layers[index % COPIES]
            x, ids, weights = inputs[index % COPIES]
            moe_decode.nvfp4_experts_with_shared(x, weights, ids, experts, shared, out)

        pair_rounds: list[float] = []
        agreement = None
        if args.per_pair:
            grouped_out = torch.full((tokens, H), float("nan"), device="cuda", dtype=torch.bfloat16)
            call(1, committed, None, grouped_out)
            pair_out = torch.full((tokens, H), float("nan"), device="cuda", dtype=torch.bfloat16)
            per_pair(1, pair_out)
            agreement = float((pair_out.double() - grouped_out.double()).norm() / grouped_out.double().norm())
            if not (torch.isfinite(pair_out).all() and agreement < 1e-2):
                raise SystemExit(f"T={tokens}: the per-pair kernels and the grouped ones disagree ({agreement:.3g})")
        rounds: list[list[float]] = [[] for _ in forms]
        for _ in range(ROUNDS):
            for form, (plan, tiled, _) in enumerate(forms):

                def step():
                    for index in range(CALLS):
                        call(index, plan, tiled, outs[index % COPIES])

                rounds[form].append(graph_seconds(step) * 1e6 / CALLS)
            if args.per_pair:

                def pair_step():
                    for index in range(CALLS):
                        per_pair(index, outs[index % COPIES])

                pair_rounds.append(graph_seconds(pair_step) * 1e6 / CALLS)
        best = [min(r) for r in rounds]
        rows, tiles = best[0], best[1]
        record = {"tokens": tokens, "plan": vars(committed), "row_major_us": rows, "tile_major_us": tiles, "ratio": tiles / rows,
                  "rounds_us": {"row_major": rounds[0], "tile_major": rounds[1]}}  # fmt: skip
        print(f"T={tokens:2d}: row-major {rows:7.1f} us, tile-major {tiles:7.1f} us, ratio {tiles / rows:.3f} (bit-equal)", flush=True)
        if args.per_pair:
            record |= {"per_pair_us": min(pair_rounds), "per_pair_rounds_us": pair_rounds, "per_pair_relative_difference": agreement}
            print(f"  per-pair kernels {min(pair_rounds):7.1f} us (grouped tile-major / per-pair {tiles / min(pair_rounds):.3f}; "
                  f"outputs within {agreement:.2g})", flush=True)  # fmt: skip
        if args.sweep:
            record["sweep"] = [{"change": change, "tile_major_us": t, "rounds_us": r} for (_, _, change), t, r in zip(forms[2:], best[2:], rounds[2:], strict=True)]
            for item in record["sweep"]:
                print(f"  tile-major {item['change']}: {item['tile_major_us']:7.1f} us ({item['tile_major_us'] / tiles:.3f} of the committed plan)", flush=True)
        records.append(record)
        del forms
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
