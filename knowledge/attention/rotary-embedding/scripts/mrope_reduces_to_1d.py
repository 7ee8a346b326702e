"""Show that Qwen3.5/3.6 interleaved mRoPE equals plain 1-D partial RoPE for text tokens.

Builds transformers' Qwen3_5MoeTextRotaryEmbedding from a small config (theta 1e7, head_dim 256,
partial_rotary_factor 0.25, mrope_section [11, 11, 10]) and compares its cos/sin tables, and the
rotated query, with the formulas of ../SKILL.md. Needs transformers >= 5.2. CPU, float32.
Run: python mrope_reduces_to_1d.py
"""

from __future__ import annotations

import torch
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
    Qwen3_5MoeTextRotaryEmbedding,
    apply_rotary_pos_emb,
)

THETA, HEAD_DIM, ROTARY_DIM = 1e7, 256, 64


def interleaved_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The WRONG convention for this model: pairs (2i, 2i + 1) of the first 64 dims."""
    inv_freq = 1.0 / THETA ** (torch.arange(0, ROTARY_DIM, 2, dtype=torch.float64) / ROTARY_DIM)
    angle = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    x64 = x.to(torch.float64)
    even, odd = x64[..., 0:ROTARY_DIM:2], x64[..., 1:ROTARY_DIM:2]
    out = x64.clone()
    out[..., 0:ROTARY_DIM:2] = even * cos - odd * sin
    out[..., 1:ROTARY_DIM:2] = odd * cos + even * sin
    return out.to(x.dtype)


def partial_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x [T, H, 256] -> rotated copy; first 64 dims, half-split pairs (i, i + 32)."""
    half = ROTARY_DIM // 2
    inv_freq = 1.0 / THETA ** (torch.arange(0, ROTARY_DIM, 2, dtype=torch.float64) / ROTARY_DIM)  # [32]
    angle = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [T, 32]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]  # [T, 1, 32]
    x64 = x.to(torch.float64)
    first, second = x64[..., :half], x64[..., half:ROTARY_DIM]
    out = x64.clone()
    out[..., :half] = first * cos - second * sin
    out[..., half:ROTARY_DIM] = second * cos + first * sin
    return out.to(x.dtype)


def main() -> None:
    config = Qwen3_5MoeTextConfig(
        hidden_size=512, num_attention_heads=2, num_key_value_heads=1, head_dim=HEAD_DIM,
        rope_parameters={"rope_type": "default", "rope_theta": THETA, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    )
    rotary = Qwen3_5MoeTextRotaryEmbedding(config)
    generator = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 4096, (1, 9), generator=generator)  # one text sequence
    query = torch.randn(1, 2, 9, HEAD_DIM, generator=generator)  # [batch, heads, T, D]
    cos, sin = rotary(query, positions)  # text: the 3 streams are the same positions
    rotated, _ = apply_rotary_pos_emb(query, query, cos, sin)
    mine = partial_rope(query[0].transpose(0, 1), positions[0]).transpose(0, 1)[None]
    error = (rotated - mine).abs().max().item()
    print("max |transformers - 1-D partial RoPE| =", error)
    # transformers forms position * inv_freq in float32: about position * 6e-8 rad of angle error
    assert error < 4096 * 6e-8 * query.abs().max().item() * 2, error
    assert torch.equal(rotated[..., ROTARY_DIM:], query[..., ROTARY_DIM:]), "dims 64.. must pass through"
    wrong = interleaved_rope(query[0].transpose(0, 1), positions[0]).transpose(0, 1)[None]
    wrong_error = (wrong - rotated).abs().max().item()
    print("max |transformers - interleaved-pair RoPE| =", wrong_error, "(the check catches it)")
    assert wrong_error > 1e-1
    print("ok")


if __name__ == "__main__":
    main()
