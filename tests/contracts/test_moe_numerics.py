"""MoE ops beyond the contract cases: the whole block against transformers, permute/unpermute composition."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from reference_engine.ops import moe

hf = pytest.importorskip("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")


def test_moe_block_matches_transformers():
    torch.manual_seed(0)
    config = hf.Qwen3_5MoeTextConfig(
        hidden_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=8, num_experts_per_tok=3
    )
    block = hf.Qwen3_5MoeSparseMoeBlock(config).float()
    for parameter in block.parameters():
        torch.nn.init.normal_(parameter, std=0.3)
    x = torch.randn(7, 32)
    with torch.no_grad():
        expected = block(x[None])[0]
        logits = x @ block.gate.weight.T
    weights, ids = torch.empty(7, 3), torch.empty(7, 3, dtype=torch.int32)
    moe.router_topk(logits, weights, ids, top_k=3)
    routed, shared = torch.full((7, 32), float("nan")), torch.full((7, 32), float("nan"))
    moe.routed_experts(x, weights, ids, block.experts.gate_up_proj.data, block.experts.down_proj.data, routed)
    expert = block.shared_expert
    moe.shared_expert(x, expert.gate_proj.weight.data, expert.up_proj.weight.data, expert.down_proj.weight.data, block.shared_expert_gate.weight.data, shared)
    torch.testing.assert_close(routed + shared, expected, rtol=1e-5, atol=1e-5)


def test_permute_experts_unpermute_equals_routed_experts():
    generator = torch.Generator().manual_seed(1)
    tokens, hidden, inter, experts, top_k = 11, 16, 8, 5, 3
    x = torch.randn(tokens, hidden, generator=generator)
    ids = torch.rand(tokens, experts, generator=generator).argsort(1)[:, :top_k].to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=generator), 1)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=generator) * 0.3
    down = torch.randn(experts, hidden, inter, generator=generator) * 0.3
    permuted = torch.empty(tokens * top_k, hidden)
    offsets, rows = torch.empty(experts + 1, dtype=torch.int32), torch.empty(tokens * top_k, dtype=torch.int32)
    moe.token_permute(x, ids, permuted, offsets, rows, num_experts=experts)
    expert_out = torch.empty_like(permuted)
    for expert in range(experts):  # a grouped GEMM over contiguous row ranges
        start, end = int(offsets[expert]), int(offsets[expert + 1])
        gate, up = (permuted[start:end] @ gate_up[expert].T).chunk(2, dim=-1)
        expert_out[start:end] = (F.silu(gate) * up) @ down[expert].T
    combined, direct = torch.empty(tokens, hidden), torch.empty(tokens, hidden)
    moe.token_unpermute(expert_out, rows, weights, combined)
    moe.routed_experts(x, weights, ids, gate_up, down, direct)
    torch.testing.assert_close(combined, direct, rtol=1e-5, atol=1e-5)
