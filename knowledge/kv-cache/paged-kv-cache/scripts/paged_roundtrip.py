"""Paged KV cache round trip in plain torch (CPU, about a second).

Builds a paged cache [num_blocks, block_size, num_kv_heads, head_dim], hands each sequence a
random (non-contiguous) set of blocks, writes keys through slot_mapping in two steps (a prefill
chunk, then one decode token per sequence, with padding slots of -1), and reads every sequence
back through its block table. The gathered keys must equal the keys written, in order, for
every sequence; a swapped (block, offset) decomposition must fail. Prints the bytes per token
and per block of Qwen3.6-35B-A3B. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import sys

import torch

ATTENTION_LAYERS, NUM_KV_HEADS, HEAD_DIM = 10, 2, 256


def write(key: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """cache[slot // block_size, slot % block_size] = key[t] for slots >= 0."""
    flat = cache.view(-1, *cache.shape[2:])  # [num_blocks * block_size, H, D]
    valid = slot_mapping >= 0
    flat[slot_mapping[valid]] = key[valid]


def read(cache: torch.Tensor, block_table: list[int], length: int) -> torch.Tensor:
    """The first `length` cached tokens of one sequence, in position order."""
    block_size = cache.shape[1]
    blocks = cache[torch.tensor(block_table[: -(-length // block_size)])]  # [n, block_size, H, D]
    return blocks.reshape(-1, *cache.shape[2:])[:length]


def slots(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]


def main() -> int:
    generator = torch.Generator().manual_seed(0)
    num_blocks, block_size, heads, dim = 64, 16, NUM_KV_HEADS, 32
    cache = torch.full((num_blocks, block_size, heads, dim), float("nan"))
    lengths = [37, 16, 5, 70]
    order = torch.randperm(num_blocks, generator=generator).tolist()
    tables, written = [], []
    for length in lengths:
        count = -(-(length + 1) // block_size)  # room for one decode token
        tables.append([order.pop() for _ in range(count)])
    # Step 1: prefill all prompts in one ragged batch, plus 3 padding rows.
    keys = [torch.randn(length, heads, dim, generator=generator) for length in lengths]
    mapping = [s for t, n in zip(tables, lengths) for s in slots(t, 0, n, block_size)] + [-1, -1, -1]
    batch = torch.cat(keys + [torch.randn(3, heads, dim, generator=generator)])
    write(batch, cache, torch.tensor(mapping, dtype=torch.int64))
    written = [k.clone() for k in keys]
    # Step 2: one decode token per sequence at position len.
    new = torch.randn(len(lengths), heads, dim, generator=generator)
    mapping = [slots(t, n, n + 1, block_size)[0] for t, n in zip(tables, lengths)]
    write(new, cache, torch.tensor(mapping, dtype=torch.int64))
    written = [torch.cat([w, new[i : i + 1]]) for i, w in enumerate(written)]
    for seq, table in enumerate(tables):
        got = read(cache, table, lengths[seq] + 1)
        if not torch.equal(got, written[seq]):
            print(f"FAIL: sequence {seq} does not read back its keys")
            return 1
    swapped = [table[p % len(table)] * block_size + p // len(table) for table in tables[:1] for p in range(lengths[0])]
    if swapped == slots(tables[0], 0, lengths[0], block_size):
        print("FAIL: the wrong slot formula was not distinguished")
        return 1
    print(f"{len(lengths)} sequences written through slot_mapping and read back through block tables: ok")
    per_token_layer = 2 * NUM_KV_HEADS * HEAD_DIM * 2  # K and V, bf16
    print(f"bf16 KV per token: {per_token_layer} B per layer, {ATTENTION_LAYERS * per_token_layer} B over {ATTENTION_LAYERS} layers")
    print(f"bf16 KV per block of 16: {16 * per_token_layer} B per layer, {16 * ATTENTION_LAYERS * per_token_layer} B over all layers")
    print(f"fp8 KV per token: {ATTENTION_LAYERS * per_token_layer // 2} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
