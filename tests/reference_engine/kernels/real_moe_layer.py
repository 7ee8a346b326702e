"""Random NVFP4 experts on CUDA at the real shapes, for the CUDA kernel tests (imported inside the tests, after the
CUDA marker has been checked)."""

from __future__ import annotations

import torch

EXPERTS, HIDDEN, INTER, TOP_K = 256, 2048, 512, 8  # Qwen3.6-35B-A3B's MoE layer


def cuda_quantized(rows: int, cols: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 (codes, block scales, tensor scale) on CUDA of a [rows, cols] normal matrix scaled by cols^-1/2."""
    from reference_engine.quant.nvfp4 import quantize_nvfp4

    return tuple(t.cuda() for t in quantize_nvfp4(torch.randn(rows, cols, generator=generator) * cols**-0.5))


def cuda_experts(count: int, hidden: int, inter: int, generator: torch.Generator):
    """`count` stacked NVFP4 experts (gate, up [inter, hidden], down [hidden, inter]) on CUDA."""
    from reference_engine.kernels.moe_decode import stack_nvfp4_experts

    return stack_nvfp4_experts([cuda_quantized(inter, hidden, generator) for _ in range(count)], [cuda_quantized(inter, hidden, generator) for _ in range(count)],
                               [cuda_quantized(hidden, inter, generator) for _ in range(count)])  # fmt: skip


def real_decode_inputs(tokens: int):
    """The real layer at a decode batch, seeded by `tokens`: (experts, shared expert, x [T, H] bf16, ids [T, top_k + 1]
    int32 with the shared slot last, routing weights [T, top_k + 1] float32), ids distinct per row."""
    from reference_engine.ops.static_moe import SharedNvfp4Expert

    generator = torch.Generator().manual_seed(tokens)
    experts = cuda_experts(EXPERTS, HIDDEN, INTER, generator)
    shared = SharedNvfp4Expert.concatenate(cuda_quantized(INTER, HIDDEN, generator), cuda_quantized(INTER, HIDDEN, generator),
                                           cuda_quantized(HIDDEN, INTER, generator))  # fmt: skip
    x = torch.randn(tokens, HIDDEN, generator=generator).bfloat16().cuda()
    ids = torch.stack([torch.randperm(EXPERTS, generator=generator)[:TOP_K] for _ in range(tokens)])
    ids = torch.cat([ids, torch.full((tokens, 1), EXPERTS)], 1).int().cuda()
    weights = (torch.rand(tokens, TOP_K + 1, generator=generator) + 0.1).cuda()
    return experts, shared, x, ids, weights
