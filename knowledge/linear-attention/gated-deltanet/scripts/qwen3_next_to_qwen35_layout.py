"""Convert Qwen3-Next fused GDN projections to the Qwen3.5/3.6 separate layout, and check it.

`split_fused(in_proj_qkvz, in_proj_ba, num_key_heads, num_value_heads, key_dim, value_dim)`
returns `(in_proj_qkv, in_proj_z, in_proj_b, in_proj_a)`. Running the file checks the result
against transformers' own `Qwen3NextGatedDeltaNet.fix_query_key_value_ordering` on a small
random layer (needs transformers >= 5). Run: python qwen3_next_to_qwen35_layout.py
"""

from __future__ import annotations

import torch


def split_fused(in_proj_qkvz, in_proj_ba, num_key_heads, num_value_heads, key_dim, value_dim):
    hidden = in_proj_qkvz.shape[1]
    ratio = num_value_heads // num_key_heads  # value heads per key head
    group_rows = 2 * key_dim + 2 * ratio * value_dim  # rows per key-head group
    groups = in_proj_qkvz.view(num_key_heads, group_rows, hidden)  # [Hk, rows, hidden]
    v_start, z_start = 2 * key_dim, 2 * key_dim + ratio * value_dim
    in_proj_qkv = torch.cat(
        [
            groups[:, :key_dim].reshape(num_key_heads * key_dim, hidden),  # all q heads
            groups[:, key_dim:v_start].reshape(num_key_heads * key_dim, hidden),  # all k heads
            groups[:, v_start:z_start].reshape(num_value_heads * value_dim, hidden),  # all v heads
        ]
    )
    in_proj_z = groups[:, z_start:].reshape(num_value_heads * value_dim, hidden)
    ba = in_proj_ba.view(num_key_heads, 2 * ratio, hidden)  # per key head: [b..., a...]
    in_proj_b = ba[:, :ratio].reshape(num_value_heads, hidden)
    in_proj_a = ba[:, ratio:].reshape(num_value_heads, hidden)
    return in_proj_qkv, in_proj_z, in_proj_b, in_proj_a


def main() -> None:
    from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    key_heads, value_heads, dim, hidden = 4, 8, 8, 64
    config = Qwen3NextConfig(
        hidden_size=hidden, linear_num_key_heads=key_heads, linear_num_value_heads=value_heads,
        linear_key_head_dim=dim, linear_value_head_dim=dim, num_hidden_layers=4,
    )
    layer = Qwen3NextGatedDeltaNet(config, 0)
    x = torch.randn(1, 3, hidden, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        q, k, v, z, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(x), layer.in_proj_ba(x))
        qkv_w, z_w, b_w, a_w = split_fused(
            layer.in_proj_qkvz.weight, layer.in_proj_ba.weight, key_heads, value_heads, dim, dim
        )
        expected_qkv = torch.cat([t.reshape(1, 3, -1) for t in (q, k, v)], dim=-1)
        assert torch.allclose(x @ qkv_w.T, expected_qkv)
        assert torch.allclose(x @ z_w.T, z.reshape(1, 3, -1))
        assert torch.allclose(x @ b_w.T, b) and torch.allclose(x @ a_w.T, a)
        naive_q = x @ layer.in_proj_qkvz.weight[: key_heads * dim].T  # the wrong, contiguous split
        assert not torch.allclose(naive_q, q.reshape(1, 3, -1)), "the check must be able to fail"
    print("ok: fused Qwen3-Next projections map onto the Qwen3.5 layout")


if __name__ == "__main__":
    main()
