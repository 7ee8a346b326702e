"""The decode kernels that dominate a batch-1 and a batch-32 step, launched once each inside a profiler range for
Nsight Compute: where a short memory-bound kernel loses its time (occupancy, stall reasons, achieved bandwidth).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SchedulerStats \
        python3 benchmarks/kernels/profile_ncu.py

Every kernel runs once before the range (compile, autotune-free warm-up) and once inside it, on the real shapes
with the committed tuning: the batch-1 GEMV of a GDN layer's in_proj (12288 x 2048) and out_proj (2048 x 4096),
the MoE block (router, gate/up, down with the shared expert) at 1 and 32 tokens, the GDN decode step at 1 token.
Nothing is timed or asserted here; ncu's own cache control flushes the L2 between passes.
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, "benchmarks/kernels")

from time_moe_decode import TOP_K, H, layer, quantized

from reference_engine.kernels import gdn_decode_step, moe_decode
from reference_engine.kernels.nvfp4_gemv import launch_w4a16_gemv
from reference_engine.kernels.tuning import apply_for_cuda


def gemv_calls() -> list:
    calls = []
    for rows, cols in ((12288, 2048), (2048, 4096)):
        packed, scale, scale_2 = quantized(rows, cols, 1)
        x = torch.randn(1, cols, device="cuda").bfloat16()
        out = torch.empty(1, rows, device="cuda", dtype=torch.bfloat16)
        calls.append(lambda x=x, p=packed[0], s=scale[0], s2=scale_2, out=out: launch_w4a16_gemv(x, p, s, s2, out))
    return calls


def moe_calls() -> list:
    experts, shared, router = layer()
    calls = []
    for tokens in (1, 32):
        x = torch.randn(tokens, H, device="cuda").bfloat16()
        out = torch.empty(tokens, H, device="cuda", dtype=torch.bfloat16)
        calls.append(lambda x=x, out=out: moe_decode.moe_block_decode(x, router, experts, shared, TOP_K, out))
    return calls


def gdn_call():
    hk, hv, d, kernel = 16, 32, 128, 4
    channels = 2 * hk * d + hv * d
    mixed = torch.randn(1, channels, device="cuda").bfloat16()
    z = torch.randn(1, hv * d, device="cuda").bfloat16()
    b, a = torch.randn(1, hv, device="cuda").bfloat16(), torch.randn(1, hv, device="cuda").bfloat16()
    conv_weight = (torch.randn(channels, kernel, device="cuda") * 0.5).bfloat16()
    a_log, dt_bias = torch.rand(hv, device="cuda"), torch.rand(hv, device="cuda")
    norm_weight = torch.rand(d, device="cuda").bfloat16() + 0.5
    conv, rec = torch.randn(2, channels, kernel - 1, device="cuda").bfloat16(), torch.randn(2, hv, d, d, device="cuda") * 0.1
    slots, init = torch.arange(1, 2, device="cuda"), torch.ones(1, dtype=torch.bool, device="cuda")
    out = torch.empty(1, hv * d, device="cuda", dtype=torch.bfloat16)
    return lambda: gdn_decode_step.gdn_decode_step(mixed, z, b, a, conv_weight, a_log, dt_bias, norm_weight, conv, rec, slots, init, out, 1e-6)


def main() -> None:
    torch.manual_seed(0)
    apply_for_cuda()
    calls = gemv_calls() + moe_calls() + [gdn_call()]
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled {len(calls)} calls")


if __name__ == "__main__":
    main()
