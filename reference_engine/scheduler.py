"""Continuous batching with chunked prefill, in integers: which tokens of which sequences run this step.

Each step spends at most `max_num_batched_tokens` tokens: first one token for every running
sequence that is decoding, then prompt chunks for sequences still prefilling (oldest first), then
newly admitted requests (first come, first served), whose prompts may be split across steps.

No preemption. A request is admitted only when the blocks for its worst case (prompt +
max_tokens) fit beside the worst cases of the running requests, and a state slot is free, so a
running request can always grow and never has to be evicted; a request that does not fit waits.
A request that could never fit (beyond `max_model_len`, or more blocks than the whole cache) is
refused at `add` with a ValueError.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from reference_engine.cache.block_manager import BlockManager, blocks_needed
from reference_engine.cache.slot_pool import StateSlotPool
from reference_engine.sequence import Sequence, SequenceStatus

PENDING_TOKEN = -1  # a decode chunk's input id not yet on the host (async decoding): the runner feeds it on the device


@dataclass(frozen=True)
class ScheduledChunk:
    """One sequence's share of a step: tokens [start, start + len(token_ids)) and where they go."""

    request_id: str
    token_ids: tuple[int, ...]
    start: int  # position of the first new token
    block_table: tuple[int, ...]
    slot_mapping: tuple[int, ...]
    state_slot: int
    samples: bool  # the chunk reaches the end of the known tokens, so its last logits give the next token

    @property
    def seq_len(self) -> int:
        return self.start + len(self.token_ids)

    @property
    def has_initial_state(self) -> bool:
        return self.start > 0


@dataclass(frozen=True)
class SchedulerOutput:
    chunks: tuple[ScheduledChunk, ...]
    block_copies: tuple[tuple[int, int], ...] = ()  # (src_block, dst_block) copy-on-write copies to do first

    @property
    def num_tokens(self) -> int:
        return sum(len(chunk.token_ids) for chunk in self.chunks)

    @property
    def is_decode(self) -> bool:
        return bool(self.chunks) and all(len(c.token_ids) == 1 and c.start > 0 for c in self.chunks)


