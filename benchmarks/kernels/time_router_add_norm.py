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

import json
import statistics
import sys
from pathlib import Path

import torch

from reference_engine.kernels import router, tuning

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_l2_prefetch import (  # the sibling script's common start and engine run (graph replay time, last logits)
    interleaved_rounds,
    setting_run,
)

MARGIN = 0.01  # "on" is written only when faster than "off" by more than this fraction
KEY = "router_add_norm"


def main() -> int:
    args, model, tokenizer, prompt = setting_run(__doc__.splitlines()[0], rounds=3)
    device = torch.device("cuda")
    records, samples, logits = interleaved_rounds(model, tokenizer, prompt, args.rounds, ("off", "on"),
                                                  lambda setting: setattr(router, "ADD_NORM", setting == "on"))  # fmt: skip
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
