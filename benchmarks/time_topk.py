"""`torch.topk` over a vocabulary row by key dtype: what the sampler's selection path (int64 keys) pays for exact ties.

    python benchmarks/time_topk.py OUT.json [--vocab 248320] [--count 32] [--batches 1,8] [--repeats 50]

Per batch and key dtype (float32, int32, int64): the device time of one `torch.topk(keys, count)` recorded in a CUDA
graph and replayed `repeats` times (CUDA events around the replays), beside the device time of the whole filtered
sampling op on its selection path. Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from reference_engine.ops.sampling import sample_tokens_unchecked


def _graph_seconds(call, repeats: int) -> float:
    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab", type=int, default=248320)
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("time_topk.py needs a CUDA device")
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        values = torch.randn(batch, args.vocab, device="cuda")
        row = {"batch": batch}
        for dtype in (torch.float32, torch.int32, torch.int64):
            keys = values if dtype == torch.float32 else (values * 1e6).to(dtype)
            row[str(dtype).removeprefix("torch.")] = _graph_seconds(lambda keys=keys: torch.topk(keys, args.count, dim=-1), args.repeats)
        settings = (torch.full((batch,), 0.7, device="cuda"), torch.full((batch,), 20, dtype=torch.int32, device="cuda"),
                    torch.full((batch,), 0.8, device="cuda"), torch.arange(batch, device="cuda"))  # fmt: skip
        out = torch.empty(batch, dtype=torch.int64, device="cuda")
        row["sampling_selection"] = _graph_seconds(
            lambda values=values, settings=settings, out=out: sample_tokens_unchecked(values, *settings, out, all_greedy=False, filtered=True,
                                                                                      candidates=args.count),
            args.repeats,
        )
        rows.append(row)
        print(", ".join(f"{k} {1e6 * v:.1f} us" if k != "batch" else f"batch {v}" for k, v in row.items()))
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "vocab": args.vocab, "count": args.count, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
