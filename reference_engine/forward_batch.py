"""What one model step needs to know about its batch: token ids, positions, and where each sequence's caches live.

The runner builds one `ForwardBatch` per step (prefill chunks and decode steps alike) and passes it
with the `ModelCaches` to `model.forward`. All tensors live on the model's device.

A batch holds B sequences and T new tokens in total, packed back to back (ragged): sequence b owns
rows `cu_seqlens_q[b]:cu_seqlens_q[b + 1]` of every per-token tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64, the new tokens
    positions: torch.Tensor  # [T] int64, absolute position of each new token in its sequence
    cu_seqlens_q: torch.Tensor  # [B + 1] int32, prefix sums of the new-token counts, from 0
    seq_lens: torch.Tensor  # [B] int32, tokens in the KV cache per sequence after this step (cached + new)
    block_tables: torch.Tensor  # [B, max_blocks] int32, KV-cache blocks of each sequence (unused entries -1)
    slot_mapping: torch.Tensor  # [T] int64, block_id * block_size + offset where each new token's K/V goes
    state_slots: torch.Tensor  # [B] int64, row of the Gated DeltaNet state pool that each sequence owns
    has_initial_state: torch.Tensor  # [B] bool, False on a sequence's first chunk (its GDN states start at zero)
    logits_indices: torch.Tensor  # [B] int64 (or any count), rows of T whose logits are returned
    is_decode: bool  # True when every sequence brings exactly one new token that follows cached ones

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    def validate(self) -> None:
        """Cheap shape and dtype checks; raises ValueError naming the field that does not fit."""
        num_tokens, num_seqs = self.num_tokens, self.num_seqs
        expected = {
            "input_ids": ((num_tokens,), torch.int64),
            "positions": ((num_tokens,), torch.int64),
            "cu_seqlens_q": ((num_seqs + 1,), torch.int32),
            "seq_lens": ((num_seqs,), torch.int32),
            "slot_mapping": ((num_tokens,), torch.int64),
            "state_slots": ((num_seqs,), torch.int64),
            "has_initial_state": ((num_seqs,), torch.bool),
        }
        for name, (shape, dtype) in expected.items():
            tensor = getattr(self, name)
            if tuple(tensor.shape) != shape or tensor.dtype != dtype:
                raise ValueError(
                    f"ForwardBatch.{name}: expected shape {list(shape)} dtype {dtype}, got {list(tensor.shape)} {tensor.dtype}"
                )
        if self.block_tables.dim() != 2 or self.block_tables.shape[0] != num_seqs or self.block_tables.dtype != torch.int32:
            raise ValueError(
                f"ForwardBatch.block_tables: expected [{num_seqs}, max_blocks] int32, got "
                f"{list(self.block_tables.shape)} {self.block_tables.dtype}"
            )
        if self.logits_indices.dim() != 1 or self.logits_indices.dtype != torch.int64:
            raise ValueError(
                f"ForwardBatch.logits_indices: expected a 1-D int64 tensor, got {list(self.logits_indices.shape)} "
                f"{self.logits_indices.dtype}"
            )
        if self.is_decode and num_tokens != num_seqs:
            raise ValueError(f"ForwardBatch: a decode batch has one token per sequence, got {num_tokens} tokens for {num_seqs} sequences")
