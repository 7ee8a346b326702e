"""Time the eager (prefill) forms with fewer, larger GEMMs against the composed forms they replace, at real widths.

    PYTHONPATH=. python3 benchmarks/kernels/time_prefill_forms.py OUT.json [--tokens 1024]

A 4-layer model of the full architecture's widths (seeded random weights, NVFP4 linears, bf16; layers 0-2 Gated
DeltaNet, layer 3 attention), the committed tuning file applied. In one process, each in a CUDA graph of CALLS
back-to-back calls on the layers' own weights:
- a MoE block's eager forward (`SparseMoeBlock._fused_eager`: router + shared gate logits in one GEMM, shared gate +
  up in one) against the composed path (five GEMMs) of the same block;
- a Gated DeltaNet layer's four input projections: two stacked GEMMs (`_projections`) against four linears;
- the router logits (257 x 2048): `aligned_linear` (padded output pitch) against F.linear, at 16 to 1024 tokens.
Outputs of both forms are compared first (relative error). No speed is asserted; the engine bench gives TTFT.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

from reference_engine import presets
from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels.tuning import apply_for_cuda
from reference_engine.ops.dense_linear import aligned_linear

CALLS = 8


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _timed(call) -> float:
    def step():
        for index in range(CALLS):
            call(index)

    return graph_seconds(step) * 1e6 / CALLS


def main(path: str, tokens: int) -> None:
    apply_for_cuda()
    presets.PRESETS["four_layers"] = dataclasses.replace(presets.FULL, num_hidden_layers=4, layer_types=())
    model = presets.build_preset("four_layers", device="cuda", dtype=torch.bfloat16, quantize="nvfp4", seed=0)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(tokens, model.config.hidden_size, device="cuda", generator=g) * 0.5).bfloat16()
    records: dict = {"tokens": tokens}
    blocks = [layer.mlp for layer in model.layers]
    composed_blocks = []
    for block in blocks:
        twin = dataclasses.replace(block)  # a second fused block on the same tensors, switched to the composed path
        object.__setattr__(twin, "shared_nvfp4", None)
        composed_blocks.append(twin)
    want, got = composed_blocks[0](x), blocks[0](x)
    records["moe_block_rel_error"] = _rel(got, want)
    records["moe_block_fused_us"] = _timed(lambda i: blocks[i % len(blocks)](x))
    records["moe_block_composed_us"] = _timed(lambda i: composed_blocks[i % len(blocks)](x))
    print(f"MoE block eager, {tokens} tokens: fused {records['moe_block_fused_us']:.1f} us, composed {records['moe_block_composed_us']:.1f} us "
          f"(rel error {records['moe_block_rel_error']:.1e})", flush=True)  # fmt: skip
    mixers = [layer.mixer for layer in model.layers if getattr(layer.mixer, "in_proj_qkvz", None) is not None]

    def separate(mixer):
        return mixer.in_proj_qkv(x), mixer.in_proj_z(x), mixer.in_proj_b(x), mixer.in_proj_a(x)

    errors = [_rel(a, b) for a, b in zip(mixers[0]._projections(x, None), separate(mixers[0]))]
    records["gdn_projections_rel_error"] = max(errors)
    records["gdn_projections_stacked_us"] = _timed(lambda i: mixers[i % len(mixers)]._projections(x, None))
    records["gdn_projections_separate_us"] = _timed(lambda i: separate(mixers[i % len(mixers)]))
    print(f"GDN projections, {tokens} tokens: stacked {records['gdn_projections_stacked_us']:.1f} us, separate {records['gdn_projections_separate_us']:.1f} us "
          f"(rel error {records['gdn_projections_rel_error']:.1e})", flush=True)  # fmt: skip
    weights = [block.router_weight for block in blocks]
    for count in (16, 32, 64, 1024):
        xs = x[:count].contiguous()
        error = _rel(aligned_linear(xs, weights[0]), torch.nn.functional.linear(xs, weights[0]))
        aligned = _timed(lambda i, xs=xs: aligned_linear(xs, weights[i % len(weights)]))
        plain = _timed(lambda i, xs=xs: torch.nn.functional.linear(xs, weights[i % len(weights)]))
        records[f"router_logits_{count}"] = {"aligned_us": aligned, "f_linear_us": plain, "rel_error": error}
        print(f"router logits {count} tokens: aligned pitch {aligned:.2f} us, F.linear {plain:.2f} us (rel error {error:.1e})", flush=True)
    Path(path).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results")
    parser.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()
    sys.exit(main(args.results, args.tokens))
