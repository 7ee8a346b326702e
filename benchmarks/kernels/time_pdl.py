"""Programmatic dependent launch on the GPU: a decode-like chain of kernels in one CUDA graph, PDL off and on.

    PYTHONPATH=. python3 benchmarks/kernels/time_pdl.py OUT.json

Per "layer" of the chain: fused add + RMSNorm, the batch-1 GEMV of the GDN in_proj (qkv+z, packed
float16 pairs), RMSNorm, the GDN out_proj GEMV, fused add + RMSNorm, the MoE block (router GEMV in
cuBLAS, top-k, gate/up, down). LAYERS layers, each with its own weights (more than the L2 holds), are
captured in one graph; the figure is graph time per layer, PDL off and on (`kernels/pdl.py`), with the
outputs of both compared bit for bit. No speed is asserted.
"""

from __future__ import annotations

import json
import sys

import torch

from reference_engine.bench.timing import graph_seconds
from reference_engine.kernels import moe_decode, norms, nvfp4_gemv, pdl
from reference_engine.kernels.tuning import apply_for_device
from reference_engine.ops import static_moe
from reference_engine.quant.nvfp4 import quantize_nvfp4

H, QKVZ, VALUE, E, I, TOP_K, LAYERS = 2048, 12288, 4096, 256, 512, 8, 6


def quantized(rows: int, cols: int):
    return quantize_nvfp4(torch.randn(rows, cols, device="cuda") * cols**-0.5)


def moe_layer():
    gate_up, gu_scale, gu_s2 = quantize_nvfp4(torch.randn(E * 2 * I, H, device="cuda") * H**-0.5)
    down, d_scale, d_s2 = quantize_nvfp4(torch.randn(E * H, I, device="cuda") * I**-0.5)
    experts = static_moe.StackedNvfp4Experts(gate_up.view(E, 2 * I, H // 2), gu_scale.view(E, 2 * I, H // 16), gu_s2.reshape(1, 1).expand(E, 2).contiguous(),
                                            down.view(E, H, I // 2), d_scale.view(E, H, I // 16), d_s2.reshape(1).expand(E).contiguous())  # fmt: skip
    s_gu = quantized(2 * I, H)
    s_d = quantized(H, I)
    shared = static_moe.SharedNvfp4Expert(s_gu[0], s_gu[1], s_gu[2].reshape(1).expand(2).contiguous(), s_d[0], s_d[1], s_d[2].reshape(()))
    router = (torch.randn(E + 1, H, device="cuda") * H**-0.5).bfloat16()
    return experts, shared, router


def main(path: str) -> None:
    torch.manual_seed(0)
    apply_for_device(torch.cuda.get_device_name(0))  # the committed tiles (the PDL switch is set below)
    layers = [(quantized(QKVZ, H), quantized(H, VALUE), moe_layer(), torch.rand(H, device="cuda").bfloat16() + 0.5) for _ in range(LAYERS)]
    hidden = torch.randn(1, H, device="cuda").bfloat16()
    residual = torch.randn(1, H, device="cuda").bfloat16()
    residual_b = torch.empty_like(residual)
    ones = torch.ones(VALUE, device="cuda", dtype=torch.bfloat16)
    normed, qkvz, core, out, moe_out = (torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for n in (H, QKVZ, VALUE, H, H))

    def step():
        x = hidden
        for (w_in, w_out, (experts, shared, router), norm_w) in layers:
            norms.fused_add_rms_norm(x, residual, norm_w, normed, residual_b, 1e-6)
            nvfp4_gemv.w4a16_linear(normed, *w_in, qkvz)
            norms.rms_norm(qkvz[:, :VALUE], ones, core, 1e-6)
            nvfp4_gemv.w4a16_linear(core, *w_out, out)
            norms.fused_add_rms_norm(out, residual_b, norm_w, normed, residual, 1e-6)
            moe_decode.moe_block_decode(normed, router, experts, shared, TOP_K, moe_out)
            x = moe_out

    records = {}
    snapshot = residual.clone()
    for on in (False, True):
        pdl.PDL = on
        residual.copy_(snapshot)
        step()
        result = moe_out.clone()
        seconds = graph_seconds(step) / LAYERS
        records["on" if on else "off"] = {"us_per_layer": seconds * 1e6}
        records[f"out_{on}"] = result
    pdl.PDL = False
    identical = torch.equal(records.pop("out_False"), records.pop("out_True"))
    records["identical_outputs"] = identical
    print(f"decode-like layer chain, per layer: PDL off {records['off']['us_per_layer']:.1f} us, on {records['on']['us_per_layer']:.1f} us; outputs identical: {identical}")
    with open(path, "w") as handle:
        json.dump(records, handle, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        raise SystemExit(2)
    main(sys.argv[1])
