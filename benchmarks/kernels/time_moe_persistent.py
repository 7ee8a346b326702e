"""The batch-1 MoE block in one persistent launch against the three launches it replaces.

    PYTHONPATH=. python3 benchmarks/kernels/time_moe_persistent.py OUT.json [--tuning FILE] [--model full] [--rounds 2]

256 experts, top 8 plus the shared expert, NVFP4 weights at the real shape, the card's tuning applied. Forms: the
three launches (`moe_decode.moe_block_decode`: fused router, gate/up, down), the persistent kernel run as three phased
launches (no barrier), the default plan launched as a plain (not cooperative) grid, and the persistent kernel in one launch under several `PersistentPlan`s (programs per
multiprocessor, tiles, pipeline depth). Each form runs once on the same NaN-poisoned output and is compared with the
three launches: a relative error under 1e-2 (bit-equal is expected, and reported, where its tiles, router rows and
warps are the three launches'; the CUDA test asserts that).
Then each is timed in a CUDA graph of CALLS calls over COPIES layers in turn (more bytes than the L2 holds,
`time_moe_decode.layer`); the rounds interleave the forms. With --model full, the full model's batch-1 decode graph
is also timed with the fastest plan off and on (logits compared). With --tuning, `moe_block_persistent` is written:
on = 1 with the fastest plan when its median beats the three launches by more than 2% and its output agrees, else
on = 0. A plan whose programs cannot all be resident is recorded as refused, not run. No speed is asserted.
"""

# ruff: noqa: B023 - each `step` is captured and replayed within the loop iteration that made it
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import moe_block_persistent, moe_decode, tuning
from reference_engine.kernels.moe_block_persistent import PersistentPlan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_moe_decode import (  # the sibling script's MoE layer at the real shape
    TOP_K,
    H,
    layer,
)

COPIES, CALLS, MARGIN = 4, 40, 0.02
PLANS = {  # name: plan; "default" has the batch-one setting's tiles (bit-equal to the three launches)
    "default": PersistentPlan(),
    "2_per_sm": PersistentPlan(programs_per_sm=2),
    "3_per_sm": PersistentPlan(programs_per_sm=3),
    "4_per_sm_down4": PersistentPlan(programs_per_sm=4, down_block_h=4),  # more bytes in flight per multiprocessor
    "6_per_sm_tiles4": PersistentPlan(programs_per_sm=6, gate_up_block_n=4, down_block_h=4),
    "tiles16": PersistentPlan(gate_up_block_n=16, down_block_h=16),
    "tiles4_2_per_sm": PersistentPlan(programs_per_sm=2, gate_up_block_n=4, down_block_h=4),
    "loop1": PersistentPlan(loop=1),
    "loop2_2_per_sm": PersistentPlan(programs_per_sm=2, loop=2),
    "warps8": PersistentPlan(num_warps=8),
}
BATCH_ONE_TILES = PersistentPlan()  # tiles equal to the tuning file's moe_decode_batch_one (3, 8, 256, 8, 256, 2)


def run_form(name: str, x, layer_, out) -> None:
    experts, shared, weight = layer_
    moe_decode.PERSISTENT = name != "three"
    moe_block_persistent.PHASED = name == "phased"
    moe_block_persistent.PLAN = PLANS.get(name, PLANS["default"])
    moe_block_persistent.COOPERATIVE = name != "default_plain_launch"
    moe_decode.moe_block_decode(x, weight, experts, shared, TOP_K, out=out)


def reset() -> None:
    moe_decode.PERSISTENT, moe_block_persistent.PHASED, moe_block_persistent.PLAN = False, False, PLANS["default"]
    moe_block_persistent.COOPERATIVE = True


