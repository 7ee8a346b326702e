"""Batch-1 decode graph with and without the next layer's weights prefetched into L2 (`kernels/l2_prefetch.py`).

    PYTHONPATH=. python3 benchmarks/kernels/time_l2_prefetch.py OUT.json [--model full] [--rounds 2] [--tuning FILE]

Builds the model once (seeded random weights, NVFP4 linears, bf16 LM head, as `toolbox engine bench`), then for each
setting of `l2_prefetch.POINT` (off, "mixer", "moe"; the rounds interleave them, so drift between settings shows as
spread, not as a difference) builds an engine, decodes OUTPUT tokens greedily from one fixed prompt, and records the
GPU time of one replay of the batch-1 graph (CUDA events over the REPLAYS replays that `EngineBench.tpot` times), the runner's median step and the last step's
logits. Every setting must give the same logits bits as "off" (a
prefetch only touches the cache); the script exits 1 otherwise. With --tuning, the fastest setting (median over the
rounds) is written into that tuning file as `l2_prefetch` when it beats "off" by more than 2%. No speed is asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys

import torch

from reference_engine.bench.measure import EngineBench
from reference_engine.kernels import l2_prefetch, tuning
from reference_engine.presets import build_preset
from reference_engine.tokenizer import load_tokenizer

SETTINGS = (None, "mixer", "moe")
OUTPUT = 24
REPLAYS = 50  # EngineBench.tpot's graph replays (its default), recorded in the output
MARGIN = 0.02  # a setting replaces "off" in the tuning file only when faster by more than this fraction


def one_setting(model, tokenizer, point: str | None, prompt: list[int], configure=None) -> dict:
    """(record, last logits) of one engine run with the prefetch at `point`; `configure(decoder)`, when given, adjusts the
    runner's StaticDecoder further before the first capture (after the engine installed the card's tuning file)."""
    bench = EngineBench(model, tokenizer, "graphs", prompt_tokens=len(prompt), batch_prompt_tokens=len(prompt), output_tokens=OUTPUT, max_batch=1)
    decoder = bench.recorder.runner.decoder  # the ModelRunner's StaticDecoder (the recorder wraps the runner)
    decoder.prefetch = l2_prefetch.for_model(model, point or "off")  # before the first capture; whatever the tuning file says
    if configure is not None:
        configure(decoder)
    figures = bench.tpot(prompt)
    logits = bench.recorder.runner.last_logits[-1].detach().float().cpu()
    replay = figures["graph_replay_seconds"]  # timed inside tpot before its async runs (after them the host holds no ids to restage)
    record = {
        "point": point or "off",
        "graph_replay_us": None if replay is None else replay * 1e6,
        "runner_step_us": figures["seconds"] * 1e6,
        "prefetch_bytes_per_step": 0 if decoder.prefetch is None else decoder.prefetch.nbytes,
        "captured": list(decoder.captured_buckets),
    }
    del bench, decoder
    gc.collect()
    torch.cuda.empty_cache()
    return record, logits


def setting_run(description: str, rounds: int, more_arguments=None) -> tuple[argparse.Namespace, object, object, list[int]]:
    """The graph-setting scripts' common start: (arguments OUT, --model, --rounds, --tuning and what
    `more_arguments(parser)` adds; the model built once with seeded random weights, NVFP4 linears and bfloat16
    activations on CUDA; its tokenizer; the fixed 64-token prompt)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out")
    parser.add_argument("--model", default="full", choices=("full", "tiny"))
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--tuning", default=None)
    if more_arguments is not None:
        more_arguments(parser)
    args = parser.parse_args()
    model = build_preset(args.model, device=torch.device("cuda"), dtype=torch.bfloat16, seed=0, quantize="nvfp4")
    prompt = torch.randint(1, model.config.vocab_size, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    return args, model, load_tokenizer(args.model), prompt


def interleaved_rounds(model, tokenizer, prompt: list[int], rounds: int, settings: tuple, apply) -> tuple[list[dict], dict, dict]:
    """Each round runs `one_setting` for every setting in turn, `apply(setting)` called before the engine's capture:
    (records, graph replay us per setting, last logits per setting from the last round). Prints each record."""
    samples: dict = {setting: [] for setting in settings}
    logits: dict = {}
    records = []
    for round_index in range(rounds):
        for setting in settings:
            record, logits[setting] = one_setting(model, tokenizer, None, prompt, lambda decoder, value=setting: apply(value))
            record |= {"setting": setting, "round": round_index}
            records.append(record)
            samples[setting].append(record["graph_replay_us"])
            print(json.dumps(record), flush=True)
    return records, samples, logits


def main() -> int:
    args, model, tokenizer, prompt = setting_run(__doc__.splitlines()[0], rounds=2)
    device = torch.device("cuda")
    records, reference, mismatches = [], None, []
    for round_index in range(args.rounds):
        for point in SETTINGS:
            record, logits = one_setting(model, tokenizer, point, prompt)
            record["round"] = round_index
            if reference is None:
                reference = logits
            same = torch.equal(logits, reference)
            record["logits_equal_off"] = same
            record["logits_max_abs_diff_off"] = float((logits - reference).abs().max())
            if not same:
                mismatches.append(record["point"])
            records.append(record)
            print(json.dumps(record), flush=True)
    summary = {}
    for point in SETTINGS:
        times = [r["graph_replay_us"] for r in records if r["point"] == (point or "off") and r["graph_replay_us"] is not None]
        summary[point or "off"] = {"median_graph_replay_us": statistics.median(times) if times else None, "samples": times}
    base = summary["off"]["median_graph_replay_us"]
    for point, row in summary.items():
        if base and row["median_graph_replay_us"]:
            row["ratio_to_off"] = row["median_graph_replay_us"] / base
    document = {"device": torch.cuda.get_device_name(device), "model": args.model, "output_tokens": OUTPUT, "replays": REPLAYS,
                "records": records, "summary": summary, "mismatches": mismatches}  # fmt: skip
    with open(args.out, "w") as handle:
        json.dump(document, handle, indent=1)
    print(json.dumps(summary, indent=1))
    if mismatches:
        print(f"logits differ from 'off' with: {mismatches}", file=sys.stderr)
        return 1
    if args.tuning:
        best = min((p for p in summary if summary[p].get("ratio_to_off")), key=lambda p: summary[p]["ratio_to_off"])
        choice = best if summary[best]["ratio_to_off"] < 1 - MARGIN else "off"
        tuning.write_setting(args.tuning, "l2_prefetch", choice)
        print(f"tuning: l2_prefetch = {choice}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
