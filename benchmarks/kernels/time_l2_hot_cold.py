"""How much of a batch-1 decode kernel's time is waiting on HBM: each kernel with its weights in L2 and out of it.

    PYTHONPATH=. python3 benchmarks/kernels/time_l2_hot_cold.py OUT.json

For the batch-1 NVFP4 GEMVs at the real shapes (GDN in_proj q+k+v+z 12288 x 2048, attention q+k+v 9216 x 2048,
out_proj 2048 x 4096) and the whole MoE block decode (router, gate/up, down; 256 experts, top 8 and the shared
expert), a CUDA graph of CALLS calls runs either on one copy of the weights ("hot": after the first call they sit in
the L2 cache) or on COPIES copies in turn with a fresh input each ("cold": more bytes than the L2 holds, as in a real
step, where every layer has its own). The tuning file of this card or of its architecture is applied (with --tuning, that file instead).
If hot is much faster than cold, the kernel waits on HBM and prefetching its weights can help
(`kernels/l2_prefetch.py`); if not, its time is instruction issue, launch and dependent steps. A graph of empty
launches gives the per-launch floor. No speed is asserted.
"""

# ruff: noqa: B023 - each `step` is captured and replayed within the loop iteration that made it
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import moe_decode, nvfp4_gemv, tuning
from reference_engine.quant.nvfp4 import quantize_nvfp4

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_moe_decode import (  # the MoE layer at the real shape (router, shared expert, 256 experts)
    TOP_K,
    H,
    layer,
)

CALLS = 40
GEMVS = {"gdn in_proj qkvz": (12288, 2048), "attention qkv": (9216, 2048), "out_proj": (2048, 4096)}


@triton.jit
def _empty_kernel(out_ptr):
    if tl.program_id(0) < 0:  # never: the launch does nothing
        tl.store(out_ptr, 0)


def linear(rows: int, cols: int):
    packed, scale, scale_2 = quantize_nvfp4(torch.randn(rows, cols, device="cuda") * cols**-0.5)
    return packed, scale, scale_2.reshape(1).expand(rows).contiguous()  # one tensor scale per row, as the stacked linears


def hot_cold(call, copies: int) -> dict:
    """call(copy_index) -> microseconds per call with one copy and with `copies` copies in turn."""

    def run(count: int) -> float:
        def step():
            for index in range(CALLS):
                call(index % count)

        return graph_seconds(step, replays=20) * 1e6 / CALLS

    hot, cold = run(1), run(copies)
    return {"hot_us": hot, "cold_us": cold, "hot_over_cold": hot / cold, "copies": copies}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--tuning", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    name = torch.cuda.get_device_name()
    if args.tuning:
        tuning.apply_tuning(args.tuning)
    path = args.tuning or tuning.apply_for_cuda()  # run58 looked up the card's own file only: an H100 ran untuned
    records: dict = {"device": name, "tuning": None if path is None else str(path), "calls": CALLS}
    flag = torch.zeros(1, device="cuda", dtype=torch.int32)
    records["empty launch"] = {"us": graph_seconds(lambda: [_empty_kernel[(1,)](flag) for _ in range(CALLS)], replays=20) * 1e6 / CALLS}
    print(json.dumps(records["empty launch"]), flush=True)
    for label, (rows, cols) in GEMVS.items():
        copies = max(8, -(-200 * 2**20 // (rows * cols * 9 // 16)))  # over 200 MB in turn: four times an H200's L2
        weights = [linear(rows, cols) for _ in range(copies)]
        xs = [torch.randn(1, cols, device="cuda").bfloat16() for _ in range(copies)]
        outs = [torch.empty(1, rows, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        row = hot_cold(lambda i: nvfp4_gemv.w4a16_linear_rows(xs[i], *weights[i], outs[i]), copies)
        row["weight_bytes"] = rows * cols * 9 // 16
        records[label] = row
        print(label, json.dumps(row), flush=True)
        weights.clear()
        torch.cuda.empty_cache()
    layers = [layer() for _ in range(4)]  # 4 x 480 MB: the sibling timing script's MoE layer
    xs = [torch.randn(1, H, device="cuda").bfloat16() for _ in range(4)]
    outs = [torch.empty(1, H, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    row = hot_cold(lambda i: moe_decode.moe_block_decode(xs[i], layers[i][2], layers[i][0], layers[i][1], TOP_K, out=outs[i]), 4)
    records["moe block decode"] = row
    print("moe block decode", json.dumps(row), flush=True)
    with open(args.out, "w") as handle:
        json.dump(records, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
