"""Time the MoE decode block with the experts grouped by expert (`moe_grouped_decode`) against the per-pair kernels.

    PYTHONPATH=. python3 benchmarks/kernels/time_moe_grouped.py results.json [tuning-out.json]

The real layer (E=256, H=2048, I=512, top-8 plus the shared expert, NVFP4), four copies cycled inside a CUDA
graph so each call streams its weights from HBM (`time_moe_decode.layer`). For batch 2 to 64: the whole block
(`moe_block_decode`: router, then the experts) with the per-pair kernels (the committed tuning) and with the
grouped kernels under each plan of `PLANS`; every output is checked against the torch op first (relative
error < 1e-2, else the plan is skipped). `tuning-out.json`: the committed tuning file plus `moe_grouped_decode`
(the plan with the least total time over the batches where grouping wins, and the smallest batch from which it
wins at every larger batch measured). No speed is asserted.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_moe_decode import CALLS, COPIES, TOP_K, H, layer

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import moe_decode, moe_grouped_decode
from reference_engine.kernels.moe_grouped_decode import GroupedPlan
from reference_engine.kernels.tuning import apply_for_cuda, device_file
from reference_engine.ops import static_moe

TOKENS = (2, 4, 8, 16, 32, 64)
PLANS = {
    "default": GroupedPlan(),
    "gate/up 64 rows": GroupedPlan(gate_up_block_n=64),
    "K step 128": GroupedPlan(gate_up_block_kb=64, down_block_kb=64),
    "down 128 rows": GroupedPlan(down_block_n=128),
    "4 stages": GroupedPlan(num_stages=4),
    "gate/up 16 rows, K step 128": GroupedPlan(gate_up_block_n=16, gate_up_block_kb=64, down_block_n=32, down_block_kb=64),
    "8 warps, 64 rows, K step 128": GroupedPlan(gate_up_block_n=64, gate_up_block_kb=64, down_block_n=128, down_block_kb=64, num_warps=8),
    "decode 0 (bytes)": GroupedPlan(decode=0),
}


def time_block(tokens: int, layers: list, xs: list, outs: list, expected: torch.Tensor) -> tuple[float, float]:
    """(microseconds per call, relative error against the torch op) of `moe_block_decode` as configured now."""
    check = torch.full_like(expected, float("nan"))
    experts, shared, router = layers[0]
    moe_decode.moe_block_decode(xs[0], router, experts, shared, TOP_K, out=check)
    error = float((check.double() - expected.double()).norm() / expected.double().norm())
    if not error < 1e-2:
        return float("nan"), error

    def step():
        for index in range(CALLS):
            experts, shared, router = layers[index % COPIES]
            moe_decode.moe_block_decode(xs[index % COPIES], router, experts, shared, TOP_K, out=outs[index % COPIES])

    return graph_seconds(step) * 1e6 / CALLS, error


def time_plan(label: str, tokens: int, layers: list, xs: list, outs: list, expected: torch.Tensor) -> tuple[float, float]:
    """`time_block` as configured now; a configuration that fails (compile or launch) is reported as (NaN, NaN)."""
    try:
        return time_block(tokens, layers, xs, outs, expected)
    except Exception as failure:  # noqa: BLE001 - a plan that fails is recorded, not fatal
        print(f"T={tokens:2d} {label}: {type(failure).__name__}: {str(failure)[:200]}", flush=True)
        return float("nan"), float("nan")


def main(path: str, tuning_out: str | None) -> None:
    torch.manual_seed(0)
    apply_for_cuda()  # the committed settings the engine runs (per-pair tiles, router)
    layers = [layer() for _ in range(COPIES)]
    records = []
    per_pair: dict[int, float] = {}
    grouped: dict[str, dict[int, float]] = {name: {} for name in PLANS}
    for tokens in TOKENS:
        xs = [torch.randn(tokens, H, device="cuda").bfloat16() for _ in range(COPIES)]
        outs = [torch.empty(tokens, H, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
        expected = torch.empty_like(outs[0])
        experts, shared, router = layers[0]
        static_moe.moe_block_decode(xs[0], router, experts, shared, TOP_K, out=expected)
        moe_grouped_decode.MIN_TOKENS = None
        us, error = time_block(tokens, layers, xs, outs, expected)
        per_pair[tokens] = us
        records.append({"tokens": tokens, "kernels": "per pair", "us": us, "rel_error": error})
        print(f"T={tokens:2d} per pair {'':30s}: {us:7.1f} us (error {error:.1e})", flush=True)
        moe_grouped_decode.MIN_TOKENS = 1
        for name, plan in PLANS.items():
            moe_grouped_decode.PLAN = plan
            us, error = time_plan(f"grouped {name}", tokens, layers, xs, outs, expected)
            grouped[name][tokens] = us
            records.append({"tokens": tokens, "kernels": "grouped", "plan_name": name, "plan": vars(plan), "us": us, "rel_error": error,
                            "per_pair_over_grouped": None if math.isnan(us) else per_pair[tokens] / us})  # fmt: skip
            print(f"T={tokens:2d} grouped  {name:30s}: {us:7.1f} us (error {error:.1e}, per pair / grouped {per_pair[tokens] / us:.2f})", flush=True)
        Path(path).write_text(json.dumps(records, indent=1))
    moe_grouped_decode.MIN_TOKENS, moe_grouped_decode.PLAN = None, GroupedPlan()
    best_name = min(PLANS, key=lambda name: sum(min(us, per_pair[t]) if not math.isnan(us) else per_pair[t] for t, us in grouped[name].items()))
    wins = [t for t in TOKENS if grouped[best_name][t] < per_pair[t]]
    min_tokens = next((t for t in TOKENS if all(u in wins for u in TOKENS if u >= t)), None)
    print(f"best plan {best_name!r}: grouped wins at {wins}; min_tokens {min_tokens}", flush=True)
    records.append({"best_plan": best_name, "wins_at": wins, "min_tokens": min_tokens})
    Path(path).write_text(json.dumps(records, indent=1))
    if tuning_out and min_tokens is not None:
        tuning = json.loads(device_file(torch.cuda.get_device_name()).read_text())
        tuning["moe_grouped_decode"] = {"min_tokens": min_tokens, **vars(PLANS[best_name])}
        Path(tuning_out).write_text(json.dumps(tuning, indent=1) + "\n")
        print(f"wrote {tuning_out}: moe_grouped_decode from {min_tokens} tokens, plan {best_name!r}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        print(__doc__)
        raise SystemExit(2)
    main(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else None)
