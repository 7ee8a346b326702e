"""Time the decode MoE block grouped by expert on tensor cores with swapped operands (`GroupedPlan.swap`: weight rows
as the mma's M, so 64-row tiles run on wgmma) against the committed path at each batch.

    PYTHONPATH=. python3 benchmarks/kernels/time_moe_grouped_swap.py results.json [--tuning IN OUT] [--tokens 8,16,32,64]

The real layer (E=256, H=2048, I=512, top-8 plus the shared expert, NVFP4), four copies cycled inside a CUDA graph
(`time_moe_decode.layer`, `time_moe_grouped.time_block`: whole block, router included, every output checked against
the torch op first). `--tuning IN OUT` writes OUT = IN with `moe_grouped_decode` set to the swapped plan of least total
time from the smallest batch of the contiguous run of wins (at least 3% faster than committed) that ends at the
largest batch measured, and `moe_grouped_half.max_tokens` lowered below it; only when there is such a run. No speed
is asserted.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_moe_decode import COPIES, TOP_K, H, layer
from time_moe_grouped import time_block, time_plan

from reference_engine.kernels import moe_grouped_decode, moe_grouped_half
from reference_engine.kernels.moe_grouped_decode import GroupedPlan
from reference_engine.kernels.tuning import apply_for_cuda
from reference_engine.ops import static_moe

TOKENS = (8, 16, 32, 64)
MIN_GAIN = 1.03  # committed / swapped at least this to count as a win
PLANS = {
    "swap 64 rows": GroupedPlan(swap=1, gate_up_block_n=64, down_block_n=64),
    "swap 64 rows, 32 pairs": GroupedPlan(swap=1, block_m=32, gate_up_block_n=64, down_block_n=64),
    "swap 64 rows, K step 128": GroupedPlan(swap=1, gate_up_block_n=64, down_block_n=64, gate_up_block_kb=64, down_block_kb=64),
    "swap 64 / 128 rows, 8 warps": GroupedPlan(swap=1, gate_up_block_n=64, down_block_n=128, num_warps=8),
    "swap 64 rows, 2 stages": GroupedPlan(swap=1, gate_up_block_n=64, down_block_n=64, num_stages=2),
    "swap 64 rows, 4 stages": GroupedPlan(swap=1, gate_up_block_n=64, down_block_n=64, num_stages=4),
}


def _win_range(tokens_list: tuple[int, ...], wins: list[int]) -> int | None:
    """The smallest batch of the contiguous run of wins that ends at the largest batch measured (None: no such run)."""
    low = None
    for t in reversed(tokens_list):
        if t not in wins:
            break
        low = t
    return low


def main(path: str, tuning_in: str | None, tuning_out: str | None, tokens_list: tuple[int, ...] = TOKENS) -> None:
    torch.manual_seed(0)
    apply_for_cuda()
    committed_grouped = moe_grouped_decode.MIN_TOKENS, moe_grouped_decode.PLAN
    committed_half = moe_grouped_half.MIN_TOKENS, moe_grouped_half.MAX_TOKENS
    layers = [layer() for _ in range(COPIES)]
    records: list[dict] = []
    committed: dict[int, float] = {}
    swapped: dict[str, dict[int, float]] = {name: {} for name in PLANS}
    for tokens in tokens_list:
        xs = [torch.randn(tokens, H, device="cuda").bfloat16() for _ in range(COPIES)]
        outs = [torch.empty(tokens, H, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
        expected = torch.empty_like(outs[0])
        experts, shared, router = layers[0]
        static_moe.moe_block_decode(xs[0], router, experts, shared, TOP_K, out=expected)
        moe_grouped_decode.MIN_TOKENS, moe_grouped_decode.PLAN = committed_grouped
        moe_grouped_half.MIN_TOKENS, moe_grouped_half.MAX_TOKENS = committed_half
        us, error = time_block(tokens, layers, xs, outs, expected)
        committed[tokens] = us
        records.append({"tokens": tokens, "kernels": "committed", "us": us, "rel_error": error})
        print(f"T={tokens:2d} committed {'':28s}: {us:7.1f} us (error {error:.1e})", flush=True)
        moe_grouped_half.MIN_TOKENS = None  # the tensor-core grouping at every batch
        moe_grouped_decode.MIN_TOKENS = 1
        for name, plan in PLANS.items():
            moe_grouped_decode.PLAN = plan
            us, error = time_plan(name, tokens, layers, xs, outs, expected)
            swapped[name][tokens] = us
            ratio = committed[tokens] / us if not math.isnan(us) else None
            records.append({"tokens": tokens, "kernels": "grouped swapped", "plan_name": name, "plan": vars(plan), "us": us, "rel_error": error,
                            "committed_over_swapped": ratio})  # fmt: skip
            print(f"T={tokens:2d} {name:38s}: {us:7.1f} us (error {error:.1e}, committed / swapped {ratio})", flush=True)
        Path(path).write_text(json.dumps(records, indent=1))
    moe_grouped_decode.MIN_TOKENS, moe_grouped_decode.PLAN = committed_grouped
    moe_grouped_half.MIN_TOKENS, moe_grouped_half.MAX_TOKENS = committed_half

    def wins(name: str) -> list[int]:
        return [t for t, us in swapped[name].items() if not math.isnan(us) and committed[t] / us >= MIN_GAIN]

    def total(name: str) -> float:  # swapped from its win range on, committed below
        low = _win_range(tokens_list, wins(name))
        return sum(swapped[name][t] if low is not None and t >= low else committed[t] for t in tokens_list)

    best = min(PLANS, key=total)
    low = _win_range(tokens_list, wins(best))
    summary = {"best_plan": best, "wins_at": wins(best), "from_tokens": low, "total_us": total(best), "committed_total_us": sum(committed.values())}
    print(f"best swapped plan {best!r}: {summary}", flush=True)
    records.append(summary)
    Path(path).write_text(json.dumps(records, indent=1))
    if tuning_in and tuning_out and low is not None:
        tuning = json.loads(Path(tuning_in).read_text())
        tuning["moe_grouped_decode"] = {"min_tokens": low, **vars(PLANS[best])}
        half = tuning.get("moe_grouped_half")
        if half is not None:
            if half["min_tokens"] >= low:
                del tuning["moe_grouped_half"]
            elif half.get("max_tokens") is None or half["max_tokens"] >= low:
                half["max_tokens"] = low - 1
        Path(tuning_out).write_text(json.dumps(tuning, indent=1) + "\n")
        print(f"wrote {tuning_out}: moe_grouped_decode {tuning['moe_grouped_decode']}, moe_grouped_half {tuning.get('moe_grouped_half')}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results")
    parser.add_argument("--tuning", nargs=2, metavar=("IN", "OUT"))
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="batch sizes, comma-separated")
    args = parser.parse_args()
    main(args.results, *(args.tuning or (None, None)), tuple(int(t) for t in args.tokens.split(",")))
