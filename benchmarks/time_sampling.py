"""The sampling op's filtered path: a sort of the vocabulary against one top-k selection (`ops.sampling._top_candidates`).

    python benchmarks/time_sampling.py OUT.json [--vocab 248320] [--batches 1,8,32] [--repeats 50]

Rows sampled with the bench's SAMPLED settings (temperature 0.7, top-p 0.8, top-k 20; Qwen's recommended ones) from
random bfloat16-rounded logits [B, V] float32. Per batch and path: the median of `repeats` timings of the whole
`sample_tokens_unchecked` call (CUDA events around each call on a GPU, perf_counter on the CPU), taken in alternation
(sort, selection, sort, ...), and whether the two paths drew the same tokens for every seed tried. Those timings hold
the host's launches (some forty small ops); on a GPU each path is also recorded in a CUDA graph and its replays timed,
the device time alone (what a sampler graph costs), with a third path: the selection in two Triton launches
(`kernels/sampling_select.py`, whose draws are compared with the torch selection path's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from reference_engine.bench.measure import SAMPLED
from reference_engine.kernels import sampling_select
from reference_engine.ops.sampling import sample_tokens_unchecked, top_k_bound


def _timed(device: torch.device, call) -> float:
    if device.type != "cuda":
        begin = time.perf_counter()
        call()
        return time.perf_counter() - begin
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def measure(vocab: int, batch: int, repeats: int, device: torch.device) -> dict:
    generator = torch.Generator(device="cpu").manual_seed(batch)
    logits = (torch.randn(batch, vocab, generator=generator) * 3).to(torch.bfloat16).float().to(device)
    temperature = torch.full((batch,), SAMPLED["temperature"], device=device)
    top_k = torch.full((batch,), SAMPLED["top_k"], dtype=torch.int32, device=device)
    top_p = torch.full((batch,), SAMPLED["top_p"], device=device)
    bound = top_k_bound(temperature.tolist(), top_k.tolist(), vocab)
    out = torch.empty(batch, dtype=torch.int64, device=device)
    times: dict[str, list[float]] = {"sort": [], "selection": []}
    same = True
    for repeat in range(repeats + 2):  # the first two rounds warm up
        seeds = torch.arange(batch, dtype=torch.int64, device=device) * 7919 + repeat
        tokens = {}
        for path, candidates in (("sort", None), ("selection", bound)):
            def call(seeds=seeds, candidates=candidates):
                return sample_tokens_unchecked(logits, temperature, top_k, top_p, seeds, out, all_greedy=False, filtered=True, candidates=candidates)

            seconds = _timed(device, call)
            tokens[path] = out.clone()
            if repeat >= 2:
                times[path].append(seconds)
        same = same and torch.equal(tokens["sort"], tokens["selection"])
    sort, selection = statistics.median(times["sort"]), statistics.median(times["selection"])
    row = {"batch": batch, "sort_seconds": sort, "selection_seconds": selection, "selection_over_sort": selection / sort, "same_tokens": same}
    if device.type == "cuda":  # device time alone: each path recorded in a CUDA graph, replayed (what a sampler graph costs)
        for path, candidates, fused in (("sort", None, False), ("selection", bound, False), ("fused", bound, True)):
            sampling_select.FUSED = fused  # the two-launch selection (`kernels/sampling_select.py`)
            try:
                sample_tokens_unchecked(logits, temperature, top_k, top_p, seeds, out, all_greedy=False, filtered=True, candidates=candidates)
                if path == "fused":  # the same draws as the torch selection path
                    row["fused_same_tokens"] = torch.equal(out, tokens["selection"])
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    sample_tokens_unchecked(logits, temperature, top_k, top_p, seeds, out, all_greedy=False, filtered=True, candidates=candidates)
            finally:
                sampling_select.FUSED = False
            graph.replay()
            row[f"{path}_graph_seconds"] = _timed(device, lambda graph=graph: [graph.replay() for _ in range(repeats)]) / repeats
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab", type=int, default=248320)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = [measure(args.vocab, int(b), args.repeats, device) for b in args.batches.split(",")]
    for row in rows:
        graphs = ""
        if "sort_graph_seconds" in row:
            graphs = (f", in graphs sort / selection / fused {1e6 * row['sort_graph_seconds']:.1f} / {1e6 * row['selection_graph_seconds']:.1f} / "
                      f"{1e6 * row['fused_graph_seconds']:.1f} us, fused same tokens {row['fused_same_tokens']}")  # fmt: skip
        print(f"batch {row['batch']}: sort {1e6 * row['sort_seconds']:.1f} us, selection {1e6 * row['selection_seconds']:.1f} us, "
              f"ratio {row['selection_over_sort']:.3f}, same tokens {row['same_tokens']}{graphs}")  # fmt: skip
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    args.out.write_text(json.dumps({"device": name, "torch": torch.__version__, "vocab": args.vocab, "sampling": SAMPLED, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
