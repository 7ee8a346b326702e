"""Paged KV-cache block manager: which physical blocks each sequence owns. Integers only, no tensors.

A sequence's KV lives in fixed-size blocks of `block_size` token slots; its block table lists the
blocks in order, so token position p lives in slot `table[p // block_size] * block_size + p % block_size`.

Forked sequences (parallel sampling, prefix sharing) share their blocks through reference counts.
Only the last block of a sequence can still be written, so copy-on-write concerns that block
alone: when a sequence appends into a partially filled block that another sequence also holds,
the manager gives it a private copy and returns the `(src_block, dst_block)` copy the runner must
perform on the device before writing the new tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from reference_engine.ops.registry import satisfies


class BlockAllocationError(RuntimeError):
    """The pool has too few free blocks for the request (the caller should have asked `can_allocate`)."""


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


@satisfies("kv-cache/block-manager", 1)
class BlockManager:
    """Allocates, grows, forks and frees block tables for sequences identified by any hashable id."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._refcounts = [0] * num_blocks
        self._tables: dict[Hashable, list[int]] = {}
        self._num_tokens: dict[Hashable, int] = {}

    # Queries -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new sequence of `num_tokens` tokens fits in the free blocks now."""
        return blocks_needed(num_tokens, self.block_size) <= len(self._free)

    def blocks_to_append(self, seq_id: Hashable, num_new_tokens: int) -> int:
        """Free blocks that `append_slots(seq_id, num_new_tokens)` would take (copy-on-write included)."""
        table, used = self._lookup(seq_id)
        capacity = len(table) * self.block_size
        needed = blocks_needed(max(0, used + num_new_tokens - capacity), self.block_size)
        if num_new_tokens > 0 and used % self.block_size and self._refcounts[table[-1]] > 1:
            needed += 1
        return needed

    def can_append(self, seq_id: Hashable, num_new_tokens: int) -> bool:
        return self.blocks_to_append(seq_id, num_new_tokens) <= len(self._free)

    def has(self, seq_id: Hashable) -> bool:
        return seq_id in self._tables

    def block_table(self, seq_id: Hashable) -> list[int]:
        return list(self._lookup(seq_id)[0])

    def num_tokens(self, seq_id: Hashable) -> int:
        return self._lookup(seq_id)[1]

    def refcount(self, block_id: int) -> int:
        return self._refcounts[block_id]

    def slot_mapping(self, seq_id: Hashable, start: int, end: int) -> list[int]:
        """Slots of token positions `start .. end - 1` (all of them must be allocated)."""
        table, used = self._lookup(seq_id)
        if not 0 <= start <= end <= used:
            raise ValueError(f"positions {start}..{end} are outside the {used} allocated slots of sequence {seq_id!r}")
        size = self.block_size
        return [table[p // size] * size + p % size for p in range(start, end)]

    # Changes -------------------------------------------------------------------------------
    def allocate(self, seq_id: Hashable, num_tokens: int) -> list[int]:
        """Give a new sequence blocks for its first `num_tokens` tokens; returns its block table."""
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already holds blocks")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        count = blocks_needed(num_tokens, self.block_size)
        table = self._take(count, f"allocate {num_tokens} tokens for sequence {seq_id!r}")
        self._tables[seq_id] = table
        self._num_tokens[seq_id] = num_tokens
        return list(table)

    def append_slots(self, seq_id: Hashable, num_new_tokens: int) -> list[tuple[int, int]]:
        """Reserve slots for `num_new_tokens` more tokens; returns the block copies (src, dst) to do first."""
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        table, used = self._lookup(seq_id)
        needed = self.blocks_to_append(seq_id, num_new_tokens)
        if needed > len(self._free):
            raise BlockAllocationError(
                f"sequence {seq_id!r} needs {needed} more blocks for {num_new_tokens} tokens, {len(self._free)} are free"
            )
        copies: list[tuple[int, int]] = []
        if num_new_tokens == 0:
            return copies
        if used % self.block_size and self._refcounts[table[-1]] > 1:  # copy-on-write of the shared partial block
            source = table[-1]
            (destination,) = self._take(1, "copy-on-write")
            self._refcounts[source] -= 1
            table[-1] = destination
            copies.append((source, destination))
        capacity = len(table) * self.block_size
        table.extend(self._take(blocks_needed(max(0, used + num_new_tokens - capacity), self.block_size), "append"))
        self._num_tokens[seq_id] = used + num_new_tokens
        return copies

    def fork(self, parent_id: Hashable, child_id: Hashable) -> list[int]:
        """Make `child_id` share every block of `parent_id` (reference counts go up); returns its table."""
        table, used = self._lookup(parent_id)
        if child_id in self._tables:
            raise ValueError(f"sequence {child_id!r} already holds blocks")
        for block in table:
            self._refcounts[block] += 1
        self._tables[child_id] = list(table)
        self._num_tokens[child_id] = used
        return list(table)

    def free(self, seq_id: Hashable) -> None:
        """Release a sequence; blocks return to the pool when no sequence holds them any more."""
        if seq_id not in self._tables:
            raise KeyError(f"sequence {seq_id!r} holds no blocks (already freed or never allocated)")
        table = self._tables.pop(seq_id)
        del self._num_tokens[seq_id]
        for block in reversed(table):
            count = self._refcounts[block] - 1
            if count < 0:
                raise RuntimeError(f"block {block} freed more often than allocated")
            self._refcounts[block] = count
            if count == 0:
                self._free.append(block)

    # Internals -----------------------------------------------------------------------------
    def _lookup(self, seq_id: Hashable) -> tuple[list[int], int]:
        try:
            return self._tables[seq_id], self._num_tokens[seq_id]
        except KeyError:
            raise KeyError(f"unknown sequence {seq_id!r} (never allocated or already freed)") from None

    def _take(self, count: int, what: str) -> list[int]:
        if count > len(self._free):
            raise BlockAllocationError(f"cannot {what}: needs {count} blocks, {len(self._free)} are free")
        blocks = [self._free.popleft() for _ in range(count)]
        for block in blocks:
            self._refcounts[block] = 1
        return blocks
