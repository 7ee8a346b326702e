"""The split plan of the gated paged decode attention (16 query heads over 2 KV heads, head dim 256) on the GPU.

    PYTHONPATH=. python3 benchmarks/kernels/time_paged_decode.py OUT.json [TUNING.json]

run21 (Nsight Compute, batch 1): the engine's bench table holds 1296 tokens per sequence, so the default plan
(`paged_decode.MIN_TOKENS_PER_SPLIT` 64, `WAVES` 2) gives 21 splits x 2 KV heads = 42 programs, each walking 4 chunks of
16 tokens one after another: 9 us per layer for 2.3 MB of KV. Here each (MIN_TOKENS_PER_SPLIT, WAVES) setting runs at
batches 1, 8 and 32 with contexts of 1024 to 1100 tokens in that table, as a CUDA graph of CALLS calls over distinct
caches (more bytes than the L2 holds); outputs are compared with the default plan's first. With TUNING, the setting with
the least sum over batches of (time / that batch's best time) is written as `paged_min_tokens_per_split` and
`paged_waves`. No speed is asserted.
"""

from __future__ import annotations

import json
import sys

import torch

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import paged_decode

HQ, HKV, D, BLOCK, CAPACITY_BLOCKS, CALLS = 16, 2, 256, 16, 81, 16
SETTINGS = [(64, 2), (32, 2), (16, 2), (16, 4), (32, 8), (16, 8), (64, 8)]  # (MIN_TOKENS_PER_SPLIT, WAVES); the first is the default
BATCHES = (1, 8, 32)


def main(path: str, tuning_path: str | None) -> None:
    torch.manual_seed(0)
    records = []
    for batch in BATCHES:
        copies = max(2, 32 // batch)
        blocks = batch * CAPACITY_BLOCKS
        caches = [(torch.randn(blocks, BLOCK, HKV, D, device="cuda").bfloat16(), torch.randn(blocks, BLOCK, HKV, D, device="cuda").bfloat16()) for _ in range(copies)]
        tables = torch.randperm(blocks, device="cuda").int().view(batch, CAPACITY_BLOCKS)
        lens = torch.randint(1024, 1101, (batch,), device="cuda").int()
        query = torch.randn(batch, HQ, D, device="cuda").bfloat16()
        q_gate = torch.randn(batch, HQ * 2 * D, device="cuda").bfloat16()
        out = torch.empty(batch, HQ * D, device="cuda", dtype=torch.bfloat16)
        reference = None
        for setting in SETTINGS:
            paged_decode.MIN_TOKENS_PER_SPLIT, paged_decode.WAVES = setting
            check = torch.full_like(out, float("nan"))
            paged_decode.paged_decode_gated(query, *caches[0], tables, lens, q_gate, check, D**-0.5)
            reference = check if reference is None else reference
            error = float((check.double() - reference.double()).norm() / reference.double().norm())

            def step():
                for index in range(CALLS):
                    paged_decode.paged_decode_gated(query, *caches[index % copies], tables, lens, q_gate, out, D**-0.5)  # noqa: B023

            us = graph_seconds(step) * 1e6 / CALLS
            plan = paged_decode.plan(batch, HKV, CAPACITY_BLOCKS * BLOCK, torch.cuda.get_device_properties(0).multi_processor_count)
            records.append({"batch": batch, "setting": setting, "plan": plan, "us": us, "rel_vs_default": error})
            print(f"B={batch:2d} (min tokens per split, waves) {setting}: plan {plan}, {us:6.1f} us, vs default {error:.1e}", flush=True)
        with open(path, "w") as handle:
            json.dump(records, handle, indent=1)
    paged_decode.MIN_TOKENS_PER_SPLIT, paged_decode.WAVES = SETTINGS[0]
    if tuning_path:
        ok = [r for r in records if r["rel_vs_default"] < 1e-2]
        best = {b: min(r["us"] for r in ok if r["batch"] == b) for b in BATCHES}
        complete = [s for s in SETTINGS if all(any(r["setting"] == s and r["batch"] == b for r in ok) for b in BATCHES)]
        choice = min(complete, key=lambda s: sum(r["us"] / best[r["batch"]] for r in ok if r["setting"] == s))
        with open(tuning_path) as handle:
            tuning = json.load(handle)
        tuning["paged_min_tokens_per_split"], tuning["paged_waves"] = choice
        with open(tuning_path, "w") as handle:
            json.dump(tuning, handle, indent=1)
        print("tuning: paged_min_tokens_per_split, paged_waves =", choice)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        print(__doc__)
        raise SystemExit(2)
    main(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else None)
