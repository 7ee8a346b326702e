"""Tensor-core NVFP4 GEMMs with byte reads vs int32 word reads, at decode batches and a prefill, on a GPU.

    PYTHONPATH=. python3 benchmarks/kernels/time_gemm_words.py results.json [tuning.json]

Plain GEMM (`w4a16_gemm`) at the GDN in_proj and out_proj shapes and the grouped routed experts
(`nvfp4_moe_prefill`, E=256, H=2048, I=512, top-8, random distinct experts per token) at 8, 32, 64 and
1024 tokens; outputs of the two reads compared (relative Frobenius) before timing. Weights rotate over
copies inside a CUDA graph so they stream from HBM. With a tuning file path, sets its `gemm_words` to 1
when word reads win the summed time, else 0 (the file is rewritten in place). No speed is asserted.
"""

# ruff: noqa: B023 - the closures run within the loop iteration that made them
from __future__ import annotations

import json
import sys

import torch

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import nvfp4_gemm
from reference_engine.kernels.moe_decode import stack_nvfp4_experts
from reference_engine.quant.nvfp4 import quantize_nvfp4

CALLS, COPIES = 6, 3
LINEARS = {"gdn in_proj qkv+z": (12288, 2048), "gdn out_proj": (2048, 4096)}
TOKENS = (8, 32, 64, 1024)
E, H, I, TOP_K = 256, 2048, 512, 8


def timed(step) -> float:
    return graph_seconds(step) * 1e6 / CALLS


def main(path: str, tuning_path: str | None) -> None:
    torch.manual_seed(0)
    records = []
    for name, (rows, cols) in LINEARS.items():
        weights = [quantize_nvfp4(torch.randn(rows, cols, device="cuda") * cols**-0.5) for _ in range(COPIES)]
        for tokens in TOKENS:
            x = torch.randn(tokens, cols, device="cuda").bfloat16()
            out = torch.empty(tokens, rows, device="cuda", dtype=torch.bfloat16)
            results = {}
            for words in (0, 1):
                nvfp4_gemm.WORDS = words
                check = torch.full_like(out, float("nan"))
                nvfp4_gemm.w4a16_gemm(x, *weights[0], check)
                results[words] = check
                us = timed(lambda: [nvfp4_gemm.w4a16_gemm(x, *weights[i % COPIES], out) for i in range(CALLS)])
                records.append({"kernel": "gemm", "shape": name, "tokens": tokens, "words": words, "us": us})
            agree = float((results[1].double() - results[0].double()).norm() / results[0].double().norm())
            print(f"{name:18s} M={tokens:5d}: bytes {records[-2]['us']:8.1f} us, words {records[-1]['us']:8.1f} us (outputs rel {agree:.1e})", flush=True)
            records[-1]["rel_vs_bytes"] = agree
    layers = []
    for _ in range(COPIES):
        def part(rows, cols):
            return [quantize_nvfp4(torch.randn(rows, cols, device="cuda") * cols**-0.5) for _ in range(E)]

        layers.append(stack_nvfp4_experts(part(I, H), part(I, H), part(H, I)))
    for tokens in TOKENS:
        x = torch.randn(tokens, H, device="cuda").bfloat16()
        ids = torch.stack([torch.randperm(E, device="cuda")[:TOP_K] for _ in range(tokens)]).int()
        weights = torch.softmax(torch.randn(tokens, TOP_K, device="cuda"), -1)
        out = torch.empty(tokens, H, device="cuda", dtype=torch.bfloat16)
        results = {}
        for words in (0, 1):
            nvfp4_gemm.WORDS = words
            check = torch.full_like(out, float("nan"))
            nvfp4_gemm.nvfp4_moe_prefill(x, weights, ids, layers[0], check)
            results[words] = check
            us = timed(lambda: [nvfp4_gemm.nvfp4_moe_prefill(x, weights, ids, layers[i % COPIES], out) for i in range(CALLS)])
            records.append({"kernel": "moe", "shape": "routed experts", "tokens": tokens, "words": words, "us": us})
        agree = float((results[1].double() - results[0].double()).norm() / results[0].double().norm())
        records[-1]["rel_vs_bytes"] = agree
        print(f"{'moe routed':18s} T={tokens:5d}: bytes {records[-2]['us']:8.1f} us, words {records[-1]['us']:8.1f} us (outputs rel {agree:.1e})", flush=True)
    nvfp4_gemm.WORDS = 0
    with open(path, "w") as handle:
        json.dump(records, handle, indent=1)
    if tuning_path:
        totals = {w: sum(r["us"] for r in records if r["words"] == w) for w in (0, 1)}
        agree = all(r.get("rel_vs_bytes", 0.0) < 1e-2 for r in records)
        with open(tuning_path) as handle:
            tuning = json.load(handle)
        tuning["gemm_words"] = int(agree and totals[1] < totals[0])
        with open(tuning_path, "w") as handle:
            json.dump(tuning, handle, indent=1)
        print(f"summed us: bytes {totals[0]:.0f}, words {totals[1]:.0f}; gemm_words = {tuning['gemm_words']}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        print(__doc__)
        raise SystemExit(2)
    main(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else None)
