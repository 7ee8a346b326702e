"""A minimal, scheduler-free driver of `model.forward`: hand-assigned KV blocks and state slots, for contracts and tests.

Each sequence gets a fixed run of blocks and its own state slot at creation. `step` feeds new tokens
for any subset of sequences (prefill, a prefill chunk, or one decode token each) and returns the
logits of every new token (or only the last of each sequence). The real engine's runner and
scheduler do the same bookkeeping with a block manager and a slot pool.
"""

from __future__ import annotations

import torch

from reference_engine.cache.tensors import ModelCaches
from reference_engine.forward_batch import ForwardBatch
from reference_engine.model.qwen3_5_moe import Qwen35MoeModel


class SimpleDriver:
    def __init__(self, model: Qwen35MoeModel, max_seqs: int, max_len: int, block_size: int = 4) -> None:
        self.model = model
        self.block_size = block_size
        self.blocks_per_seq = -(-max_len // block_size)
        self.max_seqs = max_seqs
        self.caches = ModelCaches.allocate(
            model.config, max_seqs * self.blocks_per_seq, block_size, max_seqs, device=model.device, dtype=model.dtype
        )
        self.lengths: list[int] = [0] * max_seqs  # tokens already in the cache per sequence
        # Blocks are handed out in reverse order so that a sequence's blocks are not contiguous (catches indexing bugs).
        all_blocks = list(range(max_seqs * self.blocks_per_seq))[::-1]
        self.block_tables = [all_blocks[i * self.blocks_per_seq : (i + 1) * self.blocks_per_seq] for i in range(max_seqs)]
        self.slots = list(range(max_seqs))[::-1]

    def step(self, seq_ids: list[int], new_tokens: list[list[int]], all_logits: bool = True) -> list[torch.Tensor]:
        """Feed `new_tokens[i]` to sequence `seq_ids[i]`; returns per sequence logits [n_i, V] (or [1, V] if not all_logits)."""
        device = self.model.device
        if len(seq_ids) != len(new_tokens) or any(len(tokens) == 0 for tokens in new_tokens):
            raise ValueError("step needs one non-empty token list per sequence id")
        ids, positions, slot_mapping, cu, seq_lens, logits_rows = [], [], [], [0], [], []
        for seq, tokens in zip(seq_ids, new_tokens):
            start = self.lengths[seq]
            if start + len(tokens) > self.blocks_per_seq * self.block_size:
                raise ValueError(f"sequence {seq} would exceed max_len")
            for offset, token in enumerate(tokens):
                position = start + offset
                ids.append(token)
                positions.append(position)
                block = self.block_tables[seq][position // self.block_size]
                slot_mapping.append(block * self.block_size + position % self.block_size)
            rows = range(cu[-1], cu[-1] + len(tokens))
            logits_rows.extend(rows if all_logits else [rows[-1]])
            cu.append(cu[-1] + len(tokens))
            seq_lens.append(start + len(tokens))
        is_decode = all(len(tokens) == 1 and self.lengths[seq] > 0 for seq, tokens in zip(seq_ids, new_tokens))

        def tensor(values, dtype):
            return torch.tensor(values, dtype=dtype, device=device)

        batch = ForwardBatch(
            input_ids=tensor(ids, torch.int64),
            positions=tensor(positions, torch.int64),
            cu_seqlens_q=tensor(cu, torch.int32),
            seq_lens=tensor(seq_lens, torch.int32),
            block_tables=tensor([self.block_tables[seq] for seq in seq_ids], torch.int32),
            slot_mapping=tensor(slot_mapping, torch.int64),
            state_slots=tensor([self.slots[seq] for seq in seq_ids], torch.int64),
            has_initial_state=tensor([self.lengths[seq] > 0 for seq in seq_ids], torch.bool),
            logits_indices=tensor(logits_rows, torch.int64),
            is_decode=is_decode,
        )
        logits = self.model.forward(batch, self.caches)  # [rows, V]
        for seq, tokens in zip(seq_ids, new_tokens):
            self.lengths[seq] += len(tokens)
        out, row = [], 0
        for tokens in new_tokens:
            count = len(tokens) if all_logits else 1
            out.append(logits[row : row + count])
            row += count
        return out
