"""Tile sweep of the W4A16 NVFP4 GEMV at the decode shapes of Qwen3.6-35B-A3B (batch 1), on a GPU.

    PYTHONPATH=. python3 benchmarks/kernels/sweep_w4a16_gemv.py results.json [--batch-one | --batch-one-half]

Each configuration (BLOCK_M, BLOCK_N, BLOCK_KB, SPLIT_K, num_warps, K loop: 0 plain, 1 unrolled, 3 pipelined in 3 stages,
weight reads: 0 bytes, 1 int32 words, 2 int64 scale blocks in packed float16 pairs) is timed as a CUDA graph of
`CALLS` back-to-back calls, each on its own copy of the weights (copies together > 2x the 60 MB L2,
so every call streams its weights from HBM as in a real step, where each layer has its own). The
figure is graph time / CALLS: the in-graph cost of one call, launch gaps included. Bytes: packed
weights + block scales + x + out. Each configuration's output is checked against the torch op
(relative Frobenius error) before it is timed. Prints the best configurations per shape and the
default `plan`'s, and writes every record as JSON. `--batch-one-half`: batch 1 only, the packed float16 pairs
only (2 to 8 warps, down to 8 bytes per thread), no LM head. At batch 8, 32 and 64 it times the default GEMV (both
weight reads) against the tensor-core GEMM of `kernels/nvfp4_gemm.py` (`write_tuning.py` picks the crossover). No speed is asserted.
"""

from __future__ import annotations

import itertools
import json
import sys

import torch

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import nvfp4_gemv
from reference_engine.quant.linear import w4a16_linear as torch_linear
from reference_engine.quant.nvfp4 import quantize_nvfp4

SHAPES = {  # name: (N, K)
    "gdn in_proj qkv+z": (12288, 2048),
    "gdn out_proj": (2048, 4096),
    "attn q+k+v": (9216, 2048),
    "lm head (nvfp4)": (248320, 2048),
}
CALLS = 20
TOKENS = (1, 8, 32, 64)  # batch 1: the tile sweep; larger batches: default GEMV (byte and word reads) vs the tensor-core GEMM
COPY_BANDWIDTH = 4.27e12


