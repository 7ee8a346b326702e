"""The GDN decode step in one launch (conv fused into the recurrent kernel) against two, at batches 1 to 64.

    PYTHONPATH=. python3 benchmarks/kernels/time_gdn_fused_conv.py OUT.json [--tuning FILE]

Real head shapes (Hk 16, Hv 32, Dk = Dv = 128, conv kernel 4), the card's tuning applied (split heads as committed).
Per batch: both forms run once from the same pools and must give the same conv states bit for bit, and the same
recurrent states and outputs to rounding (float32 and one bf16 step; on the GPU the compiler may contract the fused
kernel's state update differently, run58), else the script exits 1; then each is timed in a CUDA graph over pool copies that together
exceed the L2 (`time_decode_pieces.gdn_step_setup`). With --tuning, `gdn_step_fused_conv` is written: 1 when the fused
form is faster summed over the batches by more than 2% and slower at none by more than 2%, else 0; and
`gdn_step_fused_conv_max_batch`: the largest timed batch up to which the fused form is more than 2% faster at every
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

MARGIN = 0.02


def one_batch(batch: int) -> dict:
    call, pools, out, copies = gdn_step_setup(batch)
    conv0, rec0 = pools[0][0].clone(), pools[0][1].clone()
    results, record = {}, {}
    gdn_decode_step.FUSED_CONV_MAX_BATCH = 0  # the tuning file's choice must not decide the two-launch side
    for fused in (False, True):
        gdn_decode_step.FUSED_CONV = fused
        pools[0][0].copy_(conv0)
        pools[0][1].copy_(rec0)
        call(0)
        results[fused] = (out.clone(), pools[0][0].clone(), pools[0][1].clone())
        record["fused_us" if fused else "two_launches_us"] = timed(call, copies)
    gdn_decode_step.FUSED_CONV = False
    (out_a, conv_a, rec_a), (out_b, conv_b, rec_b) = results[False], results[True]
    record["bits_equal"] = torch.equal(out_a, out_b) and torch.equal(conv_a, conv_b) and torch.equal(rec_a, rec_b)
    record["state_rel_difference"] = float((rec_b - rec_a).abs().max() / rec_a.abs().max())
    record["out_rel_difference"] = float((out_b.float() - out_a.float()).abs().max() / out_a.float().abs().max())
    # the compiler may contract the fused kernel's state update differently (run58): float32 rounding, not bits
    record["close"] = torch.equal(conv_a, conv_b) and record["state_rel_difference"] < 1e-5 and record["out_rel_difference"] < 8e-3
    record["fused_over_two"] = record["fused_us"] / record["two_launches_us"]
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--tuning", default=None)
    args = parser.parse_args()
    path = tuning.apply_for_cuda()
    records = {"device": torch.cuda.get_device_name(), "tuning": None if path is None else str(path), "split_below": gdn_decode_step.STEP_SPLIT_BELOW, "split": gdn_decode_step.STEP_SPLIT}
    for batch in BATCHES:
        records[f"batch_{batch}"] = one_batch(batch)
        print(batch, json.dumps(records[f"batch_{batch}"]), flush=True)
    rows = [records[f"batch_{b}"] for b in BATCHES]
    records["fused_conv_max_batch"] = max_batch_faster(records)
    status = tuning.finish_switch_timing(args.out, records, rows, "close", "fused_us", "two_launches_us", "gdn_step_fused_conv", args.tuning, MARGIN)
    if status == 0 and args.tuning is not None:
        tuning.write_setting(args.tuning, "gdn_step_fused_conv_max_batch", records["fused_conv_max_batch"])
        print(f"tuning: gdn_step_fused_conv_max_batch = {records['fused_conv_max_batch']}")
    return status


def max_batch_faster(records: dict, new: str = "fused_us", old: str = "two_launches_us", margin: float = MARGIN) -> int:
    """The largest timed batch up to which the new form (`records[f"batch_{b}"][new]`, in us) beats the old one by more
    than `margin` at every timed batch; 0 when it does not at the first (time_ba_fold.py uses it too)."""
    best = 0
    for batch in BATCHES:
        row = records[f"batch_{batch}"]
        if row[new] >= (1.0 - margin) * row[old]:
            break
        best = batch
    return best


if __name__ == "__main__":
    sys.exit(main())
