"""Time the fused MoE decode block (router GEMV, router top-k + shared slot, gate/up, down) at the real shape.

    PYTHONPATH=. python3 benchmarks/kernels/time_moe_decode.py results.json [--blocks-only] [--small-batches]

E=256 experts, H=2048, I=512, top-8 plus the shared expert, NVFP4 weights. Four copies of a layer's
experts (about 1.6 GB, far over the 60 MB L2) alternate inside a CUDA graph of 8 calls, so each call
streams its weights from HBM as in a real step. For each tile / loop setting of
`reference_engine.kernels.moe_decode` and batch 1, 8, 32: output checked against the torch op, then
microseconds per call (graph time / calls) and the bytes of the experts it touched over that time. Then (not
with --blocks-only) the routed experts alone, per-pair decode kernels against the grouped tensor-core kernels.
`--small-batches` (implies --blocks-only): batches 2, 4, 8 and 12 (the per-pair kernels' range below `moe_grouped_half`'s
16 tokens, which run the larger-batch setting of run9) over `SMALL_SETTINGS`: that setting, the committed batch-one
setting with its E4M3 decode (WORDS 3), and tiles between them. No speed is asserted.
"""

# ruff: noqa: B023 - `step` is captured and replayed within the loop iteration that made it
from __future__ import annotations

import json
import math
import sys

import torch

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import moe_decode
from reference_engine.kernels.tuning import apply_for_cuda
from reference_engine.ops import static_moe
from reference_engine.quant.nvfp4 import quantize_nvfp4

E, H, I, TOP_K, COPIES, CALLS = 256, 2048, 512, 8, 4, 8
SETTINGS = [  # (LOOP, GATE_UP_BLOCK_N, GATE_UP_BLOCK_K, DOWN_BLOCK_H, DOWN_BLOCK_I, WORDS, DOWN_SPLIT)
    # the committed batch-one setting (run9) and variations: down slots split over programs, pipeline depth, K step, rows
    (3, 8, 256, 8, 256, 2, 1), (3, 8, 256, 8, 256, 2, 2), (3, 8, 256, 8, 256, 2, 3), (2, 8, 256, 8, 256, 2, 1),
    (4, 8, 128, 8, 256, 2, 1), (3, 16, 256, 8, 256, 2, 1), (3, 8, 512, 8, 256, 2, 1), (1, 8, 256, 8, 256, 2, 1),
    (3, 8, 256, 16, 128, 2, 3), (3, 4, 512, 8, 256, 2, 3),
    # the committed larger-batch setting (run9) and its down split
    (0, 32, 64, 32, 64, 2, 1), (0, 32, 64, 32, 64, 2, 3),
]
TOKENS = (1, 8, 32)  # from 64 tokens the block runs grouped by expert (`moe_grouped_decode.MIN_TOKENS`)
SMALL_TOKENS = (2, 4, 8, 12)
SMALL_SETTINGS = [
    (0, 32, 64, 32, 64, 2, 1), (0, 32, 64, 32, 64, 3, 1),  # the committed larger-batch setting, and with the E4M3 decode
    (3, 8, 256, 8, 256, 3, 1), (3, 16, 256, 16, 256, 3, 1), (3, 32, 256, 32, 256, 3, 1),  # batch one's, rows doubled
    (3, 16, 128, 16, 128, 3, 1), (0, 16, 128, 16, 128, 3, 1), (3, 8, 256, 16, 128, 3, 1), (3, 16, 256, 8, 256, 3, 1),
]