def copies_for(nbytes: int) -> int:
    return max(2, min(CALLS, -(-130_000_000 // nbytes)))


def time_config(x, weights, out, config) -> float:
    def step():
        for index in range(CALLS):
            packed, scale, scale_2 = weights[index % len(weights)]
            nvfp4_gemv.launch_w4a16_gemv(x, packed, scale, scale_2, out, config=config)

    return graph_seconds(step) * 1e6 / CALLS


def candidates(default: tuple[int, ...], rows: int, k_bytes: int, half_only: bool = False) -> list[tuple[int, ...]]:
    """Byte reads: the default plan and the best of run3; word reads: row blocks x K steps x loop form; packed float16
    pairs (WORDS 2). half_only: the default plan and the packed float16 pairs without the pipelined loop, 2 to 8 warps
    (no batch-1 shape chose word reads or the pipeline since run9)."""
    base = (*default, 4, 0, 0)
    if half_only:
        found = {base}
        for block_n, block_kb, warps in itertools.product((32, 64, 128, 256), (32, 64), (2, 4, 8)):
            if block_kb <= k_bytes and block_n * block_kb // (32 * warps) >= 8:  # at least 8 bytes per thread
                split = 1
                while -(-rows // block_n) * split < 2 * 132 and split * 2 <= k_bytes // block_kb:
                    split *= 2
                found.add((default[0], block_n, block_kb, split, warps, 0, 2))
        return sorted(found)
    found = {base, (default[0], 8, min(512, k_bytes), 1, 4, 0, 0)}
    for block_n, block_kb, loop in itertools.product((4, 8, 16), (128, 256, 512), (0, 3)):
        if block_kb <= k_bytes and 1024 <= block_n * block_kb <= 8192:
            split = 1  # split-K until the programs fill the multiprocessors twice (as `plan` does)
            while -(-rows // block_n) * split < 2 * 132 and split * 2 <= k_bytes // block_kb:
                split *= 2
            found.add((default[0], block_n, block_kb, split, 4, loop, 1))
    for block_n, block_kb, loop, warps in itertools.product((64, 128, 256), (32, 64), (0, 3), (4, 8)):  # packed float16 pairs
        if block_kb <= k_bytes and block_n * block_kb // (32 * warps) >= 16:  # at least 16 bytes per thread
            split = 1
            while -(-rows // block_n) * split < 2 * 132 and split * 2 <= k_bytes // block_kb:
                split *= 2
            found.add((default[0], block_n, block_kb, split, warps, loop, 2))
    return sorted(found)


def timed(x, weights, out, expected, config):
    try:
        nvfp4_gemv.launch_w4a16_gemv(x, *weights[0], out, config=config)
        error = float((out.double() - expected.double()).norm() / expected.double().norm())
        seconds = time_config(x, weights, out, config) * 1e-6 if error < 1e-2 else float("nan")
    except Exception as failure:  # noqa: BLE001 - a configuration that does not compile is recorded
        print(f"{config}: {type(failure).__name__}: {str(failure)[:100]}")
        return float("nan"), float("nan")
    return error, seconds


def gemm_seconds(x, weights, out) -> float:
    from reference_engine.kernels.nvfp4_gemm import w4a16_gemm

    def step():
        for index in range(CALLS):
            packed, scale, scale_2 = weights[index % len(weights)]
            w4a16_gemm(x, packed, scale, scale_2, out)

    return graph_seconds(step) / CALLS


def main(path: str, tokens_measured: tuple[int, ...] = TOKENS, half_only: bool = False) -> None:
    from reference_engine.kernels.nvfp4_gemm import w4a16_gemm

    torch.manual_seed(0)
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    records = []
    for name, (rows, cols) in SHAPES.items():
        if half_only and name == "lm head (nvfp4)":  # the engine's default LM head is bfloat16
            continue
        weight = torch.randn(rows, cols, device="cuda") * cols**-0.5
        packed, scale, scale_2 = quantize_nvfp4(weight)
        del weight
        nbytes = packed.numel() + scale.numel() + 4
        weights = [(packed, scale, scale_2)] + [(packed.clone(), scale.clone(), scale_2) for _ in range(copies_for(nbytes) - 1)]
        for tokens in tokens_measured if name != "lm head (nvfp4)" else (1,):
            x = torch.randn(tokens, cols, device="cuda").bfloat16()
            expected = torch.empty(tokens, rows, device="cuda", dtype=torch.bfloat16)
            torch_linear(x, packed, scale, scale_2, out=expected)
            moved = nbytes + x.numel() * 2 + tokens * rows * 2
            default = nvfp4_gemv.plan(tokens, rows, cols // 2, sm)
            configs = candidates(default, rows, cols // 2, half_only) if tokens == 1 else [(*default, 4, 0, 0), (*default, 4, 0, 1)]
            for config in configs:
                out = torch.full_like(expected, float("nan"))
                error, seconds = timed(x, weights, out, expected, config)
                records.append({"shape": name, "N": rows, "K": cols, "tokens": tokens, "kernel": "gemv", "config": config, "default": config == (*default, 4, 0, 0),
                                "k_bytes": cols // 2, "us": seconds * 1e6, "bytes": moved, "fraction_of_copy": moved / seconds / COPY_BANDWIDTH, "rel_error": error})  # fmt: skip
            if tokens > 1:  # the tensor-core GEMM at the same batch
                out = torch.full_like(expected, float("nan"))
                w4a16_gemm(x, packed, scale, scale_2, out)
                error = float((out.double() - expected.double()).norm() / expected.double().norm())
                seconds = gemm_seconds(x, weights, out) if error < 1e-2 else float("nan")
                records.append({"shape": name, "N": rows, "K": cols, "tokens": tokens, "kernel": "gemm", "config": None, "default": False,
                                "k_bytes": cols // 2, "us": seconds * 1e6, "bytes": moved, "fraction_of_copy": moved / seconds / COPY_BANDWIDTH, "rel_error": error})  # fmt: skip
            ok = sorted((r for r in records if r["shape"] == name and r["tokens"] == tokens and r["us"] == r["us"]), key=lambda r: r["us"])
            base = next((r for r in ok if r["default"]), None)
            print(f"{name:20s} M={tokens}: default {base['us'] if base else float('nan'):.1f} us "
                  f"({base['fraction_of_copy'] if base else float('nan'):.2f} of copy); best "
                  + "; ".join(f"{r['kernel']} {r['config']} {r['us']:.1f} us ({r['fraction_of_copy']:.2f})" for r in ok[:3]), flush=True)  # fmt: skip
            with open(path, "w") as handle:
                json.dump(records, handle, indent=1)
        del weights
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] not in ("--batch-one", "--batch-one-half")):
        print(__doc__)
        raise SystemExit(2)
    main(sys.argv[1], (1,) if len(sys.argv) == 3 else TOKENS, half_only=sys.argv[-1] == "--batch-one-half")