def kernel_timings(rounds: int) -> dict:
    layers = [layer() for _ in range(COPIES)]
    xs = [torch.randn(1, H, device="cuda").bfloat16() for _ in range(COPIES)]
    outs = [torch.empty(1, H, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
    forms = ["three", "phased", "default_plain_launch", *PLANS]  # plain launch: the default plan, not cooperative
    rows: dict[str, dict] = {}
    reference = torch.full((1, H), float("nan"), device="cuda", dtype=torch.bfloat16)
    run_form("three", xs[0], layers[0], reference)
    for name in forms:
        row = rows[name] = {"samples_us": []}
        check = torch.full_like(reference, float("nan"))
        try:
            run_form(name, xs[0], layers[0], check)
            torch.cuda.synchronize()
        except ValueError as refused:  # programs that cannot all be resident
            row["refused"] = str(refused)
            print(f"{name}: refused: {refused}", flush=True)
            continue
        finally:
            reset()
        row["bits_equal_three"] = torch.equal(check, reference)
        row["rel_error_three"] = float((check.double() - reference.double()).norm() / reference.double().norm())
        row["plan"] = dataclasses.asdict(PLANS[name]) if name in PLANS else None
        row["same_tiles"] = name in ("three", "phased") or (name in PLANS and _tiles(PLANS[name]) == _tiles(BATCH_ONE_TILES))
        row["agrees"] = row["rel_error_three"] < 1e-2  # bit-equality with the same tiles is reported, the CUDA test asserts it
    for round_index in range(rounds):
        for name in forms:
            if "refused" in rows[name]:
                continue

            def step():
                for index in range(CALLS):
                    run_form(name, xs[index % COPIES], layers[index % COPIES], outs[index % COPIES])

            try:
                rows[name]["samples_us"].append(graph_seconds(step, replays=20) * 1e6 / CALLS)
            finally:
                reset()
            print(f"round {round_index} {name:16s} {rows[name]['samples_us'][-1]:7.2f} us/block", flush=True)
    for name, row in rows.items():
        if row["samples_us"]:
            row["median_us"] = statistics.median(row["samples_us"])
            row["ratio_to_three"] = row["median_us"] / rows["three"]["median_us"]
        print(name, json.dumps({k: v for k, v in row.items() if k != "samples_us"}), flush=True)
    return rows


def _tiles(plan: PersistentPlan) -> tuple:
    return (plan.loop, plan.gate_up_block_n, plan.gate_up_block_k, plan.down_block_h, plan.down_block_i, plan.words)


def model_timing(best: str, rounds: int) -> dict:
    """Batch-1 decode graph of the full model with the persistent block off and on (`best`'s plan)."""
    from time_l2_prefetch import (
        one_setting,  # the sibling script's engine run (graph replay time and last logits)
    )

    from reference_engine.presets import build_preset
    from reference_engine.tokenizer import load_tokenizer

    model = build_preset("full", device=torch.device("cuda"), dtype=torch.bfloat16, seed=0, quantize="nvfp4")
    tokenizer = load_tokenizer("full")
    prompt = torch.randint(1, model.config.vocab_size, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    samples: dict[str, list[float]] = {"off": [], "on": []}
    logits = {}
    for _ in range(rounds):
        for setting in ("off", "on"):

            def configure(decoder, on=setting == "on") -> None:  # after the engine installed the tuning file, which has the key
                moe_decode.PERSISTENT = on
                moe_block_persistent.PLAN = PLANS[best]

            try:
                record, logits[setting] = one_setting(model, tokenizer, None, prompt, configure)
            finally:
                reset()
            samples[setting].append(record["graph_replay_us"])
            print(f"model {setting}: graph replay {record['graph_replay_us']:.1f} us", flush=True)
    off, on = statistics.median(samples["off"]), statistics.median(samples["on"])
    return {"plan": best, "samples_us": samples, "off_us": off, "on_us": on, "on_over_off": on / off,
            "logits_equal": torch.equal(logits["off"], logits["on"]),
            "logits_max_abs_diff": float((logits["off"] - logits["on"]).abs().max()),
            "top1_equal": int(logits["off"].argmax()) == int(logits["on"].argmax())}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--tuning", default=None)
    parser.add_argument("--model", default=None, choices=("full",))
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    path = tuning.apply_for_cuda()
    reset()  # whatever the tuning file said, each form sets its own switches
    document: dict = {"device": torch.cuda.get_device_name(), "tuning": None if path is None else str(path), "calls": CALLS,
                      "copies": COPIES, "sms": torch.cuda.get_device_properties(0).multi_processor_count}  # fmt: skip
    rows = document["forms"] = kernel_timings(args.rounds)
    Path(args.out).write_text(json.dumps(document, indent=1))
    if not all(row["agrees"] for row in rows.values() if "refused" not in row):
        print("a form disagrees with the three launches: moe_block_persistent not written", file=sys.stderr)
        return 1
    timed = [name for name in PLANS if rows[name].get("median_us")]
    best = min(timed, key=lambda name: rows[name]["median_us"]) if timed else None
    wins = best is not None and rows[best]["ratio_to_three"] < 1 - MARGIN
    if args.model and best is not None:
        document["model"] = model_timing(best, args.rounds)
        Path(args.out).write_text(json.dumps(document, indent=1))
        print("model", json.dumps(document["model"]), flush=True)
        wins = wins and document["model"]["top1_equal"] and document["model"]["on_over_off"] < 1 - MARGIN / 2
    if args.tuning:
        setting = {"on": int(wins), **dataclasses.asdict(PLANS[best] if wins else PLANS["default"])}
        tuning.write_setting(args.tuning, "moe_block_persistent", setting)
        print(f"tuning: moe_block_persistent = {setting} (best {best}: {rows[best]['ratio_to_three']:.3f} of the three launches)" if best else
              "tuning: moe_block_persistent off (no plan ran)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
