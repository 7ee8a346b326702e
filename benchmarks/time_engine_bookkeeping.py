"""Time the engine's bookkeeping per step (engine step minus the runner's step) with the output text decoded whole
every step against `detokenizer.IncrementalText`, on the tiny model (CPU is enough: it is host work).

    PYTHONPATH=. python3 benchmarks/time_engine_bookkeeping.py results.json [--tokens 512] [--batches 1,8] [--rounds 2]

Per batch size and mode: B requests of 32 prompt tokens, `--tokens` greedy tokens each (ignore_eos), the median
bookkeeping over the first 50 and the last 50 decode steps. Modes alternate within each round, so both see the
same machine state. The texts of both modes are compared. No speed is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from reference_engine.detokenizer import IncrementalText
from reference_engine.llm import LLM
from reference_engine.sampling_params import SamplingParams


def run(llm: LLM, batch: int, tokens: int, incremental: bool) -> tuple[dict, list[str]]:
    engine = llm.engine
    real = engine.runner.execute
    runner_seconds: list[float] = []

    def timed(plan, rows):
        start = time.perf_counter()
        result = real(plan, rows)
        runner_seconds.append(time.perf_counter() - start)
        return result

    saved = IncrementalText.__init__

    def init(self, tokenizer):
        saved(self, tokenizer)
        self.incremental = self.incremental and incremental

    engine.runner.execute, IncrementalText.__init__ = timed, init
    try:
        ids = [engine.add_request(prompt_token_ids=list(range(1, 33)), params=SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0))
               for _ in range(batch)]  # fmt: skip
        texts: dict[str, str] = {}
        overhead: list[float] = []
        while engine.has_unfinished():
            start = time.perf_counter()
            outputs = engine.step()
            overhead.append(time.perf_counter() - start - runner_seconds[-1])
            texts.update((o.request_id, o.outputs[0].text) for o in outputs)
    finally:
        engine.runner.execute, IncrementalText.__init__ = real, saved
    decode = overhead[1:]  # the first step is the prefill
    record = {"batch": batch, "tokens": tokens, "incremental": incremental,
              "first_50_us": statistics.median(decode[:50]) * 1e6, "last_50_us": statistics.median(decode[-50:]) * 1e6,
              "runner_median_us": statistics.median(runner_seconds[1:]) * 1e6}  # fmt: skip
    return record, [texts[i] for i in ids]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    llm = LLM("tiny", max_num_seqs=max(int(b) for b in args.batches.split(",")), max_model_len=64 + args.tokens)
    records = []
    for round_ in range(args.rounds):
        for batch in (int(b) for b in args.batches.split(",")):
            whole, whole_texts = run(llm, batch, args.tokens, incremental=False)
            fast, fast_texts = run(llm, batch, args.tokens, incremental=True)
            if fast_texts != whole_texts:
                raise SystemExit(f"batch {batch}: the incremental texts differ from the whole decodes")
            for record in (whole, fast):
                records.append(record | {"round": round_})
                print(json.dumps(records[-1]), flush=True)
    Path(args.results).write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