def quantized(rows: int, cols: int, groups: int):
    packed, scale, scale_2 = quantize_nvfp4(torch.randn(rows, cols, device="cuda") * cols**-0.5)
    return packed.view(groups, rows // groups, cols // 2), scale.view(groups, rows // groups, cols // 16), scale_2


def layer():
    gate_up, gu_scale, gu_s2 = quantized(E * 2 * I, H, E)
    down, d_scale, d_s2 = quantized(E * H, I, E)
    experts = static_moe.StackedNvfp4Experts(gate_up, gu_scale, gu_s2.reshape(1, 1).expand(E, 2).contiguous(), down, d_scale,
                                            d_s2.reshape(1).expand(E).contiguous())  # fmt: skip
    s_gate_up, s_gu_scale, s_gu_s2 = quantized(2 * I, H, 1)
    s_down, s_d_scale, s_d_s2 = quantized(H, I, 1)
    shared = static_moe.SharedNvfp4Expert(s_gate_up[0], s_gu_scale[0], s_gu_s2.reshape(1).expand(2).contiguous(), s_down[0], s_d_scale[0], s_d_s2.reshape(()))
    router = (torch.randn(E + 1, H, device="cuda") * H**-0.5).bfloat16()
    return experts, shared, router


def main(path: str, routed: bool = True, tokens_list: tuple[int, ...] = TOKENS, settings: list = SETTINGS) -> None:
    torch.manual_seed(0)
    apply_for_cuda()  # this card's tuning (router, grouped ranges); the settings below then override moe_decode's
    moe_decode.BATCH_ONE = None  # every setting at every batch, one token included
    moe_decode.moe_grouped_decode.MIN_TOKENS = None
    layers = [layer() for _ in range(COPIES)]
    records = []
    for tokens in tokens_list:
        xs = [torch.randn(tokens, H, device="cuda").bfloat16() for _ in range(COPIES)]
        outs = [torch.empty(tokens, H, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
        expected = torch.empty_like(outs[0])
        static_moe.moe_block_decode(xs[0], layers[0][2], layers[0][0], layers[0][1], TOP_K, out=expected)
        for setting in settings:
            moe_decode.LOOP, moe_decode.GATE_UP_BLOCK_N, moe_decode.GATE_UP_BLOCK_K, moe_decode.DOWN_BLOCK_H, moe_decode.DOWN_BLOCK_I, moe_decode.WORDS, moe_decode.DOWN_SPLIT = setting
            try:
                check = torch.full_like(expected, float("nan"))
                moe_decode.moe_block_decode(xs[0], layers[0][2], layers[0][0], layers[0][1], TOP_K, out=check)
                error = float((check.double() - expected.double()).norm() / expected.double().norm())

                def step():
                    for index in range(CALLS):
                        experts, shared, router = layers[index % COPIES]
                        moe_decode.moe_block_decode(xs[index % COPIES], router, experts, shared, TOP_K, out=outs[index % COPIES])

                us = graph_seconds(step) * 1e6 / CALLS
            except Exception as failure:  # noqa: BLE001 - a setting that fails is recorded
                error, us = float("nan"), float("nan")
                print(f"T={tokens} {setting}: {type(failure).__name__}: {str(failure)[:120]}")
            distinct = E * (1 - (1 - TOP_K / E) ** tokens) + 1  # expected experts touched, plus the shared one
            moved = distinct * (3 * I * H // 2 + 3 * I * H // 16) + (E + 1) * H * 2
            records.append({"tokens": tokens, "setting": setting, "us": us, "rel_error": error, "bytes": moved,
                            "fraction_of_copy": None if math.isnan(us) else moved / (us * 1e-6) / 4.27e12})  # fmt: skip
            print(f"T={tokens:2d} loop/tiles {setting}: {us:7.1f} us, error {error:.1e}, {0 if math.isnan(us) else moved / (us * 1e-6) / 1e12:.2f} TB/s")
        with open(path, "w") as handle:
            json.dump(records, handle, indent=1)
    if routed:
        routed_only(layers, records, path)


def routed_only(layers, records: list, path: str) -> None:
    """Routed experts alone at batch 8, 32, 64: the decode kernels (word reads) vs the grouped tensor-core prefill kernels."""
    from reference_engine.kernels.nvfp4_gemm import nvfp4_moe_prefill

    moe_decode.LOOP, moe_decode.GATE_UP_BLOCK_N, moe_decode.GATE_UP_BLOCK_K, moe_decode.DOWN_BLOCK_H, moe_decode.DOWN_BLOCK_I, moe_decode.WORDS, moe_decode.DOWN_SPLIT = (
        3, 8, 256, 8, 256, 1, 1)  # int32 word reads
    kernels = (("decode", moe_decode.nvfp4_routed_experts), ("grouped", nvfp4_moe_prefill))
    for tokens in TOKENS[1:]:
        xs = [torch.randn(tokens, H, device="cuda").bfloat16() for _ in range(COPIES)]
        outs = [torch.empty(tokens, H, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
        ids = torch.stack([torch.randperm(E, device="cuda")[:TOP_K] for _ in range(tokens)]).int()
        weights = torch.softmax(torch.randn(tokens, TOP_K, device="cuda"), -1)
        check = {}
        for kernel, op in kernels:
            check[kernel] = torch.full_like(outs[0], float("nan"))
            op(xs[0], weights, ids, layers[0][0], check[kernel])
        agree = float((check["decode"].double() - check["grouped"].double()).norm() / check["grouped"].double().norm())
        for kernel, op in kernels:

            def step():
                for index in range(CALLS):
                    op(xs[index % COPIES], weights, ids, layers[index % COPIES][0], outs[index % COPIES])

            try:
                us = graph_seconds(step) * 1e6 / CALLS
            except Exception as failure:  # noqa: BLE001 - recorded, not raised
                us = float("nan")
                print(f"routed T={tokens} {kernel}: {type(failure).__name__}: {str(failure)[:120]}")
            records.append({"tokens": tokens, "setting": None, "routed_only": kernel, "us": us, "decode_vs_grouped_rel": agree})
            print(f"T={tokens:2d} routed experts only, {kernel:8s}: {us:7.1f} us (decode vs grouped outputs: rel {agree:.1e})", flush=True)
        with open(path, "w") as handle:
            json.dump(records, handle, indent=1)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] not in ("--blocks-only", "--small-batches")):
        print(__doc__)
        raise SystemExit(2)
    if sys.argv[2:] == ["--small-batches"]:
        main(sys.argv[1], routed=False, tokens_list=SMALL_TOKENS, settings=SMALL_SETTINGS)
    else:
        main(sys.argv[1], routed=len(sys.argv) == 2)
