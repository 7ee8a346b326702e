"""Engine decode steps with and without async decoding, on a preset model, in one process (rounds alternate modes).

    python benchmarks/time_async_decode.py OUT.json [--preset tiny] [--batches 1,8] [--tokens 200] [--rounds 2]

Per batch and mode: the median seconds of the engine steps that returned a decode token for every request (greedy,
ignore_eos), over the steps after the first 8. On CUDA the engine replays decode graphs ("graphs" mode, the Triton ops)
and the JSON adds the GPU time of one graph replay of that bucket: what an async step can at best approach. On the CPU
it runs the static path ("static"), where host and device are the same cores and nothing can overlap.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from reference_engine.bench.measure import graph_replay_seconds
from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.presets import build_preset
from reference_engine.sampling_params import SamplingParams
from reference_engine.tokenizer import load_tokenizer


def steps(engine: LLMEngine, prompts: list[list[int]], tokens: int) -> list[float]:
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    ids = {engine.add_request(prompt_token_ids=prompt, params=params) for prompt in prompts}
    timed = []
    while engine.has_unfinished():
        begin = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - begin
        if sum(o.request_id in ids and len(o.outputs[0].token_ids) > 1 for o in outputs) == len(prompts):
            timed.append(elapsed)
    return timed[8:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    model = build_preset(args.preset, device=device, dtype=dtype, quantize="nvfp4" if cuda else None, seed=0)
    batches = [int(b) for b in args.batches.split(",")]
    config = EngineConfig(device=device, dtype=str(dtype).removeprefix("torch."), max_num_seqs=max(batches), max_model_len=args.tokens + 64,
                          block_size=16, num_blocks=max(batches) * (-(-(args.tokens + 64) // 16)))  # fmt: skip
    engine = LLMEngine(model, load_tokenizer(args.preset), config, decode_mode="graphs" if cuda else "static")
    generator = torch.Generator().manual_seed(0)
    results = {"device": torch.cuda.get_device_name() if cuda else "cpu", "preset": args.preset, "tokens": args.tokens, "batches": {}}
    for batch in batches:
        prompts = [torch.randint(1, model.config.vocab_size, (32,), generator=generator).tolist() for _ in range(batch)]
        engine.async_decode = False
        steps(engine, prompts, 16)  # warm-up: captures the bucket's graph
        samples: dict[str, list[float]] = {"sync": [], "async": []}
        for _ in range(args.rounds):
            for mode in ("sync", "async"):
                engine.async_decode = mode == "async"
                samples[mode] += steps(engine, prompts, args.tokens)
        figures = {mode: statistics.median(values) for mode, values in samples.items()}
        if cuda:  # the same bucket's graph alone, replayed back to back (the bench's method)
            engine.async_decode = False
            steps(engine, prompts, 12)  # async steps leave placeholder ids on the host, which a replay must not repeat
            decoder = engine.runner.decoder
            figures["graph_replay"] = graph_replay_seconds(decoder, next(b for b in decoder.buckets if b >= batch))
        figures["async_over_sync"] = figures["async"] / figures["sync"]
        results["batches"][str(batch)] = figures
        print(f"batch {batch}: " + ", ".join(f"{k} {v * 1e3:.3f} ms" if k != "async_over_sync" else f"{k} {v:.3f}" for k, v in figures.items() if v is not None))
    engine.async_decode = False
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
