"""Batch-1 decode graph with and without the GDN b/a projection on a side stream (`kernels/side_stream.py`).

    PYTHONPATH=. python3 benchmarks/kernels/time_side_stream.py OUT.json [--model full] [--rounds 3] [--tuning FILE]

Builds the model once (seeded random weights, NVFP4 linears, bf16 LM head, as `toolbox engine bench`). Each round times
both settings, off (`BA_MAX_BATCH` 0) and on (1), so drift between them shows as spread rather than as a difference.
A setting builds an engine, decodes greedily from one fixed prompt (`time_l2_prefetch.one_setting`), and records the GPU
time of one batch-1 graph replay and the last step's logits. The two settings must give the same logits bits: they run the same kernels on the same
inputs. Otherwise the script exits 1. With --tuning, `gdn_ba_side_max_batch` is written: 1 when "on" is faster than "off"
by more than 1% (median over the rounds), else 0. No speed is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from reference_engine.kernels import side_stream, tuning
from reference_engine.presets import build_preset
from reference_engine.tokenizer import load_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_l2_prefetch import (
    one_setting,  # the sibling script's engine run (graph replay time and last logits)
)

MARGIN = 0.01  # "on" is written only when faster than "off" by more than this fraction


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--model", default="full", choices=("full", "tiny"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tuning", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    model = build_preset(args.model, device=device, dtype=torch.bfloat16, seed=0, quantize="nvfp4")
    tokenizer = load_tokenizer(args.model)
    prompt = torch.randint(1, model.config.vocab_size, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    samples: dict[str, list[float]] = {"off": [], "on": []}
    logits: dict[str, torch.Tensor] = {}
    records = []
    for round_index in range(args.rounds):
        for setting in ("off", "on"):

            def configure(decoder, max_batch=1 if setting == "on" else 0) -> None:  # after the engine installed the tuning file
                side_stream.BA_MAX_BATCH = max_batch
                decoder.side = side_stream.for_device(device)

            record, logits[setting] = one_setting(model, tokenizer, None, prompt, configure)
            record |= {"setting": setting, "round": round_index}
            records.append(record)
            samples[setting].append(record["graph_replay_us"])
            print(json.dumps(record), flush=True)
    side_stream.BA_MAX_BATCH = 0
    off, on = statistics.median(samples["off"]), statistics.median(samples["on"])
    summary = {"off_us": off, "on_us": on, "on_over_off": on / off, "samples_us": samples,
               "logits_equal": torch.equal(logits["off"], logits["on"]),
               "logits_max_abs_diff": float((logits["off"] - logits["on"]).abs().max())}  # fmt: skip
    document = {"device": torch.cuda.get_device_name(device), "model": args.model, "records": records, "summary": summary}
    Path(args.out).write_text(json.dumps(document, indent=1))
    print(json.dumps(summary))
    if not summary["logits_equal"]:
        print("the side stream changed the logits: gdn_ba_side_max_batch not written", file=sys.stderr)
        return 1
    if args.tuning:
        value = int(summary["on_over_off"] < 1 - MARGIN)
        tuning.write_setting(args.tuning, "gdn_ba_side_max_batch", value)
        print(f"tuning: gdn_ba_side_max_batch = {value} (on / off {summary['on_over_off']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
