"""The prefill NVFP4 linears two ways, on the GPU: the tensor-core GEMM that decodes in its K loop (`nvfp4_gemm.w4a16_gemm`)
against a bfloat16 copy of the weight and cuBLAS (`nvfp4_dequant.dequant_matmul`), both through `nvfp4_gemv.w4a16_linear`.

    PYTHONPATH=. python3 benchmarks/kernels/time_dequant_gemm.py OUT.json [TUNING.json]

Shapes: a GDN layer's in_proj (12288 x 2048) and out_proj (2048 x 4096), an attention layer's q+k+v (9216 x 2048), the
shared expert's gate/up (1024 x 2048) and down (2048 x 512); 128, 512 and 1024 tokens. Each is a CUDA graph of CALLS calls on
distinct weight copies (more bytes than the L2 holds); the figure is graph time / CALLS, with the TFLOP/s it implies.
Outputs are checked against the torch op first. With TUNING, `dequant_min_tokens` is set to the smallest token count
from which the copy wins on the summed shapes at every larger count measured (removed when it never does).
No speed is asserted.
"""

from __future__ import annotations

import json
import sys

import torch

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import nvfp4_dequant, nvfp4_gemv
from reference_engine.kernels.tuning import apply_for_cuda
from reference_engine.quant.linear import w4a16_linear as torch_linear
from reference_engine.quant.nvfp4 import quantize_nvfp4

SHAPES = {"gdn in_proj": (12288, 2048), "gdn out_proj": (2048, 4096), "attn q+k+v": (9216, 2048), "shared gate/up": (1024, 2048), "shared down": (2048, 512)}
TOKENS = (128, 512, 1024)
CALLS = 8
PATHS = {"tensor-core GEMM": None, "bf16 copy + cuBLAS": 65}  # nvfp4_dequant.MIN_TOKENS for each


def main(path: str, tuning_path: str | None) -> None:
    apply_for_cuda()  # the committed GEMM tiles and decode
    torch.manual_seed(0)
    records = []
    for name, (rows, cols) in SHAPES.items():
        packed, scale, scale_2 = quantize_nvfp4(torch.randn(rows, cols, device="cuda") * cols**-0.5)
        copies = max(2, min(CALLS, -(-130_000_000 // (packed.numel() + scale.numel()))))
        weights = [(packed, scale, scale_2)] + [(packed.clone(), scale.clone(), scale_2) for _ in range(copies - 1)]
        for tokens in TOKENS:
            x = torch.randn(tokens, cols, device="cuda").bfloat16()
            expected = torch.empty(tokens, rows, device="cuda", dtype=torch.bfloat16)
            torch_linear(x, packed, scale, scale_2, expected)
            out = torch.empty_like(expected)
            for label, min_tokens in PATHS.items():
                nvfp4_dequant.MIN_TOKENS = min_tokens
                check = torch.full_like(expected, float("nan"))
                nvfp4_gemv.w4a16_linear(x, packed, scale, scale_2, check)
                error = float((check.double() - expected.double()).norm() / expected.double().norm())

                def step():
                    for index in range(CALLS):
                        nvfp4_gemv.w4a16_linear(x, *weights[index % copies], out)  # noqa: B023 - replayed in this iteration

                us = graph_seconds(step) * 1e6 / CALLS
                records.append({"shape": name, "N": rows, "K": cols, "tokens": tokens, "path": label, "us": us, "rel_error": error,
                                "tflops": 2 * tokens * rows * cols / (us * 1e-6) / 1e12})  # fmt: skip
            pair = records[-2:]
            print(f"{name:15s} M={tokens:5d}: " + "; ".join(f"{r['path']} {r['us']:7.1f} us ({r['tflops']:.0f} TFLOP/s, err {r['rel_error']:.1e})" for r in pair), flush=True)
        with open(path, "w") as handle:
            json.dump(records, handle, indent=1)
    nvfp4_dequant.MIN_TOKENS = None
    if tuning_path:
        summed = {(t, p): sum(r["us"] for r in records if r["tokens"] == t and r["path"] == p) for t in TOKENS for p in PATHS}
        ok = all(r["rel_error"] < 5e-3 for r in records)
        wins = [t for t in TOKENS if summed[(t, "bf16 copy + cuBLAS")] < summed[(t, "tensor-core GEMM")]]
        start = next((t for t in TOKENS if all(b in wins for b in TOKENS if b >= t)), None)
        with open(tuning_path) as handle:
            tuning = json.load(handle)
        tuning.pop("dequant_min_tokens", None)
        if ok and start is not None:
            tuning["dequant_min_tokens"] = start
        with open(tuning_path, "w") as handle:
            json.dump(tuning, handle, indent=1)
        print("summed us:", {f"{t} {p}": round(v, 1) for (t, p), v in summed.items()}, "-> dequant_min_tokens", tuning.get("dequant_min_tokens"))


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        print(__doc__)
        raise SystemExit(2)
    main(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else None)
