"""Executable half of attention/paged-decode: float64 reference reading the cache token by token."""

from __future__ import annotations

import torch


def paged_layout(seq_lens, num_blocks, block_size, max_blocks, generator):
    """A block table giving each sequence distinct, scattered blocks; -1 past the used ones."""
    needed = [-(-n // block_size) for n in seq_lens]
    if sum(needed) > num_blocks or max(needed) > max_blocks:
        raise AssertionError(f"case axes too small: sequences need {needed} blocks, NB={num_blocks}, MB={max_blocks}")
    order = torch.randperm(num_blocks, generator=generator).tolist()
    table = torch.full((len(seq_lens), max_blocks), -1, dtype=torch.int32)
    for row, count in enumerate(needed):
        table[row, :count] = torch.tensor(order[:count], dtype=torch.int32)
        order = order[count:]
    return table


def make_inputs(axes, params, dtype, device, generator):
    seqs, block_size, max_blocks = axes["B"], axes["BS"], axes["MB"]
    capacity = block_size * max_blocks
    seq_lens = torch.randint(1, capacity + 1, (seqs,), generator=generator).tolist()
    if seqs >= 2:
        seq_lens[1] = 1  # a sequence whose only token is the new one
    if seqs >= 3:
        seq_lens[2] = capacity  # one that fills its table
    table = paged_layout(seq_lens, axes["NB"], block_size, max_blocks, generator)

    def rand(*shape, spread=1.0):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * spread).to(dtype).to(device)

    cache_shape = (axes["NB"], block_size, axes["HKV"], axes["D"])
    return {
        "query": rand(seqs, axes["HQ"], axes["D"], spread=3.0),
        "k_cache": rand(*cache_shape),
        "v_cache": rand(*cache_shape),
        "block_tables": table.to(device),
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32).to(device),
    }


def reference(query, k_cache, v_cache, block_tables, seq_lens, scale):
    q, k_cache, v_cache = query.double(), k_cache.double(), v_cache.double()
    seqs, query_heads, head_dim = q.shape
    block_size = k_cache.shape[1]
    group = query_heads // k_cache.shape[2]
    out = torch.empty(seqs, query_heads, head_dim, dtype=torch.float64)
    for seq in range(seqs):
        length = int(seq_lens[seq])
        blocks = [int(block_tables[seq, t // block_size]) for t in range(length)]
        keys = torch.stack([k_cache[blocks[t], t % block_size] for t in range(length)])  # [length, HKV, D]
        values = torch.stack([v_cache[blocks[t], t % block_size] for t in range(length)])
        for head in range(query_heads):
            scores = keys[:, head // group, :] @ q[seq, head, :] * scale
            weights = torch.exp(scores - scores.max())
            out[seq, head, :] = (weights / weights.sum()) @ values[:, head // group, :]
    return {"out": out}


def truncate_block_tables(inputs, params):
    block_size = inputs["k_cache"].shape[1]
    needed = -(-int(inputs["seq_lens"].max()) // block_size)
    inputs["block_tables"] = inputs["block_tables"][:, : needed - 1].clone()
    return inputs, params


def zero_seq_len(inputs, params):
    seq_lens = inputs["seq_lens"].clone()
    seq_lens[0] = 0
    inputs["seq_lens"] = seq_lens
    return inputs, params


def seq_lens_short(inputs, params):
    inputs["seq_lens"] = inputs["seq_lens"][:-1].clone()
    return inputs, params


def negative_block(inputs, params):
    table = inputs["block_tables"].clone()
    table[0, 0] = -1
    inputs["block_tables"] = table
    return inputs, params


def k_cache_other_dtype(inputs, params):
    inputs["k_cache"] = inputs["k_cache"].to(torch.float16)
    return inputs, params
