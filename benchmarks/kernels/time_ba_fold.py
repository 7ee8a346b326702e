"""A GDN layer's b and a computed inside the decode step (`ba_from`) against their own launch before it, batches 1 to 64.

    PYTHONPATH=. python3 benchmarks/kernels/time_ba_fold.py OUT.json [--tuning FILE]

Real head shapes (Hk 16, Hv 32, Dk = Dv = 128, conv kernel 4, hidden 2048), the card's tuning applied (split heads and
fused conv as committed). Per batch: the stacked b/a linear (64 x 2048 bf16, `dense_gemv.dense_linear`: the Triton
GEMV up to its token ceiling, torch above) then the step, against the step alone with `ba_from`
(`gdn_decode_step.py`, "b/a fold"). Both run once from the same pools: b and a must agree to one bfloat16 step (the
GPU's float32 reduction tree may differ in the last bit before the rounding), the conv states bit for bit, the
recurrent states and outputs to rounding, else the script exits 1. Then each is timed in a CUDA graph over pool and
weight copies that together exceed the L2 (`time_decode_pieces.gdn_step_setup`). With --tuning,
`gdn_step_ba_fold_max_batch` is written: the largest timed batch up to which the fold is more than 2% faster at every
timed batch (0 when it is not at batch 1). No speed is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from reference_engine.kernels import gdn_decode_step, tuning

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_decode_pieces import (  # the sibling script's GDN step and graph timing
    BATCHES,
    gdn_step_setup,
    timed,
)
from time_gdn_fused_conv import (
    max_batch_faster,  # the largest batch of the winning prefix
)

MARGIN = 0.02
KEY = "gdn_step_ba_fold_max_batch"
BF16_STEP = 2.0**-7  # one bfloat16 step, relative


def one_batch(batch: int) -> dict:
    results, record = {}, {}
    for form in ("launch", "fold"):
        ba_out = torch.full((batch, 64), float("nan"), device="cuda", dtype=torch.bfloat16)  # poisoned: both forms must write it
        call, pools, out, copies = gdn_step_setup(batch, form, ba_out)  # the same seeds: the same inputs for both forms
        call(0)
        results[form] = (ba_out.clone(), out.clone(), pools[0][0].clone(), pools[0][1].clone())
        record[f"{form}_us"] = timed(call, copies)
    (ba_a, out_a, conv_a, rec_a), (ba_b, out_b, conv_b, rec_b) = results["launch"], results["fold"]
    record["ba_bits_equal"] = torch.equal(ba_a, ba_b)
    record["ba_rel_difference"] = float(((ba_b.float() - ba_a.float()).abs() / ba_a.float().abs().clamp(min=1e-6)).max())
    record["bits_equal"] = record["ba_bits_equal"] and torch.equal(out_a, out_b) and torch.equal(conv_a, conv_b) and torch.equal(rec_a, rec_b)
    record["state_rel_difference"] = float((rec_b - rec_a).abs().max() / rec_a.abs().max())
    record["out_rel_difference"] = float((out_b.float() - out_a.float()).abs().max() / out_a.float().abs().max())
    record["close"] = (bool(torch.isfinite(ba_b.float()).all()) and record["ba_rel_difference"] <= BF16_STEP and torch.equal(conv_a, conv_b)
                       and record["state_rel_difference"] < 1e-4 and record["out_rel_difference"] < 2e-2)  # fmt: skip
    record["fold_over_launch"] = record["fold_us"] / record["launch_us"]
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--tuning", default=None)
    args = parser.parse_args()
    path = tuning.apply_for_cuda()
    records = {"device": torch.cuda.get_device_name(), "tuning": None if path is None else str(path), "split_below": gdn_decode_step.STEP_SPLIT_BELOW,
               "fused_conv": gdn_decode_step.FUSED_CONV, "fused_conv_max_batch": gdn_decode_step.FUSED_CONV_MAX_BATCH}  # fmt: skip
    rows = {}
    for batch in BATCHES:
        rows[batch] = records[f"batch_{batch}"] = one_batch(batch)
        print(batch, json.dumps(rows[batch]), flush=True)
    records["ba_fold_max_batch"] = max_batch_faster(records, "fold_us", "launch_us", MARGIN)
    Path(args.out).write_text(json.dumps(records, indent=1))
    if not all(row["close"] for row in rows.values()):
        print(f"the fold disagrees with the launch: {KEY} not written", file=sys.stderr)
        return 1
    if args.tuning is not None:
        tuning.write_setting(args.tuning, KEY, records["ba_fold_max_batch"])
        print(f"tuning: {KEY} = {records['ba_fold_max_batch']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
