"""Prefill of one fresh prompt replayed from a CUDA graph captured per bucket of prompt lengths.

A prefill of T tokens launches thousands of kernels; on an H200 the host issues them more slowly than the GPU
runs them (a 1024-token eager prefill: 77.6 ms of kernels in 101 to 105 ms, benchmarks/NOTES.md). A graph
removes the host from the step. Shapes must be fixed, so a prompt of T tokens runs at the bucket Tb = T
rounded up to `BUCKET_TOKENS`: the Tb - T padding tokens sit after the prompt and are made harmless:
- attention is causal, so no prompt token sees a padding token; padding tokens write their K/V into the
  runner's scratch block (slots no sequence owns), and the block table's entries past the prompt's blocks
  name the scratch block;
- Gated DeltaNet: padding tokens get beta = 0 and g = 0 (the state is multiplied by exp(0) = 1 and gains
  nothing), and the conv state is re-read from the last K-1 prompt inputs (`ForwardBatch.valid_tokens`);
- per-token layers (norms, linears, experts) compute padding rows that nothing reads; the logits are those
  of row T - 1 (a device index).
The host-side metadata every op reads (cu_seqlens [0, Tb], seq_lens [Tb]) is the same for every prompt of
the bucket; what differs (tokens, slots, blocks, the state slot, T) lives in device buffers filled before
each replay. Only single-sequence prefills of a new prompt (no cached prefix, no copy-on-write) qualify;
anything else stays eager. A bucket's graph is captured at its first use: that prefill runs eagerly (it is
the real step), then the capture records the same forward. Modes as in `cuda_graphs.StaticDecoder`:
"graphs" replays, "static" runs the padded forward eagerly (CPU tests).
"""

from __future__ import annotations

import traceback
import warnings
from dataclasses import dataclass

import torch

from reference_engine.cache.tensors import ModelCaches
from reference_engine.cuda_graphs import CaptureFailed, ScratchSpace, run_then_capture
from reference_engine.forward_batch import ForwardBatch
from reference_engine.ops.host_values import one_forward
from reference_engine.scheduler import SchedulerOutput

BUCKET_TOKENS = 128  # prompt lengths are rounded up to a multiple of this


@dataclass(frozen=True)
class PaddedPrefillBatch(ForwardBatch):
    valid_tokens: torch.Tensor | None = None  # [1] int64: the prompt's length T (rows T.. are padding)