class Scheduler:
    def __init__(self, *, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int, num_blocks: int, block_size: int) -> None:
        for name, value in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens), ("max_model_len", max_model_len)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.block_manager = BlockManager(num_blocks, block_size)
        self.slot_pool = StateSlotPool(max_num_seqs)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._reserved: dict[str, int] = {}  # request id -> blocks reserved for its worst case
        self._unfinished: dict[str, Sequence] = {}

    # Requests --------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if seq.request_id in self._unfinished:
            raise ValueError(f"request id {seq.request_id!r} is already in use")
        if not seq.prompt_token_ids:
            raise ValueError(f"request {seq.request_id!r}: the prompt is empty")
        total = seq.max_total_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"request {seq.request_id!r} can never fit: prompt ({len(seq.prompt_token_ids)} tokens) + max_tokens "
                f"({seq.params.max_tokens}) = {total} exceeds max_model_len={self.max_model_len}"
            )
        needed = blocks_needed(total, self.block_manager.block_size)
        if needed > self.block_manager.num_blocks:
            raise ValueError(
                f"request {seq.request_id!r} can never fit: {total} tokens need {needed} KV blocks, the cache has "
                f"{self.block_manager.num_blocks} (block_size={self.block_manager.block_size})"
            )
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self._unfinished[seq.request_id] = seq

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def get(self, request_id: str) -> Sequence | None:
        return self._unfinished.get(request_id)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a request (stop, length or abort) and return its blocks and state slot to the pools."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.free(seq.request_id)
            self.slot_pool.free(seq.request_id)
            del self._reserved[seq.request_id]
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            raise ValueError(f"request {seq.request_id!r} has already finished ({seq.finish_reason})")
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        del self._unfinished[seq.request_id]

    def abort(self, request_id: str) -> Sequence:
        seq = self.get(request_id)
        if seq is None:
            raise KeyError(f"no unfinished request {request_id!r}")
        self.finish(seq, "abort")
        return seq

    # Steps -----------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        copies: list[tuple[int, int]] = []
        decoding = [s for s in self.running if not s.is_prefilling]
        prefilling = [s for s in self.running if s.is_prefilling]
        for seq in decoding + prefilling:
            if budget == 0:
                break
            count = min(seq.num_uncomputed_tokens, budget)
            chunks.append(self._chunk(seq, count, copies))
            budget -= count
        while budget > 0 and self.waiting and self._can_admit(self.waiting[0]):
            seq = self.waiting.popleft()
            self._admit(seq)
            count = min(seq.num_uncomputed_tokens, budget)
            chunks.append(self._chunk(seq, count, copies))
            budget -= count
        return SchedulerOutput(tuple(chunks), tuple(copies))

    def commit(self, output: SchedulerOutput) -> None:
        """Mark the scheduled tokens computed (call after the model ran them)."""
        for chunk in output.chunks:
            seq = self.get(chunk.request_id)
            if seq is not None:
                seq.num_computed_tokens = chunk.seq_len

    def admits_next(self) -> bool:
        """Whether the next `schedule()` would admit a waiting request."""
        return bool(self.waiting) and self._can_admit(self.waiting[0])

    def schedule_decode_ahead(self, plan: SchedulerOutput, rows: list[int] | None = None) -> SchedulerOutput:
        """The decode step after `plan` (committed, its tokens not yet read): one more token for each of its sequences
        at `rows` (default: all), in that order, before the host knows the tokens `plan` samples. Their ids are unknown,
        so the chunks carry PENDING_TOKEN; the runner feeds the real ids on the device. The caller makes sure each of
        these sequences continues (not finished, not at its max_tokens) and that nothing waiting would be admitted."""
        copies: list[tuple[int, int]] = []
        chunks = []
        for chunk in plan.chunks if rows is None else [plan.chunks[row] for row in rows]:
            seq = self._unfinished.get(chunk.request_id)
            if seq is None or seq.status is not SequenceStatus.RUNNING or seq.num_computed_tokens != chunk.seq_len:
                raise ValueError(f"request {chunk.request_id!r} cannot be scheduled ahead: it finished, or the plan is not committed")
            start = seq.num_computed_tokens  # the position of the token `plan` samples
            if start + 2 > seq.max_total_tokens:  # this step samples the token at start + 1
                raise ValueError(f"request {chunk.request_id!r} reaches its max_tokens with the token `plan` samples")
            allocated = self.block_manager.num_tokens(seq.request_id)
            if start + 1 > allocated:
                copies.extend(self.block_manager.append_slots(seq.request_id, start + 1 - allocated))
            chunks.append(ScheduledChunk(
                request_id=seq.request_id, token_ids=(PENDING_TOKEN,), start=start,
                block_table=tuple(self.block_manager.block_table(seq.request_id)),
                slot_mapping=tuple(self.block_manager.slot_mapping(seq.request_id, start, start + 1)),
                state_slot=self.slot_pool.slot(seq.request_id), samples=True,
            ))  # fmt: skip
        return SchedulerOutput(tuple(chunks), tuple(copies))

    # Internals -------------------------------------------------------------------------------
    def _can_admit(self, seq: Sequence) -> bool:
        if len(self.running) >= self.max_num_seqs or not self.slot_pool.can_allocate():
            return False
        needed = blocks_needed(seq.max_total_tokens, self.block_manager.block_size)
        return sum(self._reserved.values()) + needed <= self.block_manager.num_blocks

    def _admit(self, seq: Sequence) -> None:
        self.block_manager.allocate(seq.request_id, 0)
        self.slot_pool.allocate(seq.request_id)
        self._reserved[seq.request_id] = blocks_needed(seq.max_total_tokens, self.block_manager.block_size)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def _chunk(self, seq: Sequence, count: int, copies: list[tuple[int, int]]) -> ScheduledChunk:
        start = seq.num_computed_tokens
        allocated = self.block_manager.num_tokens(seq.request_id)
        if start + count > allocated:
            copies.extend(self.block_manager.append_slots(seq.request_id, start + count - allocated))
        return ScheduledChunk(
            request_id=seq.request_id,
            token_ids=tuple(seq.token_ids(start, start + count)),
            start=start,
            block_table=tuple(self.block_manager.block_table(seq.request_id)),
            slot_mapping=tuple(self.block_manager.slot_mapping(seq.request_id, start, start + count)),
            state_slot=self.slot_pool.slot(seq.request_id),
            samples=start + count == seq.num_tokens,
        )
