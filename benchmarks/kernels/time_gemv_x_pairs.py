"""Batch-1 decode graphs with the mixer's first GEMV reading x as float16 pairs written by the norm (`gemv_pairs.X_PAIRS`).

    PYTHONPATH=. python3 benchmarks/kernels/time_gemv_x_pairs.py OUT.json [--model full] [--rounds 2] [--tuning FILE]

Builds the model once (seeded random weights, NVFP4 linears, bf16 LM head, as `toolbox engine bench`). Each round times
the settings 0 (every GEMV program converts x), 1 and 2 (the pairs, the kernel's two load forms) in turn, so drift shows
as spread rather than as a difference. A setting builds an engine, decodes greedily from one fixed prompt
(`time_l2_prefetch.one_setting`) and records the GPU time of one batch-1 graph replay and the last step's logits. The
pairs are the same bits the kernel would build, so the logits must be equal: the script exits 1 when they are not. With
--tuning, `gemv_x_pairs` is written: the fastest setting when it beats 0 by more than 1% (median over the rounds), else 0.
No speed is asserted.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from reference_engine.kernels import gemv_pairs, tuning

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_l2_prefetch import (  # the sibling script's common start and engine run (graph replay time, last logits)
    interleaved_rounds,
    setting_run,
)

MARGIN = 0.01  # a setting other than 0 is written only when faster than 0 by more than this fraction
KEY = "gemv_x_pairs"
SETTINGS = (0, 1, 2)


def main() -> int:
    args, model, tokenizer, prompt = setting_run(__doc__.splitlines()[0], rounds=2)
    device = torch.device("cuda")
    records, samples, logits = interleaved_rounds(model, tokenizer, prompt, args.rounds, SETTINGS,
                                                  lambda setting: setattr(gemv_pairs, "X_PAIRS", setting))  # fmt: skip
    gemv_pairs.X_PAIRS = 0
    medians = {setting: statistics.median(values) for setting, values in samples.items()}
    best = min(SETTINGS, key=lambda setting: medians[setting])
    equal = all(torch.equal(logits[0], logits[setting]) for setting in SETTINGS)
    summary = {"median_us": medians, "over_off": {setting: medians[setting] / medians[0] for setting in SETTINGS}, "samples_us": samples,
               "logits_equal": equal, "best": best}  # fmt: skip
    document = {"device": torch.cuda.get_device_name(device), "model": args.model, "records": records, "summary": summary}
    Path(args.out).write_text(json.dumps(document, indent=1))
    print(json.dumps(summary))
    if not equal:
        print(f"the pairs changed the logits: {KEY} not written", file=sys.stderr)
        return 1
    if args.tuning:
        value = best if medians[best] < (1 - MARGIN) * medians[0] else 0
        tuning.write_setting(args.tuning, KEY, value)
        print(f"tuning: {KEY} = {value} (best {best}: {medians[best] / medians[0]:.4f} of off)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