def prefill_bucket(num_tokens: int, bucket_tokens: int = BUCKET_TOKENS) -> int:
    if num_tokens < 1:
        raise ValueError(f"a prefill needs at least one token, got {num_tokens}")
    return -(-num_tokens // bucket_tokens) * bucket_tokens


class PrefillGraphs:
    """Static buffers for one padded prefill of up to `max_tokens` tokens, and a graph per bucket."""

    def __init__(self, model, caches: ModelCaches, max_tokens: int, max_blocks_per_seq: int, scratch: ScratchSpace, use_graphs: bool,
                 bucket_tokens: int = BUCKET_TOKENS) -> None:  # fmt: skip
        device = torch.device(model.device)
        if use_graphs and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the model is on {device}")
        if bucket_tokens < 1:
            raise ValueError(f"bucket_tokens must be positive, got {bucket_tokens}")
        self.model, self.caches, self.scratch, self.use_graphs = model, caches, scratch, use_graphs
        self.device, self.bucket_tokens, self.max_blocks_per_seq = device, bucket_tokens, max_blocks_per_seq
        self.max_tokens = min(max_tokens, max_blocks_per_seq * scratch.block_size) // bucket_tokens * bucket_tokens  # whole buckets only
        rows = max(self.max_tokens, 1)
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=device)  # [Tmax]
        self.positions = torch.arange(rows, dtype=torch.int64, device=device)  # [Tmax], a fresh prompt starts at 0
        self.slot_mapping = torch.zeros(rows, dtype=torch.int64, device=device)  # [Tmax]
        self.block_tables = torch.full((1, max_blocks_per_seq), scratch.block, dtype=torch.int32, device=device)  # [1, MB]
        self.state_slots = torch.full((1,), scratch.slot, dtype=torch.int64, device=device)  # [1]
        self.has_initial_state = torch.zeros(1, dtype=torch.bool, device=device)  # [1]: a fresh prompt
        self.logits_indices = torch.zeros(1, dtype=torch.int64, device=device)  # [1]: row T - 1
        self.valid_tokens = torch.ones(1, dtype=torch.int64, device=device)  # [1]: T
        self.staging = torch.zeros(rows * 2 + max_blocks_per_seq + 3, dtype=torch.int64, device=device)
        self._host = torch.zeros(self.staging.shape[0], dtype=torch.int64, pin_memory=device.type == "cuda")
        self._batches: dict[int, PaddedPrefillBatch] = {}  # one per bucket: the same tensors at every call (ops/host_values.py
        # reads each one's host copy once per forward, keyed by the tensor: a fresh view would be read again, mid-capture)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._pool = None
        self.capture_error: str | None = None

    def accepts(self, plan: SchedulerOutput) -> bool:
        if plan.is_decode or plan.block_copies or len(plan.chunks) != 1:
            return False
        chunk = plan.chunks[0]
        return (
            chunk.samples
            and chunk.start == 0
            and 1 <= len(chunk.token_ids) <= self.max_tokens
            and len(chunk.block_table) <= self.max_blocks_per_seq
        )

    def batch(self, bucket: int) -> PaddedPrefillBatch:
        if bucket not in self._batches:
            self._batches[bucket] = self._make_batch(bucket)
        return self._batches[bucket]

    def _make_batch(self, bucket: int) -> PaddedPrefillBatch:
        cu_seqlens = torch.tensor([0, bucket], dtype=torch.int32, device=self.device)  # [2]: the bucket's layout
        seq_lens = torch.tensor([bucket], dtype=torch.int32, device=self.device)  # [1]
        return PaddedPrefillBatch(
            input_ids=self.input_ids[:bucket], positions=self.positions[:bucket], cu_seqlens_q=cu_seqlens, seq_lens=seq_lens,
            block_tables=self.block_tables, slot_mapping=self.slot_mapping[:bucket], state_slots=self.state_slots,
            has_initial_state=self.has_initial_state, logits_indices=self.logits_indices, is_decode=False, valid_tokens=self.valid_tokens,
        )  # fmt: skip

    def fill(self, plan: SchedulerOutput) -> int:
        """Stage the prompt (padded to its bucket) with one host-to-device copy; returns the bucket."""
        chunk = plan.chunks[0]
        tokens = len(chunk.token_ids)
        bucket = prefill_bucket(tokens, self.bucket_tokens)
        padding = bucket - tokens
        scratch_slot = self.scratch.block * self.scratch.block_size
        blocks = list(chunk.block_table) + [self.scratch.block] * (self.max_blocks_per_seq - len(chunk.block_table))
        values = [*chunk.token_ids, *([0] * padding), *chunk.slot_mapping, *([scratch_slot] * padding), *blocks, chunk.state_slot, tokens - 1, tokens]
        count = len(values)
        self._host[:count] = torch.tensor(values, dtype=torch.int64)
        self.staging[:count].copy_(self._host[:count], non_blocking=self._host.is_pinned())
        return bucket

    def _unpack(self, bucket: int) -> None:
        """staging -> the static buffers (inside the graph when captured)."""
        width = self.max_blocks_per_seq
        self.input_ids[:bucket].copy_(self.staging[:bucket])
        self.slot_mapping[:bucket].copy_(self.staging[bucket : 2 * bucket])
        self.block_tables[0].copy_(self.staging[2 * bucket : 2 * bucket + width])
        tail = self.staging[2 * bucket + width : 2 * bucket + width + 3]
        self.state_slots.copy_(tail[0:1])
        self.logits_indices.copy_(tail[1:2])
        self.valid_tokens.copy_(tail[2:3])

    def _forward(self, bucket: int) -> torch.Tensor:
        self._unpack(bucket)
        return self.model.forward(self.batch(bucket), self.caches)  # [1, V] float32

    @torch.inference_mode()
    def run(self, plan: SchedulerOutput) -> torch.Tensor:
        """The prefill's logits [1, V] float32 (a view of this bucket's output when replayed)."""
        bucket = self.fill(plan)
        with one_forward():  # host reads of the bucket's metadata: once, then served to every layer
            if not self.use_graphs:
                return self._forward(bucket)
            if bucket in self._graphs:
                self._graphs[bucket].replay()
                return self._outputs[bucket]
            return self._run_and_capture(bucket)

    def _run_and_capture(self, bucket: int) -> torch.Tensor:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        try:
            logits, graph, self._outputs[bucket] = run_then_capture(lambda: self._forward(bucket), self.device, self._pool)
        except CaptureFailed as failure:
            error = failure.error
            where = [f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}" for frame in traceback.extract_tb(error.__traceback__) if "reference_engine" in frame.filename]
            self.capture_error = f"{type(error).__name__}: {error}"[:300] + (f" (at {' <- '.join(reversed(where[-4:]))})" if where else "")
            self.use_graphs = False
            warnings.warn(f"prefill graph capture failed, prefills run eagerly: {self.capture_error}", RuntimeWarning, stacklevel=3)
            return failure.result
        self._graphs[bucket] = graph
        return logits

    @property
    def captured_buckets(self) -> tuple[int, ...]:
        return tuple(sorted(self._graphs))
