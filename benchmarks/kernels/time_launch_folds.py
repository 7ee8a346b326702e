"""Batch-1 decode graphs with this session's launch savings on and off (three tuning keys).

    PYTHONPATH=. python3 benchmarks/kernels/time_launch_folds.py OUT.json [--model full] [--rounds 2] [--tuning FILE]

The keys: `gdn_step_ba_fold_max_batch` (`gdn_decode_step.BA_FOLD_MAX_BATCH`: the GDN step computes b and a itself, no
b/a launch; 30 launches a step), `moe_gate_up_topk_max_tokens` (`moe_decode.GATE_UP_TOPK_MAX_TOKENS`: the fused router
writes logits only and the MoE gate/up launch picks the experts; the router's ticket and top-k tail go, 40 layers) and
`pdl` (`pdl.MODE`: the decode kernels with programmatic dependent launch, the next one released at the start, 1, or
after the main loop, 2). A setting is the three values (SETTINGS: each alone, then all three). Builds the model once
(seeded random weights, NVFP4 linears, bf16 LM head, as `toolbox engine bench`); each round times every setting in
turn (`time_l2_prefetch.one_setting`: the GPU time of one batch-1 graph replay and the last step's logits), so drift
shows as spread. The top-k move and PDL keep the arithmetic: with the fold off their logits must be all-off's bit for
bit (exit 1 otherwise). The b/a fold may differ in the last float32 bit of b or a (the GPU's reduction tree): its
logits are compared to all-off's and the largest difference recorded. With --tuning each key is written on its own:
`moe_gate_up_topk_max_tokens` 1 and `pdl` the faster mode when the setting alone beats all-off by more than 1% (median
over the rounds), else 0; `gdn_step_ba_fold_max_batch` 0 when its setting alone does not, else left as
`time_ba_fold.py` wrote it (its batch ceiling). No speed is asserted.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from reference_engine.kernels import gdn_decode_step, moe_decode, pdl, tuning

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_l2_prefetch import (  # the sibling script's common start and engine run (graph replay time, last logits)
    interleaved_rounds,
    setting_run,
)

MARGIN = 0.01
KEYS = ("gdn_step_ba_fold_max_batch", "moe_gate_up_topk_max_tokens", "pdl")
SETTINGS = ((0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 0, 2), (1, 1, 2))
OFF = (0, 0, 0)


def apply(setting: tuple[int, int, int]) -> None:
    gdn_decode_step.BA_FOLD_MAX_BATCH, moe_decode.GATE_UP_TOPK_MAX_TOKENS, pdl.MODE = setting


def label(setting: tuple[int, ...]) -> str:
    return ",".join(map(str, setting))


def alone(settings: tuple, index: int) -> list:
    """The settings that set key `index` and no other."""
    return [s for s in settings if s[index] and not any(value for other, value in enumerate(s) if other != index)]


def main() -> int:
    args, model, tokenizer, prompt = setting_run(__doc__.splitlines()[0], rounds=2)
    records, samples, logits = interleaved_rounds(model, tokenizer, prompt, args.rounds, SETTINGS, apply)
    apply(OFF)
    medians = {setting: statistics.median(values) for setting, values in samples.items()}
    differences = {label(s): float((logits[s] - logits[OFF]).abs().max()) for s in SETTINGS}
    unequal = [label(s) for s in SETTINGS if s[0] == 0 and not torch.equal(logits[s], logits[OFF])]
    chosen = {}
    for index, key in enumerate(KEYS):
        best = min(alone(SETTINGS, index), key=lambda setting: medians[setting])
        chosen[key] = best[index] if medians[best] < (1 - MARGIN) * medians[OFF] else 0
    summary = {"median_us": {label(s): medians[s] for s in SETTINGS}, "over_off": {label(s): medians[s] / medians[OFF] for s in SETTINGS},
               "samples_us": {label(s): samples[s] for s in SETTINGS}, "logits_max_abs_difference": differences,
               "logits_unequal": unequal, "chosen": chosen}  # fmt: skip
    document = {"device": torch.cuda.get_device_name(), "model": args.model, "keys": KEYS, "records": records, "summary": summary}
    Path(args.out).write_text(json.dumps(document, indent=1))
    print(json.dumps(summary))
    if unequal:
        print(f"a setting that keeps the arithmetic changed the logits at {unequal}: nothing written", file=sys.stderr)
        return 1
    if args.tuning:
        for key, value in chosen.items():
            if key == KEYS[0] and value:  # a win here leaves the batch ceiling that time_ba_fold.py wrote
                continue
            tuning.write_setting(args.tuning, key, value)
            print(f"tuning: {key} = {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
