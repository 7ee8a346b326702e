"""Decode graphs with and without the GDN b/a projection on a side stream (`kernels/side_stream.py`, `BA_MAX_BATCH`).

    PYTHONPATH=. python3 benchmarks/kernels/time_side_stream.py OUT.json [--batches 1,8,32] [--model full] [--rounds 3] [--tuning FILE]

Builds the model once (seeded random weights, NVFP4 linears, bf16 LM head, as `toolbox engine bench`). Each round times
both settings, off (`BA_MAX_BATCH` 0) and on, so drift between them shows as spread rather than as a difference.
A setting builds an engine, decodes greedily from one fixed prompt (`time_l2_prefetch.one_setting`), and records the GPU
time of one batch-1 graph replay and the last step's logits. The branch runs the same kernels on the same inputs, so
the logits must be the same bits; otherwise the script exits 1. With --tuning, `gdn_ba_side_max_batch` is written: 1 when "on" is faster than "off" by more than 1% (median over the rounds), else 0.
With `--batches` listing batches above 1, the graph of each of those batches is timed too (an engine with that many
sequences, the switch on up to the largest), and the key becomes the largest listed batch up to which "on" wins at every
listed batch: by more than 1% at batch 1, by more than 0.5% above it. No speed is asserted.
"""

from __future__ import annotations

import argparse
import gc
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

MARGIN = 0.01  # "on" is written only when faster than "off" by more than this fraction (batch 1)
MARGIN_ABOVE_ONE = 0.005  # the same above batch 1, where the branch is a smaller share of the step
BATCH_OUTPUT = 8  # tokens decoded per sequence when a larger batch's graph is captured and timed


def batch_replay_us(model, tokenizer, prompt: list[int], batch: int, configure) -> float | None:
    """GPU time of one replay of the `batch`-row decode graph, with `configure(decoder)` applied before the capture."""
    from reference_engine.bench.measure import EngineBench

    bench = EngineBench(model, tokenizer, "graphs", prompt_tokens=len(prompt), batch_prompt_tokens=len(prompt), output_tokens=BATCH_OUTPUT,
                        max_batch=batch)  # fmt: skip
    configure(bench.recorder.runner.decoder)
    seconds = bench.throughput(batch)["graph_replay_seconds"]
    del bench
    gc.collect()
    torch.cuda.empty_cache()
    return None if seconds is None else seconds * 1e6


def max_batch_won(per_batch: dict[int, dict]) -> int:
    """The largest timed batch up to which "on" beats "off" at every timed batch (MARGIN at 1, MARGIN_ABOVE_ONE above)."""
    best = 0
    for batch in sorted(per_batch):
        margin = MARGIN if batch == 1 else MARGIN_ABOVE_ONE
        if not per_batch[batch]["on_over_off"] < 1 - margin:
            break
        best = batch
    return best
KEY = "gdn_ba_side_max_batch"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--model", default="full", choices=("full", "tiny"))
    parser.add_argument("--batches", default="1", help="comma-separated decode batches to time (1 always)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tuning", default=None)
    args = parser.parse_args()
    batches = sorted({1, *(int(b) for b in args.batches.split(","))})
    device = torch.device("cuda")
    model = build_preset(args.model, device=device, dtype=torch.bfloat16, seed=0, quantize="nvfp4")
    tokenizer = load_tokenizer(args.model)
    prompt = torch.randint(1, model.config.vocab_size, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    samples: dict[str, list[float]] = {"off": [], "on": []}
    logits: dict[str, torch.Tensor] = {}
    records = []
    for round_index in range(args.rounds):
        for setting in ("off", "on"):

            def configure(decoder, max_batch=batches[-1] if setting == "on" else 0) -> None:  # after the engine installed the tuning file
                side_stream.BA_MAX_BATCH = max_batch
                decoder.side = side_stream.for_device(device)

            record, logits[setting] = one_setting(model, tokenizer, None, prompt, configure)
            record |= {"setting": setting, "round": round_index}
            for batch in batches[1:]:
                record[f"graph_replay_us_batch_{batch}"] = batch_replay_us(model, tokenizer, prompt, batch, configure)
            records.append(record)
            samples[setting].append(record["graph_replay_us"])
            print(json.dumps(record), flush=True)
    side_stream.BA_MAX_BATCH = 0
    per_batch = {}
    for batch in batches:
        field = "graph_replay_us" if batch == 1 else f"graph_replay_us_batch_{batch}"
        times = {setting: statistics.median(r[field] for r in records if r["setting"] == setting) for setting in ("off", "on")}
        per_batch[batch] = times | {"on_over_off": times["on"] / times["off"]}
    off, on = statistics.median(samples["off"]), statistics.median(samples["on"])
    difference = float((logits["off"] - logits["on"]).abs().max())
    summary = {"off_us": off, "on_us": on, "on_over_off": on / off, "samples_us": samples,
               "logits_equal": torch.equal(logits["off"], logits["on"]), "logits_max_abs_diff": difference,
               "top1_equal": int(logits["off"].argmax()) == int(logits["on"].argmax()), "per_batch": per_batch}  # fmt: skip
    document = {"device": torch.cuda.get_device_name(device), "model": args.model, "records": records, "summary": summary}
    Path(args.out).write_text(json.dumps(document, indent=1))
    print(json.dumps(summary))
    if not summary["logits_equal"]:
        print(f"the side stream changed the logits: {KEY} not written", file=sys.stderr)
        return 1
    if args.tuning:
        value = max_batch_won(per_batch)
        tuning.write_setting(args.tuning, KEY, value)
        ratios = ", ".join(f"batch {b}: {row['on_over_off']:.4f}" for b, row in per_batch.items())
        print(f"tuning: {KEY} = {value} (on / off {ratios})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
