"""Decode graphs with and without the post-attention norm folded into the MoE router launch (`router.ADD_NORM`).

    PYTHONPATH=. python3 benchmarks/kernels/time_router_add_norm.py OUT.json [--model full] [--rounds 3] [--tuning FILE]

Builds the model once (seeded random weights, NVFP4 linears, bf16 LM head, as `toolbox engine bench`). Each round times
both settings, off then on, so drift between them shows as spread rather than as a difference. A setting builds an
engine, decodes greedily from one fixed prompt (`time_l2_prefetch.one_setting`), and records the GPU time of one batch-1
graph replay (40 launches fewer with the fold) and the last step's logits. The folded norm sums its squares in another
reduction tree than the norm kernel, so a normed value may land one bf16 rounding away and the logits need not be the
same bits: the record keeps their largest difference and whether the top-1 token agrees; the script exits 1 when it
does not. With --tuning, `router_add_norm` is written: 1 when "on" is faster than "off" by more than 1% (median over
the rounds), else 0. No speed is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from reference_engine.kernels import router, tuning
from reference_engine.presets import build_preset
from reference_engine.tokenizer import load_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_l2_prefetch import (
    one_setting,  # the sibling script's engine run (graph replay time and last logits)
)

MARGIN = 0.01  # "on" is written only when faster than "off" by more than this fraction
KEY = "router_add_norm"


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

            def configure(decoder, on=setting == "on") -> None:  # after the engine installed the tuning file, before the capture
                router.ADD_NORM = on

            record, logits[setting] = one_setting(model, tokenizer, None, prompt, configure)
            record |= {"setting": setting, "round": round_index}
            records.append(record)
            samples[setting].append(record["graph_replay_us"])
            print(json.dumps(record), flush=True)
    router.ADD_NORM = False
    off, on = statistics.median(samples["off"]), statistics.median(samples["on"])
    summary = {"off_us": off, "on_us": on, "on_over_off": on / off, "samples_us": samples,
               "logits_equal": torch.equal(logits["off"], logits["on"]),
               "logits_max_abs_diff": float((logits["off"] - logits["on"]).abs().max()),
               "top1_equal": int(logits["off"].argmax()) == int(logits["on"].argmax())}  # fmt: skip
    document = {"device": torch.cuda.get_device_name(device), "model": args.model, "records": records, "summary": summary}
    Path(args.out).write_text(json.dumps(document, indent=1))
    print(json.dumps(summary))
    if not summary["top1_equal"]:
        print(f"the fold changed the top-1 token: {KEY} not written", file=sys.stderr)
        return 1
    if args.tuning:
        value = int(on < (1 - MARGIN) * off)
        tuning.write_setting(args.tuning, KEY, value)
        print(f"tuning: {KEY} = {value} (on / off {on / off:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
