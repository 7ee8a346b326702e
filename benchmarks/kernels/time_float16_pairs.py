"""Batch-1 decode graphs with x handed to the NVFP4 kernels as float16 pairs by its producer (three tuning keys).

    PYTHONPATH=. python3 benchmarks/kernels/time_float16_pairs.py OUT.json [--model full] [--rounds 2] [--tuning FILE]
        [--settings "0,0,0 2,0,0 0,2,2"]

The keys: `gemv_x_pairs` (`gemv_pairs.X_PAIRS`: the norm before each mixer, the GDN step and the paged decode write the
batch-1 GEMVs' x as pairs), `moe_act_pairs` (`moe_decode.ACT_PAIRS`: the MoE gate/up kernel writes the activation as
the down kernel's pairs) and `moe_x_pairs` (`moe_decode.X_PAIRS`: the fused router's norm writes x as the gate/up
kernel's pairs); 0 off, 1 or 2 the consumer's load form. Builds the model once (seeded random weights, NVFP4
linears, bf16 LM head, as `toolbox engine bench`). Each round times every setting in SETTINGS (the keys' values in
KEYS order) in turn, so drift shows as spread rather than as a difference. A setting builds an engine, decodes
greedily from one fixed prompt (`time_l2_prefetch.one_setting`) and records the GPU time of one batch-1 graph replay and
the last step's logits (--settings: a subset, for a short call; all-off is always timed). The pairs are the same bits the kernels would build, so every setting's logits must equal
all-off's: the script exits 1 when they do not. With --tuning each key is written on its own: the value of the fastest
setting that sets only that key when it beats all-off by more than 1% (median over the rounds), else 0; a key
with no such setting timed is left as it is. No speed is
asserted.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from reference_engine.kernels import gemv_pairs, moe_decode, tuning

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_l2_prefetch import (  # the sibling script's common start and engine run (graph replay time, last logits)
    interleaved_rounds,
    setting_run,
)

MARGIN = 0.01  # a key is written non-zero only when its setting is faster than all-off by more than this fraction
KEYS = ("gemv_x_pairs", "moe_act_pairs", "moe_x_pairs")
SETTINGS = ((0, 0, 0), (1, 0, 0), (2, 0, 0), (0, 1, 0), (0, 2, 0), (0, 0, 1), (0, 0, 2), (2, 2, 2))
OFF = (0, 0, 0)


def apply(setting: tuple[int, ...]) -> None:
    gemv_pairs.X_PAIRS, moe_decode.ACT_PAIRS, moe_decode.X_PAIRS = setting


def label(setting: tuple[int, ...]) -> str:
    return ",".join(map(str, setting))


def parse_settings(text: str) -> tuple[tuple[int, ...], ...]:
    """"0,0,0 2,0,0" -> ((0, 0, 0), (2, 0, 0)): each a value 0 to 2 per key of KEYS; all-off is put first if missing."""
    settings = tuple(tuple(int(value) for value in item.split(",")) for item in text.split())
    bad = [setting for setting in settings if len(setting) != len(KEYS) or not all(0 <= value <= 2 for value in setting)]
    if bad:
        raise SystemExit(f"--settings: each item is {len(KEYS)} comma-separated values 0 to 2 ({', '.join(KEYS)}), got {bad}")
    return settings if OFF in settings else (OFF, *settings)


def main() -> int:
    args, model, tokenizer, prompt = setting_run(__doc__.splitlines()[0], rounds=2, more_arguments=lambda parser: parser.add_argument("--settings", default=None))
    settings = SETTINGS if args.settings is None else parse_settings(args.settings)
    device = torch.device("cuda")
    records, samples, logits = interleaved_rounds(model, tokenizer, prompt, args.rounds, settings, apply)
    apply(OFF)
    medians = {setting: statistics.median(values) for setting, values in samples.items()}
    unequal = [setting for setting in settings if not torch.equal(logits[OFF], logits[setting])]
    chosen = {}
    for index, key in enumerate(KEYS):  # the settings that set this key alone
        alone = [setting for setting in settings if setting[index] and not any(value for other, value in enumerate(setting) if other != index)]
        if not alone:
            continue
        best = min(alone, key=lambda setting: medians[setting])
        chosen[key] = best[index] if medians[best] < (1 - MARGIN) * medians[OFF] else 0
    summary = {"median_us": {label(s): medians[s] for s in settings}, "over_off": {label(s): medians[s] / medians[OFF] for s in settings},
               "samples_us": {label(s): samples[s] for s in settings}, "logits_unequal": [label(s) for s in unequal], "chosen": chosen}
    document = {"device": torch.cuda.get_device_name(device), "model": args.model, "keys": KEYS, "records": records, "summary": summary}
    Path(args.out).write_text(json.dumps(document, indent=1))
    print(json.dumps(summary))
    if unequal:
        print(f"the pairs changed the logits at {unequal}: nothing written", file=sys.stderr)
        return 1
    if args.tuning:
        for key, value in chosen.items():
            tuning.write_setting(args.tuning, key, value)
            print(f"tuning: {key} = {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
