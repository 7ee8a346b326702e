"""Executable half of attention/paged-prefill: float64 reference reading the cache token by token."""

from __future__ import annotations

import torch


def random_lengths(total, count, generator):
    cuts = torch.randperm(total - 1, generator=generator)[: count - 1] + 1
    bounds = [0] + sorted(int(c) for c in cuts) + [total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


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
    tokens, seqs = axes["T"], axes["B"]
    block_size, max_blocks = axes["BS"], axes["MB"]
    q_lens = random_lengths(tokens, seqs, generator)
    capacity = block_size * max_blocks
    seq_lens = []
    for index, q_len in enumerate(q_lens):
        if q_len > capacity:
            raise AssertionError(f"case axes too small: {q_len} queries exceed MB * BS = {capacity}")
        prefix = 0 if index == 0 else int(torch.randint(0, capacity - q_len + 1, (1,), generator=generator))
        seq_lens.append(q_len + prefix)  # sequence 0 is a fresh prompt (no cached prefix)
    table = paged_layout(seq_lens, axes["NB"], block_size, max_blocks, generator)

    def rand(*shape, spread=1.0):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * spread).to(dtype).to(device)

    cache_shape = (axes["NB"], block_size, axes["HKV"], axes["D"])
    return {
        "query": rand(tokens, axes["HQ"], axes["D"], spread=3.0),
        "k_cache": rand(*cache_shape),
        "v_cache": rand(*cache_shape),
        "block_tables": table.to(device),
        "cu_seqlens_q": torch.tensor([0] + q_lens, dtype=torch.int64).cumsum(0).to(torch.int32).to(device),
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32).to(device),
    }


def reference(query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale):
    q, k_cache, v_cache = query.double(), k_cache.double(), v_cache.double()
    tokens, query_heads, head_dim = q.shape
    block_size = k_cache.shape[1]
    group = query_heads // k_cache.shape[2]
    out = torch.empty(tokens, query_heads, head_dim, dtype=torch.float64)
    bounds = [int(b) for b in cu_seqlens_q]
    for seq, (start, end) in enumerate(zip(bounds, bounds[1:])):
        length = int(seq_lens[seq])
        slots = [(int(block_tables[seq, t // block_size]), t % block_size) for t in range(length)]
        keys = torch.stack([k_cache[block, offset] for block, offset in slots])  # [length, HKV, D]
        values = torch.stack([v_cache[block, offset] for block, offset in slots])
        q_len = end - start
        for i in range(q_len):
            position = length - q_len + i
            for head in range(query_heads):
                scores = keys[: position + 1, head // group, :] @ q[start + i, head, :] * scale
                weights = torch.exp(scores - scores.max())
                out[start + i, head, :] = (weights / weights.sum()) @ values[: position + 1, head // group, :]
    return {"out": out}


def truncate_block_tables(inputs, params):
    block_size = inputs["k_cache"].shape[1]
    needed = -(-int(inputs["seq_lens"].max()) // block_size)
    inputs["block_tables"] = inputs["block_tables"][:, : needed - 1].clone()
    return inputs, params


def block_id_out_of_range(inputs, params):
    table = inputs["block_tables"].clone()
    table[0, 0] = inputs["k_cache"].shape[0]
    inputs["block_tables"] = table
    return inputs, params


def seq_len_below_queries(inputs, params):
    q_lens = (inputs["cu_seqlens_q"][1:] - inputs["cu_seqlens_q"][:-1]).tolist()
    row = max(range(len(q_lens)), key=lambda i: q_lens[i])  # T > B, so this sequence has >= 2 queries
    seq_lens = inputs["seq_lens"].clone()
    seq_lens[row] = q_lens[row] - 1
    inputs["seq_lens"] = seq_lens
    return inputs, params


def cu_seqlens_wrong_total(inputs, params):
    bounds = inputs["cu_seqlens_q"].clone()
    bounds[-1] += 1
    inputs["cu_seqlens_q"] = bounds
    return inputs, params


def v_cache_other_dtype(inputs, params):
    inputs["v_cache"] = inputs["v_cache"].to(torch.float16)
    return inputs, params
