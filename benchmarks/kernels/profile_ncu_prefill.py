"""The prefill kernels that dominate a 1024-token prompt, launched once each inside a profiler range for Nsight
Compute: the routed experts' two grouped GEMMs (`nvfp4_moe_prefill`, committed tiles) and the chunked GDN prefill's
two launches, at the real shapes.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SchedulerStats \
        python3 benchmarks/kernels/profile_ncu_prefill.py

Every call runs once before the range (compile) and once inside it. Nothing is timed or asserted here.
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, "benchmarks/kernels")

from time_gdn_prefill import inputs
from time_moe_prefill import EXPERTS, HIDDEN, TOP_K, stacked_experts

from reference_engine.kernels import gdn_chunked_prefill, nvfp4_gemm
from reference_engine.kernels.tuning import apply_for_cuda


def main() -> None:
    apply_for_cuda()
    tokens = 1024
    experts = stacked_experts()
    x = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
    top = torch.softmax(torch.randn(tokens, EXPERTS, device="cuda") * 2.0, -1).topk(TOP_K, dim=-1)
    routing, ids = (top.values / top.values.sum(-1, keepdim=True)).contiguous(), top.indices.int().contiguous()
    out = torch.empty(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
    q, k, v, gate, beta, cu, state = inputs([tokens])
    gdn_out, final = torch.empty_like(v), torch.empty_like(state)
    calls = [
        lambda: nvfp4_gemm.nvfp4_moe_prefill(x, routing, ids, experts, out, check_ids=False),
        lambda: gdn_chunked_prefill.gdn_chunked_prefill(q, k, v, gate, beta, cu, state, gdn_out, final),
    ]
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
