"""The capturable static ops compute the same function as the plain ops (CPU, float32), on both MoE paths."""

from __future__ import annotations

import pytest
import torch

from reference_engine.model.experts import RoutedExperts
from reference_engine.ops import (
    moe,
    static_attention,
    static_moe,
)
from reference_engine.ops.backend import torch_ops
from reference_engine.presets import quantized_linear


def _nvfp4_experts(num_experts: int, hidden: int, intermediate: int, generator: torch.Generator) -> RoutedExperts:
    def linear(rows: int, cols: int):
        return quantized_linear(torch.randn(rows, cols, generator=generator) * cols**-0.5 * (1 + torch.rand(1, generator=generator)))

    gate = tuple(linear(intermediate, hidden) for _ in range(num_experts))
    up = tuple(linear(intermediate, hidden) for _ in range(num_experts))
    down = tuple(linear(hidden, intermediate) for _ in range(num_experts))
    return RoutedExperts(num_experts, hidden, intermediate, gate=gate, up=up, down=down)


def _routing(num_tokens: int, num_experts: int, top_k: int, generator: torch.Generator):
    logits = torch.randn(num_tokens, num_experts, generator=generator)
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32)
    moe.router_topk(logits, topk_weights=weights, topk_ids=ids, top_k=top_k)
    return weights, ids


@pytest.mark.parametrize("num_tokens", [1, 3, 16])  # 3 x 4 < 16 experts: gather path; 16 x 4 >= 16: all-experts path
def test_nvfp4_static_experts_match_the_plain_op(num_tokens: int) -> None:
    generator = torch.Generator().manual_seed(num_tokens)
    experts = _nvfp4_experts(16, 64, 32, generator)
    assert experts.stacked is not None
    x = torch.randn(num_tokens, 64, generator=generator)
    weights, ids = _routing(num_tokens, 16, 4, generator)
    gate_up = torch.stack([torch.cat([g.dense_weight(torch.float32), u.dense_weight(torch.float32)]) for g, u in zip(experts.gate, experts.up)])
    down = torch.stack([d.dense_weight(torch.float32) for d in experts.down])
    expected = torch.full((num_tokens, 64), float("nan"))
    moe.routed_experts(x, weights, ids, gate_up, down, out=expected)
    actual = torch.full((num_tokens, 64), float("nan"))  # poisoned
    experts(x, weights, ids, out=actual, ops=torch_ops())
    assert torch.isfinite(actual).all()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    plain = torch.full((num_tokens, 64), float("nan"))
    experts(x, weights, ids, out=plain)  # the per-expert Linears are views of the stack: same weights
    torch.testing.assert_close(plain, expected, rtol=1e-5, atol=1e-5)


def test_a_wrong_tensor_scale_order_is_caught() -> None:
    """Known-wrong: up's tensor scale applied to gate rows (swapped halves) must change the result."""
    generator = torch.Generator().manual_seed(7)
    experts = _nvfp4_experts(16, 64, 32, generator)
    x = torch.randn(2, 64, generator=generator)
    weights, ids = _routing(2, 16, 4, generator)
    right = torch.empty(2, 64)
    static_moe.nvfp4_routed_experts(x, weights, ids, experts.stacked, out=right)
    stacked = experts.stacked
    swapped = static_moe.StackedNvfp4Experts(stacked.gate_up_packed, stacked.gate_up_scale, stacked.gate_up_scale_2.flip(1),
                                             stacked.down_packed, stacked.down_scale, stacked.down_scale_2)  # fmt: skip
    wrong = torch.empty(2, 64)
    static_moe.nvfp4_routed_experts(x, weights, ids, swapped, out=wrong)
    assert (wrong - right).abs().max() > 1e-3


def test_static_paged_decode_matches() -> None:
    generator = torch.Generator().manual_seed(3)
    # paged decode over a table wider than needed, unused entries pointing anywhere
    k_cache, v_cache = torch.randn(10, 4, 2, 8, generator=generator), torch.randn(10, 4, 2, 8, generator=generator)
    tables = torch.tensor([[3, 1, 9, 9], [0, 9, 9, 9], [5, 6, 7, 2]], dtype=torch.int32)
    seq_lens = torch.tensor([6, 2, 15], dtype=torch.int32)
    q = torch.randn(3, 4, 8, generator=generator)
    from reference_engine.ops.attention import paged_decode

    expected, actual = torch.empty(3, 4, 8), torch.full((3, 4, 8), float("nan"))
    paged_decode(q, k_cache, v_cache, tables, seq_lens, out=expected, scale=8**-0.5)
    static_attention.paged_decode(q, k_cache, v_cache, tables, seq_lens, out=actual, scale=8**-0.5)
    torch.testing.assert_close(actual, expected)


def test_gdn_head_expansion_is_grouped_not_tiled() -> None:
    """The capturable expand + reshape equals repeat_interleave: key head i serves value heads i*G .. i*G + G - 1."""
    from reference_engine.ops.linear_attention import _expand_heads

    x = torch.randn(5, 3, 7, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(_expand_heads(x, 4), x.repeat_interleave(4, dim=1), rtol=0, atol=0)
    assert not torch.equal(_expand_heads(x, 4), x.repeat(1, 4, 1))  # the tiled order is a different function
