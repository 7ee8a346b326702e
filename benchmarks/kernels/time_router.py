"""Time the fused MoE router (logits + top-k + shared slot in one launch) under logits rows and warps per program.

    PYTHONPATH=. python3 benchmarks/kernels/time_router.py OUT.json [--tuning IN OUT]

The real router (257 x 2048 bf16: 256 experts and the shared expert's gate row), 64 distinct weights cycled in a
CUDA graph of `time_decode_pieces.CALLS` calls (more bytes than the L2 holds, as in a step where every layer has its
own), at the batches the fused launch serves (1 to `router.FUSED_ROUTER_MAX_TOKENS`, at most 8). Every setting's ids
must equal the committed setting's and its weights match to 1e-5 before it is timed (the same sums: a row's logit is
one program's float32 sum whatever the rows per program; the warps change only the reduction tree). `--tuning IN OUT`
writes OUT = IN with `router_rows` / `router_warps` of the setting of least total time, only when that total is at
least 3% below the committed setting's. No speed is asserted.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_decode_pieces import timed

from reference_engine.kernels import router
from reference_engine.kernels.tuning import apply_for_cuda

ROWS = (1, 2, 4, 8)
WARPS = (1, 2, 4, 8)
MIN_GAIN = 1.03


def main(path: str, tuning_in: str | None, tuning_out: str | None) -> None:
    apply_for_cuda()
    committed = router.ROUTER_ROWS, router.ROUTER_WARPS
    batches = [b for b in (1, 2, 4, 8) if b <= router.FUSED_ROUTER_MAX_TOKENS] or [1]
    copies = 64
    g = torch.Generator(device="cuda").manual_seed(1)
    weights = [(torch.randn(257, 2048, device="cuda", generator=g) * 2048**-0.5).bfloat16() for _ in range(copies)]
    records: list[dict] = []
    totals: dict[tuple[int, int], float] = {}
    for setting in [committed, *(s for s in itertools.product(ROWS, WARPS) if s != committed)]:
        router.ROUTER_ROWS, router.ROUTER_WARPS = setting
        total = 0.0
        for batch in batches:
            x = torch.randn(batch, 2048, device="cuda", generator=torch.Generator(device="cuda").manual_seed(batch)).bfloat16()
            topk_w, topk_i = torch.empty(batch, 9, device="cuda"), torch.empty(batch, 9, dtype=torch.int32, device="cuda")

            def call(index, x=x, topk_w=topk_w, topk_i=topk_i):
                router.router_gemv_topk_with_shared(x, weights[index], topk_w, topk_i, 8)

            call(0)
            got = topk_w.clone(), topk_i.clone()
            router.ROUTER_ROWS, router.ROUTER_WARPS = committed
            call(0)
            want = topk_w.clone(), topk_i.clone()
            router.ROUTER_ROWS, router.ROUTER_WARPS = setting
            same = bool(torch.equal(got[1], want[1])) and bool(torch.allclose(got[0], want[0], rtol=1e-5, atol=1e-6))
            us = timed(call, copies) if same else float("nan")
            total += us
            records.append({"rows": setting[0], "warps": setting[1], "batch": batch, "us": us, "same_as_committed": same})
            print(f"rows {setting[0]} warps {setting[1]} batch {batch}: {us:6.2f} us (same ids and weights as committed: {same})", flush=True)
        totals[setting] = total
        Path(path).write_text(json.dumps(records, indent=1))
    router.ROUTER_ROWS, router.ROUTER_WARPS = committed
    best = min((s for s in totals if totals[s] == totals[s]), key=totals.get)
    summary = {"committed": list(committed), "best": list(best), "best_total_us": totals[best], "committed_total_us": totals[committed], "batches": batches}
    print(f"router settings: {summary}", flush=True)
    records.append(summary)
    Path(path).write_text(json.dumps(records, indent=1))
    if tuning_in and tuning_out and totals[committed] / totals[best] >= MIN_GAIN:
        tuning = json.loads(Path(tuning_in).read_text())
        tuning["router_rows"], tuning["router_warps"] = best
        Path(tuning_out).write_text(json.dumps(tuning, indent=1) + "\n")
        print(f"wrote {tuning_out}: router_rows {best[0]}, router_warps {best[1]}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results")
    parser.add_argument("--tuning", nargs=2, metavar=("IN", "OUT"))
    args = parser.parse_args()
    main(args.results, *(args.tuning or (None, None)))
