"""Paged decode with split-K (flash-decoding) and the log-sum-exp merge, checked in float64.

Builds a random paged cache with a scattered block table, runs one decode step per sequence by
splitting each sequence's keys into ranges (some empty), merges the partial results, and compares
with plain attention over the gathered keys. Also shows that merging with the wrong weights is
caught. Plain torch, CPU. Run: python split_k_merge.py
"""

from __future__ import annotations

import math

import torch


def partial_attention(query, keys, values, scale):
    """query [Hq, D], keys/values [n, Hkv, D] -> (o [Hq, D] normalised, lse [Hq]); n may be 0."""
    num_heads, dim = query.shape
    if keys.shape[0] == 0:
        return torch.zeros(num_heads, dim, dtype=query.dtype), torch.full((num_heads,), -math.inf, dtype=query.dtype)
    group = num_heads // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1)  # [n, Hq, D]: query head h reads KV head h // group
    v = values.repeat_interleave(group, dim=1)
    scores = scale * torch.einsum("hd,nhd->hn", query, k)  # [Hq, n]
    m = scores.max(dim=1).values
    p = (scores - m[:, None]).exp()
    l = p.sum(dim=1)
    o = torch.einsum("hn,nhd->hd", p, v) / l[:, None]
    return o, m + l.log()


def merge(outputs, lses, wrong=False):
    """outputs [S, Hq, D], lses [S, Hq] -> merged [Hq, D]."""
    top = lses.max(dim=0).values  # [Hq]
    weights = (lses - top).exp()  # [S, Hq]; empty splits: exp(-inf) = 0
    if wrong:
        weights = torch.where(torch.isinf(lses), 0.0, 1.0).to(lses.dtype)  # plain average of partials
    return (weights[:, :, None] * outputs).sum(0) / weights.sum(0)[:, None]


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    num_q_heads, num_kv_heads, dim, block_size, num_blocks = 16, 2, 32, 16, 64
    seq_lens = [1, 37, 200, 513]
    scale = dim**-0.5
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, dim, generator=gen, dtype=torch.float64)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, dim, generator=gen, dtype=torch.float64)
    free = torch.randperm(num_blocks, generator=gen).tolist()  # scattered blocks
    max_blocks = max(math.ceil(n / block_size) for n in seq_lens)
    block_tables = torch.full((len(seq_lens), max_blocks), -1, dtype=torch.int32)
    for b, n in enumerate(seq_lens):
        for j in range(math.ceil(n / block_size)):
            block_tables[b, j] = free.pop()
    query = torch.randn(len(seq_lens), num_q_heads, dim, generator=gen, dtype=torch.float64)
    num_splits = 8
    for b, n in enumerate(seq_lens):
        positions = torch.arange(n)
        blocks = block_tables[b, positions // block_size].long()
        keys = k_cache[blocks, positions % block_size]  # [n, Hkv, D] gathered through the table
        values = v_cache[blocks, positions % block_size]
        reference, _ = partial_attention(query[b], keys, values, scale)
        split = math.ceil(n / num_splits)
        parts = [partial_attention(query[b], keys[i * split:(i + 1) * split], values[i * split:(i + 1) * split], scale)
                 for i in range(num_splits)]  # ranges past n are empty
        outputs, lses = torch.stack([o for o, _ in parts]), torch.stack([s for _, s in parts])
        error = (merge(outputs, lses) - reference).abs().max().item()
        assert error < 1e-12, error
        if n > split:
            assert (merge(outputs, lses, wrong=True) - reference).abs().max().item() > 1e-3
        print(f"seq_len {n:4d}: merged split-K matches full attention (max error {error:.1e})")
    print("ok")


if __name__ == "__main__":
    main()
