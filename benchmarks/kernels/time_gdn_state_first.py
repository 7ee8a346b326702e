"""The GDN decode step's recurrent launch with its state tile's load issued first (`gdn_decode_step.STATE_FIRST`) or not.

    PYTHONPATH=. python3 benchmarks/kernels/time_gdn_state_first.py OUT.json [--tuning FILE]

Real head shapes (Hk 16, Hv 32, Dk = Dv = 128, conv kernel 4), the card's tuning applied (split heads and the fused conv
as committed), batches 1, 8, 32 and 64. Per batch: both forms run once from the same pools; they do the same arithmetic,
so outputs and both states must agree (bit for bit expected; to float32 rounding accepted, as the compiler may contract
differently), else the script exits 1; then each is timed in a CUDA graph over pool copies that together exceed the L2
(`time_decode_pieces.gdn_step_setup`). With --tuning, `gdn_step_state_first` is written: 1 when the new form is faster
summed over the batches by more than 2% and slower at none by more than 2%, else 0. No speed is asserted.
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
KEY = "gdn_step_state_first"


def one_batch(batch: int) -> dict:
    call, pools, out, copies = gdn_step_setup(batch)
    conv0, rec0 = pools[0][0].clone(), pools[0][1].clone()
    results, record = {}, {}
    for first in (False, True):
        gdn_decode_step.STATE_FIRST = first
        pools[0][0].copy_(conv0)
        pools[0][1].copy_(rec0)
        call(0)
        results[first] = (out.clone(), pools[0][0].clone(), pools[0][1].clone())
        record["state_first_us" if first else "committed_us"] = timed(call, copies)
    gdn_decode_step.STATE_FIRST = False
    (out_a, conv_a, rec_a), (out_b, conv_b, rec_b) = results[False], results[True]
    record["bits_equal"] = torch.equal(out_a, out_b) and torch.equal(conv_a, conv_b) and torch.equal(rec_a, rec_b)
    record["state_rel_difference"] = float((rec_b - rec_a).abs().max() / rec_a.abs().max())
    record["out_rel_difference"] = float((out_b.float() - out_a.float()).abs().max() / out_a.float().abs().max())
    record["close"] = torch.equal(conv_a, conv_b) and record["state_rel_difference"] < 1e-5 and record["out_rel_difference"] < 8e-3
    record["state_first_over_committed"] = record["state_first_us"] / record["committed_us"]
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--tuning", default=None)
    args = parser.parse_args()
    path = tuning.apply_for_cuda()
    records = {"device": torch.cuda.get_device_name(), "tuning": None if path is None else str(path),
               "fused_conv_max_batch": gdn_decode_step.FUSED_CONV_MAX_BATCH, "split_below": gdn_decode_step.STEP_SPLIT_BELOW}  # fmt: skip
    for batch in BATCHES:
        records[f"batch_{batch}"] = one_batch(batch)
        print(batch, json.dumps(records[f"batch_{batch}"]), flush=True)
    rows = [records[f"batch_{b}"] for b in BATCHES]
    return tuning.finish_switch_timing(args.out, records, rows, "close", "state_first_us", "committed_us", KEY, args.tuning, MARGIN)


if __name__ == "__main__":
    sys.exit(main())
