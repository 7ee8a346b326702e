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

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from reference_engine.kernels import gemv_pairs, tuning
from reference_engine.presets import build_preset
from reference_engine.tokenizer import load_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_l2_prefetch import (
    one_setting,  # the sibling script's engine run (graph replay time and last logits)
)

MARGIN = 0.01  # a setting other than 0 is written only when faster than 0 by more than this fraction
KEY = "gemv_x_pairs"
SETTINGS = (0, 1, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--model", default="full", choices=("full", "tiny"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tuning", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    model = build_preset(args.model, device=device, dtype=torch.bfloat16, seed=0, quantize="nvfp4")
    tokenizer = load_tokenizer(args.model)
    prompt = torch.randint(1, model.config.vocab_size, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    samples: dict[int, list[float]] = {setting: [] for setting in SETTINGS}
    logits: dict[int, torch.Tensor] = {}
    records = []
    for round_index in range(args.rounds):
        for setting in SETTINGS:

            def configure(decoder, value=setting) -> None:  # after the engine installed the tuning file, before the capture
                gemv_pairs.X_PAIRS = value

            record, logits[setting] = one_setting(model, tokenizer, None, prompt, configure)
            record |= {"setting": setting, "round": round_index}
            records.append(record)
            samples[setting].append(record["graph_replay_us"])
            print(json.dumps(record), flush=True)
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
